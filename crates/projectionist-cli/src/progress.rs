//! Progress of long work: an indicatif bar on a terminal (position against the target
//! fixed at start, percentage, rate, ETA; a spinner line with count and rate when there is
//! no target), plain periodic log lines otherwise (CI, systemd, docker logs).

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{HumanDuration, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle, WeakProgressBar};

/// The bar on screen, if any, for [`stderr`] to write log lines around.
static SHOWN: Mutex<Option<WeakProgressBar>> = Mutex::new(None);

/// The log's stderr: takes the bar on screen away while a log line is written and draws it
/// again below, so log lines never land on the bar's line nor leave stale bars behind.
pub(crate) fn stderr() -> LogWriter {
    LogWriter
}

pub(crate) struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let shown = SHOWN.lock().ok().and_then(|s| s.as_ref().and_then(WeakProgressBar::upgrade));
        match shown {
            Some(bar) => bar.suspend(|| std::io::stderr().write(buf)),
            None => std::io::stderr().write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

fn show(bar: Option<&ProgressBar>) {
    if let Ok(mut shown) = SHOWN.lock() {
        *shown = bar.map(ProgressBar::downgrade);
    }
}

/// Clones share the terminal bar, so one can be finished while another is still updating.
#[derive(Clone)]
pub(crate) struct ProgressDisplay {
    what: &'static str,
    /// What is counted: `events`, or `offsets` where transaction markers take offsets too.
    unit: &'static str,
    total: Option<u64>,
    started: Instant,
    last: Instant,
    last_done: Option<u64>,
    /// `Some` when stderr is a terminal.
    bar: Option<ProgressBar>,
}

impl ProgressDisplay {
    /// `unit`: what is counted (`events`, or `offsets`: a position in a partition, where a
    /// transaction's commit marker takes one too). `total`: the target fixed at start (e.g.
    /// offsets up to the high watermarks).
    pub(crate) fn new(what: &'static str, unit: &'static str, total: Option<u64>) -> Self {
        let now = Instant::now();
        let bar = std::io::stderr().is_terminal().then(|| bar(what, unit, total, ProgressDrawTarget::stderr()));
        show(bar.as_ref());
        Self { what, unit, total, started: now, last: now, last_done: None, bar }
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
                let (what, unit) = (self.what, self.unit);
                format!("{what}: {done}/{total} {unit} ({pct:.1}%), {rate:.0} {unit}/s, ETA {eta}")
            }
            _ => format!("{}: {done} {unit}, {rate:.0} {unit}/s", self.what, unit = self.unit),
        }
    }

    /// Reports `done`. The bar redraws at most 20 times a second by itself; a log line is
    /// written every 5 s at most, and only when `done` moved.
    pub(crate) fn update(&mut self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            return;
        }
        if self.last.elapsed() < Duration::from_secs(5) || self.last_done == Some(done) {
            return;
        }
        self.last = Instant::now();
        self.last_done = Some(done);
        tracing::info!(progress = %self.line(done), "Progress.");
    }

    /// Leaves the bar on screen with a last report.
    pub(crate) fn finish(&mut self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            // `abandon`, not `finish`: `finish` would move the position to the target.
            bar.abandon();
            show(None);
        }
    }

    /// Clears the bar without reporting (the caller prints its own summary).
    pub(crate) fn finish_quiet(&mut self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            bar.finish_and_clear();
            show(None);
        }
    }
}

