//! Per-run totals of the work the host asked of the GPU, and their per-token figures.
//!
//! The device counts as it goes ([`crate::Device::counters`] is a snapshot of totals since the
//! device was created); an executor takes a snapshot before and after a run, subtracts with
//! [`Counters::since`], fills in `tokens`, `wall_ns` and `gpu_ns`, and reports
//! [`Counters::per_token`]. These are the figures every speed claim is argued with: dispatches
//! and barriers are the GPU's currency, descriptor writes and recordings the host's.

use std::sync::atomic::{AtomicU64, Ordering};

/// Totals for one run. Plain data: add, subtract and fill in freely.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Host nanoseconds spent recording command buffers (from `begin` to `finish`), submitting
    /// them, and writing descriptor sets outside a recording.
    pub host_ns: u64,
    /// Dispatches executed: a command buffer's dispatches count at each submit of it, so a
    /// replayed buffer counts per token like an eagerly re-recorded one.
    pub dispatches: u64,
    /// Pipeline barriers executed, counted at submit like `dispatches`.
    pub barriers: u64,
    /// `VkWriteDescriptorSet`s passed to `vkUpdateDescriptorSets`.
    pub descriptor_writes: u64,
    /// Command buffers recorded (one per `begin`/`finish`).
    pub recordings: u64,
    /// `vkQueueSubmit` calls.
    pub submits: u64,
    /// GPU nanoseconds measured with timestamps, where the queue has them.
    pub gpu_ns: Option<u64>,
    /// Tokens produced in the run (set by the executor).
    pub tokens: u64,
    /// Wall-clock nanoseconds of the run (set by the executor); 0 when unknown.
    pub wall_ns: u64,
}

/// The per-token figures of a run, named as `vkfuse run --json` names them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PerToken {
    /// Tokens per wall-clock second; `None` when the wall time is unknown.
    pub tokens_per_s: Option<f64>,
    /// Host microseconds spent recording and submitting per token.
    pub host_us_per_token: f64,
    /// GPU microseconds per token; `None` where timestamps are unavailable.
    pub gpu_us_per_token: Option<f64>,
    /// Dispatches per token.
    pub dispatches_per_token: f64,
    /// Barriers per token.
    pub barriers_per_token: f64,
    /// Descriptor writes per token.
    pub descriptor_writes_per_token: f64,
    /// Command-buffer recordings per token.
    pub recordings_per_token: f64,
    /// Queue submits per token.
    pub submits_per_token: f64,
}

impl Counters {
    /// The counts accumulated between `earlier` and `self` (two snapshots of the same device).
    /// `gpu_ns`, `tokens` and `wall_ns` are not device counts: they are taken from `self`.
    pub fn since(&self, earlier: &Counters) -> Counters {
        Counters {
            host_ns: self.host_ns.saturating_sub(earlier.host_ns),
            dispatches: self.dispatches.saturating_sub(earlier.dispatches),
            barriers: self.barriers.saturating_sub(earlier.barriers),
            descriptor_writes: self
                .descriptor_writes
                .saturating_sub(earlier.descriptor_writes),
            recordings: self.recordings.saturating_sub(earlier.recordings),
            submits: self.submits.saturating_sub(earlier.submits),
            gpu_ns: self.gpu_ns,
            tokens: self.tokens,
            wall_ns: self.wall_ns,
        }
    }

    /// Per-token figures; `None` when no token was produced.
    pub fn per_token(&self) -> Option<PerToken> {
        if self.tokens == 0 {
            return None;
        }
        let t = self.tokens as f64;
        let per = |n: u64| n as f64 / t;
        Some(PerToken {
            tokens_per_s: (self.wall_ns > 0).then(|| t / (self.wall_ns as f64 * 1e-9)),
            host_us_per_token: self.host_ns as f64 * 1e-3 / t,
            gpu_us_per_token: self.gpu_ns.map(|ns| ns as f64 * 1e-3 / t),
            dispatches_per_token: per(self.dispatches),
            barriers_per_token: per(self.barriers),
            descriptor_writes_per_token: per(self.descriptor_writes),
            recordings_per_token: per(self.recordings),
            submits_per_token: per(self.submits),
        })
    }
}

impl std::ops::AddAssign for Counters {
    /// Sums two runs; `gpu_ns` stays known only if both are known.
    fn add_assign(&mut self, o: Counters) {
        self.host_ns += o.host_ns;
        self.dispatches += o.dispatches;
        self.barriers += o.barriers;
        self.descriptor_writes += o.descriptor_writes;
        self.recordings += o.recordings;
        self.submits += o.submits;
        self.gpu_ns = self.gpu_ns.zip(o.gpu_ns).map(|(a, b)| a + b);
        self.tokens += o.tokens;
        self.wall_ns += o.wall_ns;
    }
}

