//! The bounds on dead letters against a running engine (the broker at KAFKA_BROKERS, a
//! fresh database per test): a payload past `dead_letter_payload_max_bytes` is stored as its
//! head with its length and hash, and past `max_dead_letters` or `max_dead_letter_bytes`
//! the partition halts at the message, losing nothing.

#[path = "common/kafka.rs"]
mod kafka;

use std::sync::Arc;

use bank_accounts::{AccountEvent, BankAccounts};
use kafka::{config, produce_to, rand_test_topic, run};
use projectionist::kafka::Engine;
use projectionist::postgres::migrate;
use projectionist::postgres::park::{self, Resolve};
use sqlx::PgPool;

/// A poison message past `dead_letter_payload_max_bytes` keeps its first bytes, its full
/// length and its SHA-256, not its whole payload; a smaller one is kept whole. The open
/// letters' bytes count what is stored, and a retry of the head is refused.
#[sqlx::test(migrations = false)]
async fn a_payload_past_the_bound_is_stored_as_its_head_length_and_hash(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let e = bank_accounts::generate::envelope;
    let mut big = e("acc-big", 1, &AccountEvent::AccountOpened { owner: "b".into() });
    big.data = serde_json::json!({ "owner": 7, "padding": "x".repeat(5000) });
    let (big, small) = (big.to_json(), b"not an envelope".to_vec());
    let opened = e("acc-ok", 1, &AccountEvent::AccountOpened { owner: "o".into() }).to_json();
    let topic = rand_test_topic("dead-letter-head");
    let messages = [(Some(0), Some("acc-big"), Some(big.clone())), (Some(0), Some("x"), Some(small.clone()))];
    produce_to(&topic, 1, &messages).await;
    produce_to(&topic, 1, &[(Some(0), Some("acc-ok"), Some(opened))]).await;

    let mut config = config();
    config.dead_letter_payload_max_bytes = Some(1000);
    let report = run(Engine::new(pool.clone(), config).register(Arc::new(BankAccounts), [topic.clone()])).await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    let letters = park::dead_letters(&pool, Some("bank_accounts"), false).await.unwrap();
    assert_eq!(letters.len(), 2, "{letters:#?}");
    let (head, whole) = (&letters[0], &letters[1]);
    assert_eq!(head.payload, big[..1000], "the head");
    let sha256: Vec<u8> = sqlx::query_scalar("SELECT sha256($1)").bind(&big).fetch_one(&pool).await.unwrap();
    assert_eq!((head.payload_bytes, head.payload_sha256.clone()), (Some(big.len() as i64), Some(sha256)));
    assert_eq!((&whole.payload, whole.payload_bytes, &whole.payload_sha256), (&small, None, &None));
    let (_, _, open, bytes) = park::count(&pool, "bank_accounts").await.unwrap();
    assert_eq!((open, bytes), (2, 1000 + small.len() as i64), "what is stored is counted");
    let refused = park::resolve(&pool, &BankAccounts, head.id, Resolve::Retry).await.unwrap_err();
    assert!(refused.to_string().contains("only the head of its payload is stored"), "{refused}");
}

