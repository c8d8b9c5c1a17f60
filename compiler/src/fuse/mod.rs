//! Fusion: find the repeated layers of the flat trace ([`discover`]), then rewrite each
//! template once and instantiate it per instance.

pub mod discover;

pub use discover::{discover, Instance, Segmentation, Template, TemplateId};
