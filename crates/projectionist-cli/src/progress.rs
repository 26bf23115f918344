//! Progress of long work: a live line on a terminal (rate, position against the target
//! fixed at start, ETA), plain periodic log lines otherwise.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

pub(crate) struct Progress {
    what: &'static str,
    total: Option<u64>,
    started: Instant,
    last: Instant,
    last_done: Option<u64>,
    tty: bool,
}

impl Progress {
    /// `total`: the target fixed at start (e.g. messages up to the high watermarks).
    pub(crate) fn new(what: &'static str, total: Option<u64>) -> Self {
        let now = Instant::now();
        Self { what, total, started: now, last: now, last_done: None, tty: std::io::stderr().is_terminal() }
    }

    fn line(&self, done: u64) -> String {
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let rate = done as f64 / secs;
        match self.total {
            Some(total) if total > 0 => {
                let pct = (done.min(total) as f64 / total as f64) * 100.0;
                let eta = if rate > 0.0 && done < total {
                    format!("{:.0}s", (total - done) as f64 / rate)
                } else {
                    "-".to_owned()
                };
                format!("{}: {done}/{total} events ({pct:.1}%), {rate:.0} events/s, ETA {eta}", self.what)
            }
            _ => format!("{}: {done} events, {rate:.0} events/s", self.what),
        }
    }

    /// Reports `done`; throttled (a terminal line 5 times a second, a log line every 5 s).
    pub(crate) fn update(&mut self, done: u64) {
        let every = if self.tty { Duration::from_millis(200) } else { Duration::from_secs(5) };
        if self.last.elapsed() < every || self.last_done == Some(done) {
            return;
        }
        self.last = Instant::now();
        self.last_done = Some(done);
        if self.tty {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K{}", self.line(done));
            let _ = err.flush();
        } else {
            tracing::info!(progress = %self.line(done), "Progress.");
        }
    }

    /// Ends the live line with a last report.
    pub(crate) fn finish(&mut self, done: u64) {
        if self.tty {
            eprintln!("\r\x1b[2K{}", self.line(done));
        }
    }

    /// Clears a live line without reporting (the caller prints its own summary).
    pub(crate) fn finish_quiet(&mut self, _done: u64) {
        if self.tty {
            eprint!("\r\x1b[2K");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Progress;

    #[test]
    fn lines_show_position_rate_and_eta() {
        let p = Progress::new("Replaying", Some(1000));
        let line = p.line(250);
        assert!(line.starts_with("Replaying: 250/1000 events (25.0%), "), "{line}");
        assert!(line.contains("events/s, ETA "), "{line}");
        assert!(Progress::new("Publishing", None).line(5).starts_with("Publishing: 5 events, "));
        assert!(p.line(1000).ends_with("ETA -"));
    }
}
