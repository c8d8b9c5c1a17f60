//! The per-token figures every backend reports (`--json` keys).

use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub backend: String,
    /// The generated ids.
    pub ids: Vec<u32>,
    /// Tokens processed (fed + generated but the last) per second of decode wall time.
    pub tokens_per_s: f64,
    pub host_us_per_token: f64,
    pub gpu_us_per_token: Option<f64>,
    pub dispatches_per_token: f64,
    pub barriers_per_token: f64,
    pub descriptor_writes_per_token: f64,
    pub recordings_per_token: f64,
    pub submits_per_token: f64,
}

impl RunReport {
    /// The report of `backend` from a run's per-token counters.
    pub fn new(
        backend: impl Into<String>,
        ids: Vec<u32>,
        per: &vkfuse_runtime::PerToken,
    ) -> RunReport {
        RunReport {
            backend: backend.into(),
            ids,
            tokens_per_s: per.tokens_per_s.unwrap_or(0.0),
            host_us_per_token: per.host_us_per_token,
            gpu_us_per_token: per.gpu_us_per_token,
            dispatches_per_token: per.dispatches_per_token,
            barriers_per_token: per.barriers_per_token,
            descriptor_writes_per_token: per.descriptor_writes_per_token,
            recordings_per_token: per.recordings_per_token,
            submits_per_token: per.submits_per_token,
        }
    }
}
