//! `rebuild --aggregate TYPE ID` (issue 70): a few accounts' rows repaired beside a live
//! `run` that goes on applying, and the command `rebuild --verify` prints for them.

mod common;

use std::time::{Duration, Instant};

use bank_accounts::generate;
use common::cli::Env;
use common::read_model;
use sqlx::PgPool;

/// Accounts A and C go wrong by hand (a balance, an owner), and B too. `rebuild --verify`
/// names all three and prints the command that repairs them. A repair of A and C, run while
/// more events are published and the live run applies them, puts A and C right; B, not named,
/// stays as it was changed; nothing is dead-lettered.
#[sqlx::test(migrations = false)]
async fn two_accounts_are_repaired_beside_a_live_run_and_a_third_is_left_as_it_is(pool: PgPool) {
    let env = Env::new(&pool, "repair").await;
    let events = generate::stream(30, 10, 907);
    let (first, rest) = events.split_at(events.len() * 2 / 3);
    env.publish(first).await;
    let (_live, log) = env.spawn(&[]);
    let before = generate::expected(first);
    let until = |what: &'static str, want: std::collections::BTreeMap<String, generate::ExpectedAccount>| {
        let (pool, log) = (pool.clone(), log.clone());
        async move {
            let started = Instant::now();
            while read_model(&pool).await != want {
                let log = log.lock().unwrap().clone();
                assert!(started.elapsed() < Duration::from_secs(90), "{what}: not in 90 s:\n{log}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    until("the first part applied", before.clone()).await;
    let ids: Vec<&String> = before.keys().take(3).collect();
    let (a, b, c) = (ids[0].clone(), ids[1].clone(), ids[2].clone());
    for (statement, id) in [
        ("UPDATE bank_accounts SET balance = balance + 1000 WHERE account_id = $1", &a),
        ("UPDATE bank_accounts SET balance = balance + 1000 WHERE account_id = $1", &b),
        ("UPDATE bank_accounts SET owner = 'mallory' WHERE account_id = $1", &c),
    ] {
        sqlx::query(statement).bind(id).execute(&pool).await.unwrap();
    }

    let (status, said, err) = env.output(&["rebuild", "--verify", "--metrics-addr", "off"]).await;
    assert_eq!(status.code(), Some(1), "verify finds rows that differ:\n{said}\n{err}");
    let command = said.lines().skip_while(|l| !l.starts_with("Or drop them and repair")).nth(1).unwrap_or_default();
    for id in [&a, &b, &c] {
        assert!(command.contains(&format!("--aggregate account {id}")), "names {id}:\n{said}");
    }
    assert!(command.contains("rebuild --projection bank_accounts --abandon && "), "{said}");
    let (status, said, err) = env.output(&["rebuild", "--abandon", "--metrics-addr", "off"]).await;
    assert!(status.success(), "{said}\n{err}");

    let repair = ["rebuild", "--metrics-addr", "off", "--aggregate", "account", &a, "--aggregate", "account", &c];
    let ((status, said, err), ()) = tokio::join!(env.output(&repair), env.publish(rest));
    assert!(status.success(), "repaired:\n{said}\n{err}");
    assert!(!err.contains("do not add up"), "each message read is counted once:\n{err}");
    for id in [&a, &c] {
        assert!(said.contains(&format!("account/{id}: repaired to version")), "{said}");
    }
    let mut after = generate::expected(&events);
    after.get_mut(&b).unwrap().balance += 1000;
    until("every event applied, A and C right, B as changed", after).await;
    let letters = projectionist::postgres::park::dead_letters(&pool, None, true).await.unwrap();
    assert!(letters.is_empty(), "nothing dead-lettered: {}", letters.len());
}

/// A projection cannot be repaired while a rebuild's shadow is kept: refused, saying what to
/// do; the live tables untouched.
#[sqlx::test(migrations = false)]
async fn a_repair_is_refused_while_an_unfinished_rebuild_is_kept(pool: PgPool) {
    let env = Env::new(&pool, "repair-kept").await;
    let events = generate::stream(5, 4, 31);
    env.publish(&events).await;
    let (status, said, err) = env.run_until_caught_up(&[]).await;
    assert!(status.success(), "{said}\n{err}");
    let id = "acc-00001";
    sqlx::query("UPDATE bank_accounts SET balance = balance + 1 WHERE account_id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    let (status, said, err) = env.output(&["rebuild", "--verify", "--metrics-addr", "off"]).await;
    assert_eq!(status.code(), Some(1), "{said}\n{err}");
    assert!(said.contains("1 rows differ"), "{said}");
    let (status, said, err) = env.output(&["rebuild", "--metrics-addr", "off", "--aggregate", "account", id]).await;
    assert!(!status.success(), "{said}");
    assert!(err.contains("the shadow of an unfinished rebuild is kept") && err.contains("--abandon"), "{err}");
    let model = read_model(&pool).await;
    assert_eq!(model[id].balance, generate::expected(&events)[id].balance + 1, "untouched");
}
