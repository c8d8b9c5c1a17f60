//! vkfuse runtime: a thin Vulkan layer (ash, loaded at run time, and gpu-allocator) that the
//! eager and replay executors build on, and the counters every speed claim is argued with.
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
//! No egg and no shaderc here: shaders arrive as SPIR-V words.

#![warn(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod counters;
pub mod error;
pub mod schedule;
pub mod session;
pub mod vulkan;

pub use counters::{Counters, PerToken};
pub use error::{Error, Result};
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
    }
}
