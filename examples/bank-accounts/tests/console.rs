//! The operator's console (issue 69) in a real browser: headless Chromium from Debian's
//! packages, driven by Playwright for Python (`scripts/services.sh --browser`), against a
//! running `bank-accounts run --console` with a poison event.

mod common;

use std::time::{Duration, Instant};

use bank_accounts::{generate, AccountEvent};
use common::cli::Env;
use common::{http_get, read_model, skip, Serving};
use serde_json::Value;
use sqlx::PgPool;

/// Playwright's interpreter and Chromium, or `None` and a skip line.
fn browser(test: &str) -> Option<(String, String)> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let (Some(python), Some(chromium)) = (var("PROJECTIONIST_BROWSER_PYTHON"), var("PROJECTIONIST_CHROMIUM")) else {
        skip(test, "PROJECTIONIST_BROWSER_PYTHON or PROJECTIONIST_CHROMIUM is not set: scripts/services.sh --browser");
        return None;
    };
    Some((python, chromium))
}

/// `tests/tools/console_check.py` at `base`, one step: what it saw.
fn step(browser: &(String, String), base: &str, shots: &std::path::Path, step: &str, token: &str) -> Value {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/tools/console_check.py");
    let out = std::process::Command::new(&browser.0)
        .arg(script)
        .args([base, &browser.1, shots.to_str().unwrap(), step, token])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{step}: {stderr}\n{stdout}");
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{step}: {e}: {stdout}"))
}

/// What `serving` logged once it holds `line` (its stderr is read as it comes: a line logged
/// just now may not be in yet), or what it logged after 10 s.
async fn logged(serving: &Serving, line: &str) -> String {
    let started = Instant::now();
    while !serving.log().contains(line) && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    serving.log()
}

/// A form POST to `path` on `addr` with `headers`: the status and the body.
async fn post(addr: &str, path: &str, form: &str, headers: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}Content-Type: \
         application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{form}",
        form.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, response)
}

/// The open dead letters' ids.
async fn open_letters(pool: &PgPool) -> Vec<i64> {
    projectionist::postgres::park::dead_letters(pool, None, false).await.unwrap().iter().map(|d| d.id).collect()
}

