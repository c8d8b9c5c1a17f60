//! vkfuse runtime: runs a compiled decode step (a schedule file from `compile-model`) on a
//! Vulkan device, with the host doing as little as possible per token.
//!
//! Layers, top down:
//! - [`Session`] ([`api`]): what a program that embeds vkfuse needs: open a schedule file on a
//!   device, feed ids, stream greedy tokens, read the counters;
//! - [`schedule`]: the compiled step and its file format; [`session`]: [`session::Loaded`]
//!   (every Vulkan object created once) and the [`session::Replay`] and [`session::Eager`]
//!   executors;
//! - the Vulkan layer (ash, loaded at run time, and gpu-allocator), re-exported at the root,
//!   and the [`Counters`] every speed claim is argued with.
//!
//! ```no_run
//! use vkfuse_runtime::{Session, SessionOptions};
//! # fn main() -> Result<(), vkfuse_runtime::SessionError> {
//! let mut session = Session::open("qwen3.vkf", &SessionOptions::default())?;
//! session.feed(&[1, 2, 3])?;
//! let ids: Vec<u32> = session.generate(16).collect::<Result<_, _>>()?;
//! # Ok(()) }
//! ```
//!
//! Below the session, the Vulkan layer alone:
//!
//! ```no_run
//! use vkfuse_runtime::*;
//! # fn main() -> Result<()> {
//! let instance = Instance::new(&InstanceOptions::default())?;
//! let adapter = instance.select_adapter(None)?;
//! let device = Device::new(&instance, &adapter, &Requirements::none())?;
//! let buffer = device.create_buffer(1024, BufferKind::DeviceLocal)?;
//! # Ok(()) }
//! ```
//!
//! No compiler here (no egg, no shaderc): shaders arrive as SPIR-V words.

#![warn(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod api;
pub mod counters;
pub mod error;
pub mod schedule;
pub mod session;
pub mod vulkan;

pub use api::{Backend, Generate, Session, SessionOptions};
pub use counters::{Counters, PerToken};
pub use error::{Error, Result};
pub use session::{Handoffs, Persistence, SessionError, StepOutput};
pub use vulkan::*;

/// Re-export of the `ash` version in use, for callers that go below this API.
pub use ash;

#[cfg(test)]
mod tests {
    use super::*;

    fn shareable<T: Send + Sync>() {}

    #[test]
    fn handles_can_cross_threads() {
        // Executors may load on one thread and submit on another.
        shareable::<Instance>();
        shareable::<Adapter>();
        shareable::<Device>();
        shareable::<Buffer>();
        shareable::<Pipeline>();
        shareable::<PipelineCache>();
        shareable::<DescriptorPool>();
        shareable::<DescriptorSet>();
        shareable::<CommandBuffer>();
        shareable::<TimestampPool>();
        shareable::<ValidationLog>();
        shareable::<Error>();
        shareable::<Session>();
    }
}
