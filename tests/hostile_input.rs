//! Hostile bytes in a message against a running engine (the broker at KAFKA_BROKERS, a
//! fresh database per test): whatever a producer writes, the partition flows, and what
//! cannot be applied is kept as a dead letter with its exact bytes.

#[path = "common/kafka.rs"]
mod kafka;

use std::sync::Arc;

use bank_accounts::{AccountEvent, BankAccounts};
use kafka::{config, produce_to, rand_test_topic, run};
use projectionist::kafka::Engine;
use projectionist::postgres::migrate;
use sqlx::PgPool;

/// `data` that is JSON by its grammar but no JSON value a reader can hold — a number out of
/// range (`1e400`), a lone surrogate (what `JSON.stringify` writes for a string cut inside
/// an emoji), nesting past serde_json's 128 levels — is poison under the default policy: a
/// dead letter with the message's bytes, the aggregate's next event parked behind it, and
/// every other event of the partition applied. (It used to panic the decoder: nothing of the
/// batch applied, and every later run halted at the same offset.)
#[sqlx::test(migrations = false)]
async fn data_no_reader_can_hold_is_a_dead_letter_and_the_partition_flows(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let e = bank_accounts::generate::envelope;
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let hostile = [("acc-n", "1e400".to_owned()), ("acc-s", r#""\ud83d""#.to_owned()), ("acc-deep", deep)];
    let mut messages = Vec::new();
    let mut message = |key: &str, bytes: Vec<u8>| messages.push((Some(0), Some(key.to_owned()), Some(bytes)));
    for (id, value) in &hostile {
        message(id, e(id, 1, &AccountEvent::AccountOpened { owner: "o".into() }).to_json());
        let good = String::from_utf8(e(id, 2, &AccountEvent::MoneyDeposited { amount: 5 }).to_json()).unwrap();
        let bad = good.replace(r#"{"amount":5}"#, &format!(r#"{{"amount":{value}}}"#));
        assert_ne!(bad, good);
        message(id, bad.into_bytes());
        message(id, e(id, 3, &AccountEvent::MoneyDeposited { amount: 7 }).to_json());
    }
    for i in 0..20 {
        let id = format!("acc-{i}");
        message(&id, e(&id, 1, &AccountEvent::AccountOpened { owner: "h".into() }).to_json());
        message(&id, e(&id, 2, &AccountEvent::MoneyDeposited { amount: 10 }).to_json());
    }
    let messages: Vec<_> = messages.iter().map(|(p, k, b)| (*p, k.as_deref(), b.clone())).collect();
    let topic = rand_test_topic("hostile");
    produce_to(&topic, 1, &messages).await;

    let report = run(Engine::new(pool.clone(), config()).register(Arc::new(BankAccounts), [topic.clone()])).await;
    assert!(report.halts().is_empty(), "hostile data halts nothing: {:?}", report.halts());
    let healthy: (i64, i64) =
        sqlx::query_as("SELECT count(*), sum(balance)::bigint FROM bank_accounts WHERE account_id ~ '^acc-[0-9]+$'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(healthy, (20, 200), "every healthy aggregate applied");
    let letters = projectionist::postgres::park::dead_letters(&pool, Some("bank_accounts"), false).await.unwrap();
    assert_eq!(letters.len(), hostile.len(), "{letters:#?}");
    for d in &letters {
        let offset = usize::try_from(d.offset.expect("an offset")).unwrap();
        assert_eq!(Some(&d.payload), messages[offset].2.as_ref(), "dead letter {}: the exact bytes", d.id);
        assert!(hostile.iter().any(|(id, _)| messages[offset].1 == Some(*id)), "{d:?}");
    }
    for (id, _) in &hostile {
        let (balance, version): (i64, i64) =
            sqlx::query_as("SELECT balance, version FROM bank_accounts WHERE account_id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!((balance, version), (0, 1), "{id}: its deposit after the dead letter is held, not applied");
    }
    let parked = projectionist::postgres::park::list(&pool, None).await.unwrap();
    let mut waiting: Vec<(String, i64)> = parked.iter().map(|p| (p.aggregate_id.clone(), p.waiting_for)).collect();
    waiting.sort();
    assert_eq!(waiting, [("acc-deep".into(), 2), ("acc-n".into(), 2), ("acc-s".into(), 2)]);
    let next: i64 = sqlx::query_scalar("SELECT next_offset FROM projectionist_checkpoints WHERE topic = $1")
        .bind(&topic)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(next, messages.len() as i64, "the checkpoint at the head");
}

/// A header name that is not UTF-8 (legal on the wire: librdkafka and Go producers write
/// one) neither stops the partition nor loses the name: the envelope applies as any other,
/// and a dead letter keeps the name's bytes. (rdkafka's header reader panicked on it inside
/// the partition's task, and nothing noticed: no halt, the run exiting 0 with the rest unread.)
#[sqlx::test(migrations = false)]
async fn a_header_name_that_is_not_utf8_is_kept_as_bytes_and_the_partition_flows(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let e = bank_accounts::generate::envelope;
    let topic = rand_test_topic("header-name");
    let opened = e("acc-h", 1, &AccountEvent::AccountOpened { owner: "h".into() }).to_json();
    produce_to(&topic, 1, &[(Some(0), Some("acc-h"), Some(opened))]).await;
    let name: &[u8] = &[0xff, 0xfe, b'n'];
    let deposit = e("acc-h", 2, &AccountEvent::MoneyDeposited { amount: 5 }).to_json();
    kafka::raw_produce(&topic, 0, b"acc-h", &deposit, &[(name, b"v"), (b"trace", b"t")]);
    let mut poison = e("acc-h", 3, &AccountEvent::MoneyDeposited { amount: 5 });
    poison.data = serde_json::json!({ "amount": "a lot" });
    kafka::raw_produce(&topic, 0, b"acc-h", &poison.to_json(), &[(name, &[0, 1])]);
    let after = e("acc-after", 1, &AccountEvent::AccountOpened { owner: "a".into() }).to_json();
    produce_to(&topic, 1, &[(Some(0), Some("acc-after"), Some(after))]).await;

    let report = run(Engine::new(pool.clone(), config()).register(Arc::new(BankAccounts), [topic.clone()])).await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    let rows: Vec<(String, i64, i64)> =
        sqlx::query_as("SELECT account_id, balance, version FROM bank_accounts ORDER BY account_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows, [("acc-after".into(), 0, 1), ("acc-h".into(), 5, 2)]);
    let letters = projectionist::postgres::park::dead_letters(&pool, Some("bank_accounts"), false).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:#?}");
    assert_eq!(
        (letters[0].header_names.clone(), letters[0].header_values.clone()),
        (vec![name.to_vec()], vec![Some(vec![0, 1])])
    );
    let next: i64 = sqlx::query_scalar("SELECT next_offset FROM projectionist_checkpoints WHERE topic = $1")
        .bind(&topic)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(next, 4, "the checkpoint at the head");
}

/// Accounts and their balances, with a bug: a deposit of 666 panics the projection.
struct Buggy;

const BUGGY: projectionist::Table = projectionist::Table::transition("buggy_accounts", "account_id")
    .aggregate_type("account")
    .columns(&[("balance", "bigint NOT NULL DEFAULT 0")]);

impl projectionist::Projection<projectionist::postgres::PgConnection> for Buggy {
    type Event = AccountEvent;

    fn name(&self) -> &str {
        "buggy"
    }

    fn tables(&self) -> &[projectionist::Table] {
        &[BUGGY]
    }

    fn project(&self, event: &projectionist::Envelope<AccountEvent>) -> projectionist::Writes {
        match &event.event {
            AccountEvent::MoneyDeposited { amount: 666 } => panic!("a bug in the projection"),
            AccountEvent::MoneyDeposited { amount } => BUGGY.write(event).add("balance", amount).into(),
            _ => BUGGY.write(event).into(),
        }
    }
}

/// A projection that panics on one event, in the middle of a batch: the partition applies
/// what precedes it and halts naming that event's own offset and aggregate (it named the
/// batch's first offset and "aggregate ?", and the runbook's skip then passed over a good
/// event that was never applied). The skip the runbook gives (the checkpoint set to the
/// halted offset + 1) then moves past exactly that event.
#[sqlx::test(migrations = false)]
async fn a_panic_on_one_event_halts_at_that_event_after_applying_what_precedes_it(pool: PgPool) {
    migrate(&pool, &[&Buggy]).await.unwrap();
    let e = bank_accounts::generate::envelope;
    let mut messages = Vec::new();
    for (id, amount) in [("acc-1", 5), ("acc-2", 666), ("acc-3", 7)] {
        messages.push((id, e(id, 1, &AccountEvent::AccountOpened { owner: "o".into() }).to_json()));
        messages.push((id, e(id, 2, &AccountEvent::MoneyDeposited { amount }).to_json()));
    }
    let messages: Vec<_> = messages.iter().map(|(k, b)| (Some(0), Some(*k), Some(b.clone()))).collect();
    let topic = rand_test_topic("panic");
    produce_to(&topic, 1, &messages).await;
    let rows = || async {
        let rows: Vec<(String, i64, i64)> =
            sqlx::query_as("SELECT account_id, balance, version FROM buggy_accounts ORDER BY account_id")
                .fetch_all(&pool)
                .await
                .unwrap();
        rows
    };

    let report = run(Engine::new(pool.clone(), config()).register(Arc::new(Buggy), [topic.clone()])).await;
    let halts = report.halts();
    assert_eq!(halts.len(), 1, "{halts:?}");
    assert!(halts[0].contains(&format!("{topic}/0@3 in projection buggy, aggregate acc-2:")), "{halts:?}");
    assert!(halts[0].contains("a bug in the projection"), "{halts:?}");
    let (one, two) = (("acc-1".to_owned(), 5, 2), ("acc-2".to_owned(), 0, 1));
    assert_eq!(rows().await, [one.clone(), two.clone()], "what precedes the event at fault is applied");

    // The runbook's skip: the checkpoint past the halted offset.
    let skipped = sqlx::query("UPDATE projectionist_checkpoints SET next_offset = 3 + 1 WHERE topic = $1")
        .bind(&topic)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(skipped.rows_affected(), 1);
    let report = run(Engine::new(pool.clone(), config()).register(Arc::new(Buggy), [topic.clone()])).await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    assert_eq!(rows().await, [one, two, ("acc-3".into(), 7, 2)], "only the event at fault was skipped");
}
