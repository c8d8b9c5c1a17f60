//! The runtime's error type.
//!
//! Errors are returned for what a caller cannot foresee (no driver, a device that lacks a
//! capability, out of memory, a timeout, a lost device) and for misuse that would otherwise reach
//! the driver as undefined behaviour (an out-of-range offset, a buffer of the wrong kind). Each
//! message says what to do next where there is something to do.

use std::time::Duration;

use ash::vk;

/// Result with the runtime's [`enum@Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the Vulkan runtime can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The Vulkan loader (`libvulkan.so.1`) could not be loaded or no driver answered.
    #[error(
        "no usable Vulkan loader or driver: {reason}. Install the loader and a driver, e.g. \
         `apt-get install libvulkan1 mesa-vulkan-drivers` (lavapipe runs Vulkan on the CPU)"
    )]
    NoVulkan {
        /// What went wrong, in the loader's words where it gave any.
        reason: String,
    },

    /// Another thread has held validated Vulkan instances for too long: validated instances
    /// take turns, one thread at a time per process (the validation layer's global state is not
    /// thread-safe: runtime/src/vulkan/validated_turn.rs).
    #[error(
        "waited {waited:?} for another thread's validated Vulkan instances to be dropped; \
         validated instances take turns, one thread at a time per process (the validation layer \
         is not safe across threads): drop them sooner, or use one instance across threads"
    )]
    ValidationBusy {
        /// How long this thread waited.
        waited: Duration,
    },

    /// The loader works but lists no physical device.
    #[error(
        "Vulkan found no device. Install a driver for your GPU, or \
         `apt-get install mesa-vulkan-drivers` for lavapipe (Vulkan on the CPU)"
    )]
    NoDevice,

    /// A layer was requested (validation) but is not installed.
    #[error(
        "the Vulkan layer {layer} was requested but is not installed \
         (`apt-get install vulkan-validationlayers`)"
    )]
    LayerMissing {
        /// The layer's name.
        layer: &'static str,
    },

    /// An adapter was chosen by an index that does not exist.
    #[error(
        "{source_of_choice} asks for device {index}, but there are {count} device(s):\n{list}"
    )]
    AdapterIndex {
        /// Where the index came from (`--device` or `VKFUSE_DEVICE=N`).
        source_of_choice: String,
        /// The index that was asked for.
        index: usize,
        /// How many devices there are.
        count: usize,
        /// One line per device.
        list: String,
    },

    /// `--device` or `VKFUSE_DEVICE` named no device (neither an index nor part of a device
    /// name).
    #[error(
        "{source_of_choice}={value:?} matches no device (give an index or part of a name):\n{list}"
    )]
    AdapterName {
        /// Where the name came from (`--device` or `VKFUSE_DEVICE`).
        source_of_choice: String,
        /// The text given.
        value: String,
        /// One line per device.
        list: String,
    },

    /// The device lacks a capability the caller requires.
    #[error("device {device:?} lacks what vkfuse needs here: {missing}")]
    MissingCapabilities {
        /// The device's name.
        device: String,
        /// The missing capabilities, comma separated.
        missing: String,
    },

    /// The device is too old or has no compute queue.
    #[error("device {device:?} cannot be used: {reason}")]
    UnsupportedDevice {
        /// The device's name.
        device: String,
        /// Why.
        reason: String,
    },

    /// Host or device memory ran out.
    #[error("out of memory: {what} needs {requested} bytes (0 = the driver did not say)")]
    OutOfMemory {
        /// Bytes requested; 0 when a driver call failed without saying how much it wanted.
        requested: u64,
        /// What the memory was for.
        what: String,
    },

    /// A model (or any set of buffers) does not fit the device's local memory.
    #[error(
        "model needs {:.2} GiB, device {device:?} has {:.2} GiB of device-local memory",
        gib(*needed),
        gib(*available)
    )]
    ModelTooLarge {
        /// Bytes needed.
        needed: u64,
        /// Bytes of the largest device-local heap.
        available: u64,
        /// The device's name.
        device: String,
    },

    /// Waiting for the GPU took longer than allowed; the work is still in flight.
    #[error("timed out after {waited:?} waiting for the GPU; the work is still in flight")]
    Timeout {
        /// How long the wait lasted.
        waited: Duration,
    },

    /// The driver reported `VK_ERROR_DEVICE_LOST`: the GPU hung or crashed; the device is unusable.
    #[error("the Vulkan device was lost (GPU hang or driver reset); recreate the device")]
    DeviceLost,

    /// SPIR-V that cannot be a valid module.
    #[error("invalid SPIR-V: {0}")]
    InvalidSpirv(String),

    /// A call was made with arguments that do not fit the objects or the device's limits.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// An object is still in use by the GPU.
    #[error("{0} is still in use by the GPU; wait for its submission first")]
    InUse(&'static str),

    /// Any other Vulkan failure.
    #[error("{call} failed: {result}")]
    Vulkan {
        /// The Vulkan function that failed.
        call: &'static str,
        /// Its result code.
        result: vk::Result,
    },

    /// gpu-allocator failed for a reason other than running out of memory.
    #[error("memory allocator: {0}")]
    Allocator(String),
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

impl Error {
    /// Maps a failed Vulkan call: memory and device loss get their own variants so callers can
    /// match on them.
    pub(crate) fn vk(call: &'static str, result: vk::Result) -> Self {
        match result {
            vk::Result::ERROR_OUT_OF_HOST_MEMORY | vk::Result::ERROR_OUT_OF_DEVICE_MEMORY => {
                Error::OutOfMemory {
                    requested: 0,
                    what: call.to_string(),
                }
            }
            vk::Result::ERROR_DEVICE_LOST => Error::DeviceLost,
            result => Error::Vulkan { call, result },
        }
    }
}

/// `map_err(vk_err("vkFoo"))`.
pub(crate) fn vk_err(call: &'static str) -> impl FnOnce(vk::Result) -> Error {
    move |result| Error::vk(call, result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_too_large_reads_in_gib() {
        let e = Error::ModelTooLarge {
            needed: 3 << 30,
            available: 1 << 29,
            device: "tiny".into(),
        };
        assert_eq!(
            e.to_string(),
            "model needs 3.00 GiB, device \"tiny\" has 0.50 GiB of device-local memory"
        );
    }

    #[test]
    fn device_lost_and_oom_get_their_own_variants() {
        assert!(matches!(
            Error::vk("vkQueueSubmit", vk::Result::ERROR_DEVICE_LOST),
            Error::DeviceLost
        ));
        assert!(matches!(
            Error::vk("vkCreateBuffer", vk::Result::ERROR_OUT_OF_DEVICE_MEMORY),
            Error::OutOfMemory { .. }
        ));
        assert!(matches!(
            Error::vk("vkCreateBuffer", vk::Result::ERROR_UNKNOWN),
            Error::Vulkan { .. }
        ));
    }

    #[test]
    fn no_vulkan_mentions_lavapipe() {
        let msg = Error::NoDevice.to_string();
        assert!(msg.contains("mesa-vulkan-drivers"), "{msg}");
    }
}