/// A bar when the target is known and positive, a spinner line otherwise. Past the target
/// the bar stays full at 100% with no ETA, and the position goes on counting.
fn bar(what: &'static str, unit: &'static str, total: Option<u64>, target: ProgressDrawTarget) -> ProgressBar {
    let (len, template) = match total {
        Some(total) if total > 0 => (
            Some(total),
            format!(
                "{{prefix}}: [{{bar:30}}] {{human_pos}}/{{human_len}} {unit} ({{percent}}%), {{rate}}, ETA {{eta}}"
            ),
        ),
        _ => (None, format!("{{spinner}} {{prefix}}: {{human_pos}} {unit}, {{rate}}")),
    };
    let style = ProgressStyle::with_template(&template)
        .expect("a valid progress template")
        .progress_chars("=> ")
        .with_key("rate", move |state: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = write!(w, "{:.0} {unit}/s", state.per_sec());
        })
        // indicatif says 0s while nothing moves yet; "-" as the log line does, and once done.
        .with_key("eta", |state: &ProgressState, w: &mut dyn std::fmt::Write| {
            let behind = state.len().is_some_and(|len| state.pos() < len);
            if behind && !state.is_finished() && state.per_sec() > 0.0 {
                let _ = write!(w, "{:#}", HumanDuration(state.eta()));
            } else {
                let _ = w.write_str("-");
            }
        });
    let bar = ProgressBar::with_draw_target(len, target).with_style(style);
    bar.set_prefix(what);
    bar
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use indicatif::{ProgressDrawTarget, TermLike};

    use super::{bar, ProgressDisplay};

    /// A terminal that keeps the lines drawn (not the blanks that erase a longer line).
    #[derive(Debug, Clone, Default)]
    struct Screen(Arc<Mutex<Vec<String>>>);

    impl Screen {
        fn last(&self) -> String {
            self.0.lock().unwrap().last().cloned().unwrap_or_default()
        }
    }

    impl TermLike for Screen {
        fn width(&self) -> u16 {
            120
        }
        fn move_cursor_up(&self, _: usize) -> io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> io::Result<()> {
            Ok(())
        }
        fn write_line(&self, s: &str) -> io::Result<()> {
            self.write_str(s)
        }
        fn write_str(&self, s: &str) -> io::Result<()> {
            if !s.trim().is_empty() {
                self.0.lock().unwrap().push(s.to_owned());
            }
            Ok(())
        }
        fn clear_line(&self) -> io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_bar_shows_position_percentage_rate_and_eta_and_stays_full_past_the_target() {
        let screen = Screen::default();
        let b = bar("Replaying", "offsets", Some(1000), ProgressDrawTarget::term_like(Box::new(screen.clone())));
        let line = screen.last();
        assert_eq!(line, format!("Replaying: [{}] 0/1,000 offsets (0%), 0 offsets/s, ETA -", " ".repeat(30)));
        b.set_position(250);
        b.tick();
        let line = screen.last();
        assert!(line.starts_with("Replaying: [=======>                      ] 250/1,000 offsets (25%), "), "{line}");
        assert!(line.contains(" offsets/s, ETA ") && !line.ends_with("ETA -"), "{line}");
        b.set_position(1500);
        b.tick();
        let past = screen.last();
        assert!(past.starts_with(&format!("Replaying: [{}] 1,500/1,000 offsets (100%), ", "=".repeat(30))), "{past}");
        assert!(past.ends_with(" offsets/s, ETA -"), "{past}");
        b.abandon();
        let left = screen.last();
        assert!(left.starts_with(&format!("Replaying: [{}] 1,500/1,000 offsets (100%), ", "=".repeat(30))), "{left}");
    }

    #[test]
    fn without_a_target_a_spinner_line_shows_count_and_rate() {
        let screen = Screen::default();
        let b = bar("Publishing", "events", None, ProgressDrawTarget::term_like(Box::new(screen.clone())));
        b.set_position(12_345);
        b.abandon();
        let line = screen.last();
        assert!(line.contains(" Publishing: 12,345 events, "), "{line}");
        assert!(line.ends_with(" events/s"), "{line}");
    }

    #[test]
    fn lines_show_position_rate_and_eta() {
        let p = ProgressDisplay::new("Replaying", "offsets", Some(1000));
        let line = p.line(250);
        assert!(line.starts_with("Replaying: 250/1000 offsets (25.0%), "), "{line}");
        assert!(line.contains("offsets/s, ETA "), "{line}");
        assert!(ProgressDisplay::new("Publishing", "events", None).line(5).starts_with("Publishing: 5 events, "));
        assert!(p.line(1000).ends_with("ETA -"));
        let past = p.line(1500);
        assert!(past.starts_with("Replaying: 1500/1000 offsets (100.0%), ") && past.ends_with("ETA -"), "{past}");
    }
}
