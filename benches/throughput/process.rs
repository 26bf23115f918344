//! A projector process run and watched: its CPU and peak RSS from `/proc`, when it was
//! assigned, done and exited.

use super::*;

/// CPU seconds (user + system) of this process's children that have been waited for, from
/// `/proc/self/stat` (`cutime`, `cstime`): around one projector run, its own CPU.
pub(super) fn children_cpu_seconds() -> f64 {
    stat_seconds("self", 13).expect("/proc/self/stat (Linux)")
}

/// Two clock-tick counters of `/proc/<pid>/stat` added up, in seconds: from the field
/// `first` counted after the command name (11: `utime`, `stime`; 13: `cutime`, `cstime`).
pub(super) fn stat_seconds(pid: &str, first: usize) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    Some((ticks(first)? + ticks(first + 1)?) / clock_ticks())
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 where it cannot say).
pub(super) fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        let out = Command::new("getconf").arg("CLK_TCK").output().ok();
        out.and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse::<f64>().ok()).unwrap_or(100.0)
    })
}

/// A process's peak resident set (`VmHWM`), in KiB.
pub(super) fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with("VmHWM:"))?.split_whitespace().nth(1)?.parse().ok()
}

/// One projector run: deliveries/s, peak RSS in MiB, CPU seconds (user + system).
pub(super) struct Run {
    pub(super) rate: f64,
    pub(super) rss_mib: f64,
    pub(super) cpu_seconds: f64,
    /// A rebuild's swap, in milliseconds.
    pub(super) swap_ms: Option<u64>,
    /// What a user waits for: from the process's start to its exit.
    pub(super) start_to_exit: Duration,
    /// From the start to its first partition assignment (start-up, group join).
    pub(super) to_assigned: Duration,
    /// From "caught up" (`run`) or "swapped in" (`rebuild`) to the exit (consumer close).
    pub(super) closing: Duration,
}

impl Run {
    /// Start to exit, and where the time outside the reading went.
    pub(super) fn timeline(&self) -> String {
        format!(
            "{:.2} s start to exit: {:.2} s to its assignment, {:.2} s from done to exit",
            self.start_to_exit.as_secs_f64(),
            self.to_assigned.as_secs_f64(),
            self.closing.as_secs_f64()
        )
    }
}

/// A projector binary of the examples: the variable naming it (else its path in the
/// release build), the variable naming its topic, its package.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bin {
    pub(super) var: &'static str,
    pub(super) default: &'static str,
    pub(super) topic_var: &'static str,
    pub(super) package: &'static str,
}

pub(super) const BANK_ACCOUNTS: Bin = Bin {
    var: "BANK_ACCOUNTS_BIN",
    default: "target/release/bank-accounts",
    topic_var: "BANK_ACCOUNTS_TOPIC",
    package: "bank-accounts",
};

/// Ten copies of the bank accounts projection in one process (`bank-fleet`).
pub(super) const BANK_FLEET: Bin = Bin {
    var: "BANK_FLEET_BIN",
    default: "target/release/bank-fleet",
    topic_var: "BANK_ACCOUNTS_TOPIC",
    package: "bank-accounts",
};

impl Bin {
    pub(super) fn path(&self) -> String {
        std::env::var(self.var).unwrap_or_else(|_| self.default.into())
    }
}

/// The whole pipeline: the bank-accounts projector binary, from its first partition
/// assignment to caught up: deliveries/s, the process's peak RSS, and its CPU time (from
/// start to exit, connections and start-up included).
pub(super) fn pipeline(db_url: &str, topic: &str, deliveries: usize, args: &[&str]) -> Run {
    BANK_ACCOUNTS.projector("run", db_url, topic, deliveries, &[&["--exit-when-caught-up"], args].concat())
}

/// A `rebuild` of the projected stream beside its tables, swapped in at the end: as
/// [`pipeline`], and how long the swap took (its log line says).
pub(super) fn rebuild(db_url: &str, topic: &str, deliveries: usize) -> Run {
    BANK_ACCOUNTS.projector("rebuild", db_url, topic, deliveries, &[])
}

/// `rebuild --drop-old`: removes the tables the last rebuild replaced, so that another can run.
pub(super) fn drop_old(db_url: &str) {
    let bin = BANK_ACCOUNTS.path();
    let status = Command::new(&bin)
        .args(["rebuild", "--drop-old"])
        .env("DATABASE_URL", db_url)
        .stdout(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
    assert!(status.success(), "rebuild --drop-old failed: {status}");
}

impl Bin {
    /// The projector running `command` (`run` with `--exit-when-caught-up` in `args`, up to
    /// caught up; `rebuild`, up to its swap), from its first partition assignment to its exit.
    pub(super) fn projector(&self, command: &str, db_url: &str, topic: &str, deliveries: usize, args: &[&str]) -> Run {
        let cpu_before = children_cpu_seconds();
        let bin = self.path();
        static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let group = format!("bench-{}-{}", std::process::id(), RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let started = Instant::now();
        let child = Command::new(&bin)
            .arg(command)
            .args(["--metrics-addr", "off", "--kafka-property", "session.timeout.ms=6000", "--group-id", &group])
            .args(args)
            .env("DATABASE_URL", db_url)
            .env(self.topic_var, topic)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start {bin}: {e} (build it: cargo build --release -p {})", self.package)
            });
        watch(child, started, deliveries, cpu_before)
    }
}

/// Follows a projector `child` started at `started` to its exit: its peak RSS, when it was
/// assigned, done and exited.
pub(super) fn watch(mut child: std::process::Child, started: Instant, deliveries: usize, cpu_before: f64) -> Run {
    let pid = child.id();
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let watcher = {
        let peak = peak.clone();
        std::thread::spawn(move || loop {
            let Some(kb) = peak_rss_kib(pid) else { return };
            peak.fetch_max(kb, std::sync::atomic::Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(20));
        })
    };
    let (mut assigned, mut swap_ms, mut done) = (None, None, None);
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap_or_default();
        if assigned.is_none() && line.contains("Partition assigned") {
            assigned = Some(Instant::now());
        }
        if line.contains("Caught up with the high watermarks; stopping.") || line.contains("Rebuild swapped in") {
            done = Some(Instant::now());
        }
        if let Some((_, ms)) = line.split_once("swap_ms=") {
            swap_ms = ms.split_whitespace().next().and_then(|ms| ms.parse::<u64>().ok());
        }
        if line.contains("ERROR") || line.contains("error:") {
            eprintln!("  pipeline: {line}");
        }
    }
    let status = child.wait().unwrap();
    let exited = Instant::now();
    let assigned = assigned.expect("the projector was assigned partitions");
    let took = assigned.elapsed();
    assert!(status.success(), "the projector failed: {status}");
    let _ = watcher.join();
    Run {
        rate: deliveries as f64 / took.as_secs_f64(),
        rss_mib: peak.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1024.0,
        cpu_seconds: children_cpu_seconds() - cpu_before,
        swap_ms,
        start_to_exit: exited - started,
        to_assigned: assigned - started,
        closing: done.map_or(Duration::ZERO, |done| exited - done),
    }
}
