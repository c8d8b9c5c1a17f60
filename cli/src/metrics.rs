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
