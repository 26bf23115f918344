//! Fault points for the fault suite (`scripts/chaos.sh`, docs/testing.md): places where a
//! crash is worst for exactness, at which a test can have the process killed. Compiled in
//! only with the `fault-hooks` feature; without it `point` is empty and costs nothing.
//!
//! `PROJECTIONIST_FAULT=<point>:<n>` kills the process with SIGKILL the `n`-th time it
//! reaches `point` (no destructor runs, nothing is flushed, no offset is committed: as the
//! kernel's OOM killer or a power cut would leave it); `<point>:<n>:sleep-<ms>` holds it
//! there for that long instead (a slow commit, its locks held); `<point>:<n>:panic` panics
//! there (a bug in the engine or a library it calls: what its supervision must show). The
//! points:
//! - `before-postgres-commit`: a batch's transaction written, not committed;
//! - `after-postgres-commit`: committed, its offsets not yet committed to Kafka;
//! - `before-swap-commit`: a rebuild's swap done but for its commit;
//! - `partition-read`: a partition's task about to buffer a message it read.

/// Kills the process here when `PROJECTIONIST_FAULT` names this point and this is the time
/// it says (see the module).
#[cfg(feature = "fault-hooks")]
pub fn point(name: &'static str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static PLAN: OnceLock<Option<(String, u64, Option<Action>)>> = OnceLock::new();
    static REACHED: AtomicU64 = AtomicU64::new(0);
    let plan = PLAN.get_or_init(|| {
        let plan = std::env::var("PROJECTIONIST_FAULT").ok()?;
        let mut parts = plan.split(':');
        let (point, n) = (parts.next()?, parts.next()?.parse().ok()?);
        let action = match parts.next() {
            Some("panic") => Some(Action::Panic),
            Some(sleep) => Some(Action::Sleep(sleep.strip_prefix("sleep-")?.parse().ok()?)),
            None => None,
        };
        Some((point.to_owned(), n, action))
    });
    let Some((point, n, action)) = plan else { return };
    if point != name || REACHED.fetch_add(1, Ordering::SeqCst) + 1 != *n {
        return;
    }
    if let Some(Action::Sleep(ms)) = action {
        eprintln!("fault point {name} reached the {n}th time: held {ms} ms");
        std::thread::sleep(std::time::Duration::from_millis(*ms));
    } else if let Some(Action::Panic) = action {
        panic!("fault point {name} reached the {n}th time: panic");
    } else {
        eprintln!("fault point {name} reached the {n}th time: SIGKILL");
        let pid = std::process::id().to_string();
        let _ = std::process::Command::new("kill").args(["-KILL", &pid]).status();
        std::process::abort();
    }
}

/// What a fault point does instead of a kill.
#[cfg(feature = "fault-hooks")]
enum Action {
    /// Holds the thread for this many milliseconds.
    Sleep(u64),
    /// Panics.
    Panic,
}

/// Kills the process here when `PROJECTIONIST_FAULT` says so: only with the `fault-hooks`
/// feature (see the module).
#[cfg(not(feature = "fault-hooks"))]
#[inline(always)]
pub fn point(_name: &'static str) {}