impl PerToken {
    /// `(json key, value)` in the order `vkfuse run --json` prints them; `None` is JSON `null`.
    /// Lets a caller emit JSON without this crate depending on serde.
    pub fn entries(&self) -> [(&'static str, Option<f64>); 8] {
        [
            ("tokens_per_s", self.tokens_per_s),
            ("host_us_per_token", Some(self.host_us_per_token)),
            ("gpu_us_per_token", self.gpu_us_per_token),
            ("dispatches_per_token", Some(self.dispatches_per_token)),
            ("barriers_per_token", Some(self.barriers_per_token)),
            (
                "descriptor_writes_per_token",
                Some(self.descriptor_writes_per_token),
            ),
            ("recordings_per_token", Some(self.recordings_per_token)),
            ("submits_per_token", Some(self.submits_per_token)),
        ]
    }
}

impl std::fmt::Display for PerToken {
    /// One `key=value` per entry, `-` where unknown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (key, value)) in self.entries().iter().enumerate() {
            let sep = if i == 0 { "" } else { " " };
            match value {
                Some(v) => write!(f, "{sep}{key}={v:.3}")?,
                None => write!(f, "{sep}{key}=-")?,
            }
        }
        Ok(())
    }
}

/// The device's running totals, updated from any thread.
#[derive(Debug, Default)]
pub(crate) struct AtomicCounters {
    host_ns: AtomicU64,
    dispatches: AtomicU64,
    barriers: AtomicU64,
    descriptor_writes: AtomicU64,
    recordings: AtomicU64,
    submits: AtomicU64,
}

impl AtomicCounters {
    // Relaxed: each counter is an independent tally; a snapshot need not be atomic as a whole.
    pub(crate) fn add_host_ns(&self, ns: u64) {
        self.host_ns.fetch_add(ns, Ordering::Relaxed);
    }
    pub(crate) fn add_recording(&self, host_ns: u64) {
        self.recordings.fetch_add(1, Ordering::Relaxed);
        self.host_ns.fetch_add(host_ns, Ordering::Relaxed);
    }
    pub(crate) fn add_executed(&self, dispatches: u64, barriers: u64) {
        self.dispatches.fetch_add(dispatches, Ordering::Relaxed);
        self.barriers.fetch_add(barriers, Ordering::Relaxed);
    }
    pub(crate) fn add_descriptor_writes(&self, n: u64) {
        self.descriptor_writes.fetch_add(n, Ordering::Relaxed);
    }
    pub(crate) fn add_submit(&self, host_ns: u64) {
        self.submits.fetch_add(1, Ordering::Relaxed);
        self.host_ns.fetch_add(host_ns, Ordering::Relaxed);
    }
    pub(crate) fn snapshot(&self) -> Counters {
        Counters {
            host_ns: self.host_ns.load(Ordering::Relaxed),
            dispatches: self.dispatches.load(Ordering::Relaxed),
            barriers: self.barriers.load(Ordering::Relaxed),
            descriptor_writes: self.descriptor_writes.load(Ordering::Relaxed),
            recordings: self.recordings.load(Ordering::Relaxed),
            submits: self.submits.load(Ordering::Relaxed),
            gpu_ns: None,
            tokens: 0,
            wall_ns: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_token_divides_by_tokens() {
        let c = Counters {
            host_ns: 4_000,
            dispatches: 400,
            barriers: 280,
            descriptor_writes: 1000,
            recordings: 4,
            submits: 4,
            gpu_ns: Some(8_000),
            tokens: 4,
            wall_ns: 2_000_000,
        };
        let p = c.per_token().expect("tokens > 0");
        assert_eq!(p.tokens_per_s, Some(2000.0));
        assert_eq!(p.host_us_per_token, 1.0);
        assert_eq!(p.gpu_us_per_token, Some(2.0));
        assert_eq!(p.dispatches_per_token, 100.0);
        assert_eq!(p.barriers_per_token, 70.0);
        assert_eq!(p.descriptor_writes_per_token, 250.0);
        assert_eq!(p.recordings_per_token, 1.0);
        assert_eq!(p.submits_per_token, 1.0);
    }

    #[test]
    fn unknown_gpu_time_is_null() {
        let c = Counters {
            tokens: 2,
            ..Counters::default()
        };
        let p = c.per_token().expect("tokens > 0");
        assert_eq!(p.gpu_us_per_token, None);
        assert_eq!(p.tokens_per_s, None);
        let entries = p.entries();
        assert_eq!(entries[2], ("gpu_us_per_token", None));
        assert!(p.to_string().contains("gpu_us_per_token=-"));
    }

    #[test]
    fn no_tokens_no_per_token_figures() {
        assert_eq!(Counters::default().per_token(), None);
    }

    #[test]
    fn since_subtracts_device_counts() {
        let a = AtomicCounters::default();
        a.add_recording(10);
        a.add_executed(3, 2);
        let before = a.snapshot();
        a.add_recording(10);
        a.add_executed(5, 4);
        a.add_submit(7);
        a.add_descriptor_writes(6);
        let d = a.snapshot().since(&before);
        assert_eq!(
            (d.dispatches, d.barriers, d.recordings, d.submits),
            (5, 4, 1, 1)
        );
        assert_eq!((d.descriptor_writes, d.host_ns), (6, 17));
    }

    #[test]
    fn sums_keep_gpu_time_only_when_both_known() {
        let mut a = Counters {
            gpu_ns: Some(1),
            ..Counters::default()
        };
        a += Counters {
            gpu_ns: Some(2),
            ..Counters::default()
        };
        assert_eq!(a.gpu_ns, Some(3));
        a += Counters::default();
        assert_eq!(a.gpu_ns, None);
    }
}
