//! Fusion: find the repeated layers of the flat trace ([`discover`](mod@discover)), then
//! rewrite each template once and instantiate it per instance.
//!
//! The pipeline, per unit (the head, each template's first instance, the tail):
//! [`unit`](mod@unit) builds an e-graph of the unit's ops ([`lang`]); the [`rules`] saturate
//! it under node, iteration and time limits; [`extract`] picks one node per class under the
//! [`cost`] model, DAG-aware; [`program`] turns the choice into kernels ([`codegen`] writes the fused
//! ones' GLSL); [`schedule`] instantiates every unit by op offset into one `Schedule`;
//! [`report`] says what was fused and why; [`bands`] gives the attention block other grids for
//! short positions. After the levels are known, [`prefetch`] reads the
//! next matvecs' weights into L2 beside weight-free levels, [`kv_prefetch`] each attention
//! block's K/V caches a level or two before it, [`zeros`] merges each level's zero
//! kernels into few dispatches and [`persistent`] offers regions.

pub mod ablate;
pub mod bands;
pub mod codegen;
pub mod cost;
pub mod discover;
pub mod dots;
pub mod extract;
pub mod kv_prefetch;
pub mod lang;
pub mod persistent;
pub mod prefetch;
pub mod program;
pub mod report;
pub mod rules;
pub mod schedule;
pub mod unit;
pub mod zeros;

pub use discover::{discover, Instance, Segmentation, Template, TemplateId};
pub use dots::Dots;
pub use report::FusionReport;
pub use schedule::{fuse, lower_fused, FuseError, FuseOptions, Fused};