/// Past `max_dead_letters` the partition halts at the message whose letter passes it (here
/// not even an envelope), naming the bound: what precedes it applies, nothing after it, and
/// once the bound is raised the next run keeps it and goes on.
#[sqlx::test(migrations = false)]
async fn past_max_dead_letters_the_partition_halts_at_the_message_and_loses_nothing(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let e = bank_accounts::generate::envelope;
    let opened = |id: &str| e(id, 1, &AccountEvent::AccountOpened { owner: id.into() }).to_json();
    let garbage = |n: u8| Some(vec![b'?', n]);
    let events = [
        (Some(0), Some("acc-1"), Some(opened("acc-1"))),
        (Some(0), Some("x"), garbage(1)),
        (Some(0), Some("acc-2"), Some(opened("acc-2"))),
        (Some(0), Some("x"), garbage(2)),
        (Some(0), Some("acc-1"), Some(e("acc-1", 2, &AccountEvent::MoneyDeposited { amount: 5 }).to_json())),
        (Some(0), Some("x"), garbage(3)),
        (Some(0), Some("acc-3"), Some(opened("acc-3"))),
    ];
    let topic = rand_test_topic("dead-letter-count");
    produce_to(&topic, 1, &events).await;
    let engine = |max| {
        let mut config = config();
        config.max_dead_letters = max;
        Engine::new(pool.clone(), config).register(Arc::new(BankAccounts), [topic.clone()])
    };
    let halts = run(engine(2)).await.halts();
    assert_eq!(halts.len(), 1, "{halts:?}");
    assert!(
        halts[0].contains("@5")
            && halts[0].contains("over max_dead_letters (2)")
            && halts[0].contains("--max-dead-letters"),
        "halts at the third letter's message, naming the bound and how to raise it: {}",
        halts[0]
    );
    let offsets = |letters: Vec<park::StoredDeadLetter>| letters.iter().map(|d| d.offset).collect::<Vec<_>>();
    let letters = park::dead_letters(&pool, None, false).await.unwrap();
    assert_eq!(offsets(letters), [Some(1), Some(3)], "never more than the bound");
    assert_eq!(accounts(&pool).await, [("acc-1".into(), 2), ("acc-2".into(), 1)], "what precedes it applies");
    assert_eq!(checkpoint(&pool, &topic).await, 5, "the partition stands at the message");

    let report = run(engine(3)).await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    let letters = park::dead_letters(&pool, None, false).await.unwrap();
    assert_eq!(offsets(letters), [Some(1), Some(3), Some(5)], "kept once the bound is raised");
    assert_eq!(accounts(&pool).await.len(), 3, "and the rest applied");
    assert_eq!(checkpoint(&pool, &topic).await, 7);
}

/// Past `max_dead_letter_bytes` the partition halts at the poison event whose letter passes
/// it, naming the bound; its aggregate is not parked, and the event is read again.
#[sqlx::test(migrations = false)]
async fn past_max_dead_letter_bytes_the_partition_halts_at_the_event(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let e = bank_accounts::generate::envelope;
    let mut poison = e("acc-p", 1, &AccountEvent::AccountOpened { owner: "p".into() });
    poison.data = serde_json::json!({ "owner": 7 });
    let events = [
        (Some(0), Some("x"), Some(vec![b'?'; 60])),
        (Some(0), Some("acc-1"), Some(e("acc-1", 1, &AccountEvent::AccountOpened { owner: "1".into() }).to_json())),
        (Some(0), Some("acc-p"), Some(poison.to_json())),
    ];
    let topic = rand_test_topic("dead-letter-bytes");
    produce_to(&topic, 1, &events).await;
    let mut config = config();
    config.max_dead_letter_bytes = 100;
    let report = run(Engine::new(pool.clone(), config).register(Arc::new(BankAccounts), [topic.clone()])).await;
    let halts = report.halts();
    assert_eq!(halts.len(), 1, "{halts:?}");
    assert!(halts[0].contains("@2") && halts[0].contains("over max_dead_letter_bytes (100)"), "{}", halts[0]);
    assert!(halts[0].contains("acc-p"), "names the aggregate: {}", halts[0]);
    assert_eq!(park::dead_letters(&pool, None, false).await.unwrap().len(), 1);
    assert!(park::list(&pool, None).await.unwrap().is_empty(), "nothing parked behind a letter not kept");
    assert_eq!(accounts(&pool).await, [("acc-1".into(), 1)]);
    assert_eq!(checkpoint(&pool, &topic).await, 2);
}

async fn accounts(pool: &PgPool) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT account_id, version FROM bank_accounts ORDER BY account_id").fetch_all(pool).await.unwrap()
}

async fn checkpoint(pool: &PgPool, topic: &str) -> i64 {
    sqlx::query_scalar("SELECT next_offset FROM projectionist_checkpoints WHERE topic = $1")
        .bind(topic)
        .fetch_one(pool)
        .await
        .unwrap()
}