/// A run with the console: the overview shows lag (table and chart), no halt, the parked
/// account and its dead letter, whose page masks the payload. A discard with a wrong token,
/// or sent by another site with the right one, is refused and changes nothing; with the
/// token, the account resumes and its row reaches the end of its stream.
#[sqlx::test(migrations = false)]
async fn the_console_shows_a_dead_letter_and_discards_it_only_with_the_token(pool: PgPool) {
    let test = "the_console_shows_a_dead_letter_and_discards_it_only_with_the_token";
    let Some(browser) = browser(test) else { return };
    let env = Env::new(&pool, "console").await;
    let mut events = generate::stream(12, 6, 693);
    let victim = events.iter().find(|e| e.version == 3).unwrap().aggregate_id.clone();
    for e in events.iter_mut().filter(|e| e.aggregate_id == victim && e.version == 2) {
        e.data = serde_json::json!("poison");
    }
    env.publish(&events).await;
    let token = "console-test-token";
    let args = env.run_args(&["--metrics-addr", "127.0.0.1:0", "--console", "--console-token", token]);
    let serving = Serving::spawn(env.cli(&args)).await;
    let base = format!("http://{}", serving.addr);
    let shots = std::env::var("PROJECTIONIST_SCREENSHOTS").map_or_else(|_| env.dir.join("screenshots"), Into::into);

    // Every account applied but the victim, at its version 1: its version 2 is a dead
    // letter, and what follows is held behind it.
    // Once its version 2 is discarded, the victim moves on as if it had changed nothing.
    let mut lost = events.clone();
    for e in lost.iter_mut().filter(|e| e.aggregate_id == victim && e.version == 2) {
        (e.event_type, e.data) = ("MoneyDeposited".into(), serde_json::json!({"amount": 0}));
    }
    let applied: Vec<_> = events.iter().filter(|e| e.aggregate_id != victim || e.version == 1).cloned().collect();
    let before = generate::expected(&applied);
    let started = Instant::now();
    while read_model(&pool).await != before || open_letters(&pool).await.len() != 1 {
        assert!(started.elapsed() < Duration::from_secs(60), "not parked in a minute:\n{}", serving.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let letter = open_letters(&pool).await[0];

    let seen = step(&browser, &base, &shots, "look", "");
    assert!(seen["ready"].as_str().unwrap().starts_with("ready"), "{seen}");
    assert_eq!(seen["lag_rows"], 4, "a row per partition: {seen}");
    assert_eq!(seen["halts"], "No partition is halted.", "{seen}");
    assert!(seen["parked"].as_str().unwrap().contains(&victim), "{seen}");
    assert_eq!((seen["dead_letters"].as_i64(), seen["letter"].as_str()), (Some(1), Some(letter.to_string().as_str())));
    let payload = seen["payload"].as_str().unwrap();
    assert!(payload.contains("\"***\"") && !payload.contains("poison"), "masked by default: {payload}");
    assert!(!seen["error"].as_str().unwrap().is_empty(), "{seen}");

    let retry = format!("operator=console-test&token={token}");
    let (status, body) = post(&serving.addr, &format!("/console/dead-letters/{letter}/retry"), &retry, "").await;
    assert!(status == 200 && body.contains("Still failing"), "a retry that fails again: {status} {body}");
    let seen = step(&browser, &base, &shots, "refused", "not-the-token");
    assert!(seen["result"].as_str().unwrap().contains("wrong or missing token"), "{seen}");
    let form = format!("reason=x&operator=evil&token={token}");
    let (status, body) = post(
        &serving.addr,
        &format!("/console/dead-letters/{letter}/discard"),
        &form,
        "Origin: http://evil.example\r\n",
    )
    .await;
    assert!(status == 403 && body.contains("another site"), "{status} {body}");
    assert_eq!(open_letters(&pool).await, [letter], "refused: nothing changed");
    assert_eq!(read_model(&pool).await, before, "refused: nothing changed");

    let seen = step(&browser, &base, &shots, "discard", token);
    assert!(seen["result"].as_str().unwrap().contains("discarded"), "{seen}");
    assert_eq!((seen["parked"].as_str(), seen["dead_letters"].as_i64()), (Some("No aggregate is parked."), Some(0)));
    assert!(open_letters(&pool).await.is_empty());
    assert_eq!(read_model(&pool).await, generate::expected(&lost), "the account resumed past its lost version");
    let (_, metrics) = http_get(&serving.addr, "/metrics").await;
    for (labels, count) in [
        (r#"action="retry",outcome="still_failing""#, 1),
        (r#"action="discard",outcome="refused""#, 2),
        (r#"action="discard",outcome="done""#, 1),
    ] {
        let line = format!("projectionist_console_actions_total{{{labels}}} {count}");
        assert!(metrics.lines().any(|l| l == line), "{line} in:\n{metrics}");
    }
    let log = logged(&serving, "Console action done.").await;
    assert!(log.contains("Console action done.") && log.contains("console-test"), "logged with who:\n{log}");
    assert!(log.contains("Console action refused: wrong or missing token."), "{log}");
}

/// A run with a halted partition (`--on-poison halt`) and an account parked behind a gap: the
/// overview says the run is not ready and names the halt's offset and reason; skipping the
/// missing version, with the token, resumes the account. The halted partition stays halted:
/// poison is not retried, since it cannot heal by itself.
#[sqlx::test(migrations = false)]
async fn the_console_shows_a_halt_and_skips_a_lost_version(pool: PgPool) {
    let test = "the_console_shows_a_halt_and_skips_a_lost_version";
    let Some(browser) = browser(test) else { return };
    let env = Env::new(&pool, "console-halt").await;
    let opened = |id: &str| generate::envelope(id, 1, &AccountEvent::AccountOpened { owner: id.into() });
    let deposit = |id: &str, v, amount| generate::envelope(id, v, &AccountEvent::MoneyDeposited { amount });
    // One partition: the account with a gap first, then the poison message that halts it.
    env.produce_raw("acc-gap", [opened("acc-gap").to_json(), deposit("acc-gap", 3, 7).to_json()]).await;
    let poison = br#"{"id": "not-a-uuid", "aggregate_type": "account"}"#.to_vec();
    env.produce_raw("acc-p", [opened("acc-p").to_json(), poison, deposit("acc-p", 2, 5).to_json()]).await;
    let token = "console-test-token";
    let extra = ["--metrics-addr", "127.0.0.1:0", "--on-poison", "halt", "--console", "--console-token", token];
    let serving = Serving::spawn(env.cli(&env.run_args(&extra))).await;
    let started = Instant::now();
    while !http_get(&serving.addr, "/console").await.1.contains("partition halted") {
        assert!(started.elapsed() < Duration::from_secs(60), "no halt in a minute:\n{}", serving.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let shots = std::env::var("PROJECTIONIST_SCREENSHOTS").map_or_else(|_| env.dir.join("screenshots"), Into::into);
    let seen = step(&browser, &format!("http://{}", serving.addr), &shots, "halt", token);
    assert!(seen["ready"].as_str().unwrap().starts_with("not ready"), "{seen}");
    let halts = seen["halts"].as_str().unwrap();
    assert!(halts.contains(&format!("{}/0@3", env.topic)) && halts.contains("not a UUID"), "{seen}");
    assert!(seen["parked"].as_str().unwrap().contains("acc-gap"), "{seen}");
    assert!(seen["result"].as_str().unwrap().contains("skipped"), "{seen}");
    assert_eq!(seen["parked_after"], "No aggregate is parked.", "{seen}");
    let rows = read_model(&pool).await;
    assert_eq!((rows["acc-gap"].version, rows["acc-gap"].balance), (3, 7), "resumed past version 2");
    assert_eq!(rows["acc-p"].version, 1, "nothing at or after the halted offset is applied");
    let log = logged(&serving, "Console action done.").await;
    assert!(!log.contains("Retrying the halted partition"), "poison is not retried: it cannot heal:\n{log}");
    assert!(log.contains("Console action done."), "{log}");
}

/// Off by default: without `--console` there is no /console.
#[sqlx::test(migrations = false)]
async fn there_is_no_console_unless_asked_for(pool: PgPool) {
    let env = Env::new(&pool, "no-console").await;
    env.publish(&generate::stream(2, 2, 694)).await;
    let serving = Serving::spawn(env.cli(&env.run_args(&["--metrics-addr", "127.0.0.1:0"]))).await;
    let (status, _) = http_get(&serving.addr, "/console").await;
    assert_eq!(status, 404);
    let (status, body) = post(&serving.addr, "/console/parked/skip", "token=x", "").await;
    assert_eq!(status, 405, "{body}");
}

/// Not served beyond loopback unless told: `--console` on `0.0.0.0` without `--console-remote`
/// stops the run before it reads anything, naming the flag.
#[sqlx::test(migrations = false)]
async fn the_console_serves_only_on_loopback_unless_told(pool: PgPool) {
    let env = Env::new(&pool, "console-remote").await;
    env.publish(&generate::stream(2, 2, 695)).await;
    let args = env.run_args(&["--metrics-addr", "0.0.0.0:0", "--console", "--exit-when-caught-up"]);
    let out = tokio::time::timeout(Duration::from_secs(60), env.cli(&args).output()).await.unwrap().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("give --console-remote"), "{stderr}");
    assert!(read_model(&pool).await.is_empty(), "nothing applied");
}
