//! The weight upload display: large models take a while to reach the GPU, so the upload shows
//! its progress on stderr (live on a terminal, one summary line otherwise), but only when it is
//! large or slow: small models and tests stay quiet.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};
use vkfuse_runtime::session::Progress;

/// Uploads at least this large are shown.
const LARGE: u64 = 256 << 20;
/// Uploads that take at least this long are shown.
const SLOW: Duration = Duration::from_secs(1);

/// Feeds [`vkfuse_runtime::session::LoadOptions::progress`].
pub struct UploadDisplay {
    start: Instant,
    last_drawn: Option<Instant>,
    tty: bool,
}

impl UploadDisplay {
    pub fn new() -> UploadDisplay {
        UploadDisplay {
            start: Instant::now(),
            last_drawn: None,
            tty: std::io::stderr().is_terminal(),
        }
    }

    fn shown(&self, p: Progress) -> bool {
        p.total >= LARGE || self.start.elapsed() >= SLOW
    }

    /// One progress report.
    pub fn update(&mut self, p: Progress) {
        if !self.shown(p) {
            return;
        }
        let done = p.done >= p.total;
        let mut err = std::io::stderr().lock();
        let secs = self.start.elapsed().as_secs_f64();
        if self.tty {
            let due = self
                .last_drawn
                .is_none_or(|t| t.elapsed() >= Duration::from_millis(100));
            if due || done {
                let pct = 100.0 * p.done as f64 / p.total.max(1) as f64;
                let _ = write!(
                    err,
                    "\ruploading weights: {:.2} / {:.2} GB ({pct:.0}%)",
                    p.done as f64 / 1e9,
                    p.total as f64 / 1e9
                );
                self.last_drawn = Some(Instant::now());
            }
        }
        if done {
            let _ = writeln!(
                err,
                "{}uploaded {:.2} GB of weights in {secs:.2} s ({:.2} GB/s)",
                if self.tty { "\n" } else { "" },
                p.total as f64 / 1e9,
                p.total as f64 / 1e9 / secs.max(1e-9)
            );
        }
    }
}
