//! Progress of the offline tools (`prune`, `eval ppl`): a bar on a terminal, plain log lines
//! otherwise (a pipe, a CI log), or nothing when hidden.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// Counts finished items of one stage.
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
    what: String,
    len: usize,
    done: usize,
    /// Log lines (no terminal): the last one's time.
    logged: Option<Instant>,
    show: bool,
}

/// Log lines come at most this often, and at the end.
const LOG_EVERY: Duration = Duration::from_secs(5);

impl Progress {
    /// `len` items of `what` (`unit` names one, plural); hidden unless `show`.
    pub fn new(show: bool, len: usize, what: &str, unit: &str) -> Self {
        let bar = (show && std::io::stderr().is_terminal()).then(|| {
            let b = indicatif::ProgressBar::new(len as u64);
            if let Ok(style) = indicatif::ProgressStyle::with_template(&format!("{{msg}} [{{bar:40}}] {{pos}}/{{len}} {unit} ({{eta}})")) {
                b.set_style(style);
            }
            b.set_message(what.to_owned());
            b
        });
        Self { bar, what: what.to_owned(), len, done: 0, logged: None, show }
    }

    /// One more item done.
    pub fn inc(&mut self) {
        self.done += 1;
        match &self.bar {
            Some(b) => b.inc(1),
            None if self.show => {
                let due = self.logged.is_none_or(|t| t.elapsed() >= LOG_EVERY) || self.done == self.len;
                if due {
                    tracing::info!(done = self.done, of = self.len, "{}", self.what);
                    self.logged = Some(Instant::now());
                }
            }
            None => {}
        }
    }

    /// Clears the bar.
    pub fn finish(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}
