//! The Vulkan core, one concept per file (as wgpu-hal's vulkan backend):
//! loader → instance → debug messenger → adapters → device → buffers → pipelines → descriptors →
//! commands → timestamp queries.
//!
//! Ownership: every object holds an `Arc` of its device's shared state, and the device holds
//! its instance's, so objects may be dropped in any order and Vulkan destroys them children
//! first. A command buffer keeps what it uses alive until it is re-recorded or dropped, and
//! waits for its GPU work before letting go.

mod adapter;
mod buffer;
mod command;
mod debug;
mod descriptor;
mod device;
mod handoff;
mod instance;
mod loader;
mod pipeline;
mod query;
pub mod spirv;
mod statistics;
mod validated_turn;

pub use adapter::{
    Adapter, AdapterInfo, DeviceChoice, DeviceType, Feature, Requirements, ShaderFeatures,
    SubgroupOps, Version,
};
pub use buffer::{Buffer, BufferKind};
pub use command::{CommandBuffer, CommandRecorder, Stages};
pub use debug::{Message, Severity, ValidationLog};
pub use descriptor::{BufferBinding, DescriptorPool, DescriptorSet};
pub use device::{align_up, Device};
pub use handoff::{
    HandoffPush, HandoffRole, HandoffWords, HANDOFF_EMPTY, HANDOFF_PUSH_BYTES, HANDOFF_ROLE_SPEC_ID,
};
pub use instance::{Instance, InstanceOptions, VALIDATION_LAYER};
pub use pipeline::{spirv_from_bytes, Pipeline, PipelineCache, PipelineDesc, SpecConstants};
pub use query::TimestampPool;
pub use statistics::{Representation, Statistic, StatisticValue};
