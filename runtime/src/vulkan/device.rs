//! The logical device: one compute queue, the memory allocator, and the counters.

use std::ffi::c_char;
use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard};

use ash::vk;
use gpu_allocator::vulkan::{Allocator, AllocatorCreateDesc};

use super::adapter::{Adapter, AdapterInfo, Requirements, ShaderFeatures};
use super::debug::ValidationLog;
use super::instance::{Instance, InstanceShared};
use crate::counters::{AtomicCounters, Counters};
use crate::error::{vk_err, Error, Result};

/// A logical device with one compute queue. Cheap to clone (shared state). Buffers, pipelines
/// and the rest each hold the shared state, so they may be dropped in any order; the
/// `VkDevice` is destroyed (after waiting for the GPU) when the last of them goes.
#[derive(Clone)]
pub struct Device {
    pub(crate) shared: Arc<DeviceShared>,
}

pub(crate) struct DeviceShared {
    pub(crate) raw: ash::Device,
    pub(crate) physical: vk::PhysicalDevice,
    pub(crate) info: AdapterInfo,
    pub(crate) enabled: ShaderFeatures,
    pub(crate) queue_family: u32,
    /// `vkQueueSubmit` needs the queue externally synchronised.
    pub(crate) queue: Mutex<vk::Queue>,
    /// Dropped by hand, before `vkDestroyDevice`: it frees its memory blocks through the device.
    pub(crate) allocator: ManuallyDrop<Mutex<Allocator>>,
    pub(crate) counters: AtomicCounters,
    /// Command buffers between `begin` and `finish` now; descriptor writes made while none is
    /// open add their own time to `host_ns` (inside a recording, the recording's time covers
    /// them).
    pub(crate) recording_now: AtomicUsize,
    /// Unsignalled fences ready for reuse (creating one per submit would cost a syscall).
    fences: Mutex<Vec<vk::Fence>>,
    /// Last field: the instance (and its debug messenger) is released only after the device is
    /// destroyed in `Drop`, so leak reports of `vkDestroyDevice` reach the log.
    pub(crate) instance: Arc<InstanceShared>,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.shared.info.name)
            .field("queue_family", &self.shared.queue_family)
            .finish_non_exhaustive()
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded Vulkan handles stay valid whatever a panicking thread was doing.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Device {
    /// Creates the device on `adapter` after checking `requirements` (an error names the device
    /// and everything it lacks). Every supported shader feature vkfuse knows is enabled, so
    /// kernels may use whatever [`AdapterInfo::features`] reports.
    pub fn new(
        instance: &Instance,
        adapter: &Adapter,
        requirements: &Requirements,
    ) -> Result<Self> {
        if !Arc::ptr_eq(&instance.shared, &adapter.instance) {
            return Err(Error::InvalidArgument(
                "the adapter belongs to another Vulkan instance".into(),
            ));
        }
        let info = adapter.info().clone();
        info.check(requirements)?;
        let queue_family = info
            .compute_queue_family
            .ok_or_else(|| Error::UnsupportedDevice {
                device: info.name.clone(),
                reason: "it has no compute queue".into(),
            })?;
        let instance_raw = &instance.shared.raw;
        let pd = adapter.raw;

        let f = info.features;
        let v1_2 = info.api_version.0 >= vk::API_VERSION_1_2;
        let core = vk::PhysicalDeviceFeatures::default()
            .shader_int16(f.shader_int16)
            .shader_int64(f.shader_int64);
        let mut storage16 = vk::PhysicalDevice16BitStorageFeatures::default()
            .storage_buffer16_bit_access(f.storage_buffer_16bit);
        let mut storage8 = vk::PhysicalDevice8BitStorageFeatures::default()
            .storage_buffer8_bit_access(f.storage_buffer_8bit);
        let mut f16i8 = vk::PhysicalDeviceShaderFloat16Int8Features::default()
            .shader_float16(f.shader_float16)
            .shader_int8(f.shader_int8);
        let mut atomic_int64 = vk::PhysicalDeviceShaderAtomicInt64Features::default()
            .shader_buffer_int64_atomics(f.buffer_int64_atomics);
        let mut addresses = vk::PhysicalDeviceBufferDeviceAddressFeatures::default()
            .buffer_device_address(f.buffer_device_address);
        let mut host_reset = vk::PhysicalDeviceHostQueryResetFeatures::default()
            .host_query_reset(f.host_query_reset);
        let mut features2 = vk::PhysicalDeviceFeatures2::default()
            .features(core)
            .push_next(&mut storage16);
        if v1_2 {
            // Only on 1.2+: the structs are core there (the adapter query is gated the same way).
            features2 = features2
                .push_next(&mut storage8)
                .push_next(&mut f16i8)
                .push_next(&mut atomic_int64)
                .push_next(&mut addresses)
                .push_next(&mut host_reset);
        }
        // Reported only where the extension is offered (the adapter query chains it then).
        let mut atomic_float = vk::PhysicalDeviceShaderAtomicFloatFeaturesEXT::default()
            .shader_buffer_float32_atomic_add(f.buffer_float32_atomic_add);
        if f.buffer_float32_atomic_add {
            features2 = features2.push_next(&mut atomic_float);
        }
        let mut executables = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default()
            .pipeline_executable_info(f.pipeline_executable_info);
        if f.pipeline_executable_info {
            features2 = features2.push_next(&mut executables);
        }
        let mut clock = vk::PhysicalDeviceShaderClockFeaturesKHR::default()
            .shader_device_clock(f.shader_device_clock);
        if f.shader_device_clock {
            features2 = features2.push_next(&mut clock);
        }
        // Core in 1.3; below it, reported only where the extension is offered (the adapter
        // query chains it then), which is then enabled too.
        let mut int_dot = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default()
            .shader_integer_dot_product(f.integer_dot_product);
        if f.integer_dot_product {
            features2 = features2.push_next(&mut int_dot);
        }
        let mut robustness = vk::PhysicalDevicePipelineRobustnessFeaturesEXT::default()
            .pipeline_robustness(f.pipeline_robustness);
        if f.pipeline_robustness {
            features2 = features2.push_next(&mut robustness);
        }
        let mut sm_builtins = vk::PhysicalDeviceShaderSMBuiltinsFeaturesNV::default()
            .shader_sm_builtins(f.shader_sm_builtins);
        if f.shader_sm_builtins {
            features2 = features2.push_next(&mut sm_builtins);
        }

        // SAFETY: `pd` belongs to the live instance.
        let device_extensions = unsafe { instance_raw.enumerate_device_extension_properties(pd) }
            .map_err(vk_err("vkEnumerateDeviceExtensionProperties"))?;
        let mut extensions: Vec<*const c_char> = Vec::new();
        let portability_subset = c"VK_KHR_portability_subset";
        if device_extensions
            .iter()
            .any(|e| e.extension_name_as_c_str() == Ok(portability_subset))
        {
            // The spec requires enabling it wherever it is offered (MoltenVK).
            extensions.push(portability_subset.as_ptr());
        }
        if f.buffer_float32_atomic_add {
            extensions.push(ash::ext::shader_atomic_float::NAME.as_ptr());
        }
        if f.pipeline_executable_info {
            extensions.push(ash::khr::pipeline_executable_properties::NAME.as_ptr());
        }
        if f.shader_device_clock {
            extensions.push(ash::khr::shader_clock::NAME.as_ptr());
        }
        if f.pipeline_robustness {
            extensions.push(ash::ext::pipeline_robustness::NAME.as_ptr());
        }
        if f.shader_sm_builtins {
            extensions.push(ash::nv::shader_sm_builtins::NAME.as_ptr());
        }
        // Below 1.3 (the device's or the instance's) the adapter reported the feature only
        // where the extension is offered.
        let used = info.api_version.0.min(instance.shared.api_version);
        if f.integer_dot_product && used < vk::API_VERSION_1_3 {
            extensions.push(ash::khr::shader_integer_dot_product::NAME.as_ptr());
        }

        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(queue_family)
            .queue_priorities(&priorities)];
        let create = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queues)
            .enabled_extension_names(&extensions)
            .push_next(&mut features2);
        // SAFETY: every pointer in `create` points into locals that outlive the call; only
        // features the adapter reported are enabled.
        let raw = unsafe { instance_raw.create_device(pd, &create, None) }
            .map_err(vk_err("vkCreateDevice"))?;
        // SAFETY: the family was requested with one queue above.
        let queue = unsafe { raw.get_device_queue(queue_family, 0) };

        let allocator = Allocator::new(&AllocatorCreateDesc {
            instance: instance_raw.clone(),
            device: raw.clone(),
            physical_device: pd,
            debug_settings: Default::default(),
            // Every allocation may then back a buffer reached by address (the timeline probe).
            buffer_device_address: f.buffer_device_address,
            allocation_sizes: Default::default(),
        });
        let allocator = match allocator {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: nothing was created from the device yet.
                unsafe { raw.destroy_device(None) };
                return Err(Error::Allocator(e.to_string()));
            }
        };

        Ok(Device {
            shared: Arc::new(DeviceShared {
                raw,
                physical: pd,
                enabled: f,
                info,
                queue_family,
                queue: Mutex::new(queue),
                allocator: ManuallyDrop::new(Mutex::new(allocator)),
                counters: AtomicCounters::default(),
                recording_now: AtomicUsize::new(0),
                fences: Mutex::new(Vec::new()),
                instance: Arc::clone(&instance.shared),
            }),
        })
    }

    /// What the device can do.
    pub fn info(&self) -> &AdapterInfo {
        &self.shared.info
    }

    /// The shader features enabled on this device.
    pub fn enabled_features(&self) -> ShaderFeatures {
        self.shared.enabled
    }

    /// Whether the compute queue writes timestamps.
    pub fn timestamps_supported(&self) -> bool {
        self.shared.info.timestamps()
    }

    /// The queue family of the compute queue.
    pub fn queue_family(&self) -> u32 {
        self.shared.queue_family
    }

    /// Running totals since the device was created; subtract two snapshots with
    /// [`Counters::since`] to get one run's.
    pub fn counters(&self) -> Counters {
        self.shared.counters.snapshot()
    }

    /// The instance's validation log.
    pub fn validation_log(&self) -> ValidationLog {
        self.shared.instance.log.clone()
    }

    /// `minStorageBufferOffsetAlignment`: descriptor offsets must be multiples of it.
    pub fn storage_offset_alignment(&self) -> u64 {
        self.shared.info.min_storage_buffer_offset_alignment
    }

    /// `offset` rounded up to the storage-buffer offset alignment.
    pub fn align_storage_offset(&self, offset: u64) -> u64 {
        align_up(offset, self.storage_offset_alignment())
    }

    /// `Ok` when `bytes` fit the device-local memory; else "model needs X GiB, device has Y GiB".
    pub fn check_fits(&self, bytes: u64) -> Result<()> {
        self.shared.info.check_fits(bytes)
    }

    /// Blocks until the GPU has finished everything submitted.
    pub fn wait_idle(&self) -> Result<()> {
        let _queue = lock(&self.shared.queue);
        // SAFETY: the queue lock is held, as vkDeviceWaitIdle needs all queues synchronised.
        unsafe { self.shared.raw.device_wait_idle() }.map_err(vk_err("vkDeviceWaitIdle"))
    }

    /// The `ash` device, for what this crate does not wrap. Objects made through it are not
    /// tracked, counted or destroyed by this crate.
    pub fn raw(&self) -> &ash::Device {
        &self.shared.raw
    }

    /// The physical device.
    pub fn raw_physical(&self) -> vk::PhysicalDevice {
        self.shared.physical
    }
}

/// `value` rounded up to a multiple of `align` (any non-zero `align`, not only powers of two).
pub fn align_up(value: u64, align: u64) -> u64 {
    if align <= 1 {
        value
    } else {
        value.div_ceil(align) * align
    }
}

impl DeviceShared {
    /// An unsignalled fence, reused or new.
    pub(crate) fn acquire_fence(&self) -> Result<vk::Fence> {
        if let Some(f) = lock(&self.fences).pop() {
            return Ok(f);
        }
        // SAFETY: the device is live.
        unsafe { self.raw.create_fence(&vk::FenceCreateInfo::default(), None) }
            .map_err(vk_err("vkCreateFence"))
    }

    /// Returns a fence that no pending submission uses; `signaled` ones are reset first.
    pub(crate) fn release_fence(&self, fence: vk::Fence, signaled: bool) {
        if signaled {
            // SAFETY: no submission uses the fence any more and this is its only holder.
            if unsafe { self.raw.reset_fences(&[fence]) }.is_err() {
                // SAFETY: as above.
                unsafe { self.raw.destroy_fence(fence, None) };
                return;
            }
        }
        lock(&self.fences).push(fence);
    }
}

impl Drop for DeviceShared {
    fn drop(&mut self) {
        // SAFETY: no other holder of the device is left; waiting first makes destruction legal
        // even if the GPU were still busy. An error (device lost) leaves nothing to wait for.
        let _ = unsafe { self.raw.device_wait_idle() };
        for fence in lock(&self.fences).drain(..) {
            // SAFETY: pooled fences belong to no pending submission.
            unsafe { self.raw.destroy_fence(fence, None) };
        }
        // SAFETY: dropped exactly once, here; every allocation was freed by its buffer (each
        // holds this state alive), and the allocator frees its blocks while the device lives.
        unsafe { ManuallyDrop::drop(&mut self.allocator) };
        // SAFETY: every child object held an Arc of this state and is gone; destroyed once.
        unsafe { self.raw.destroy_device(None) };
    }
}

#[cfg(test)]
mod tests {
    use super::align_up;

    #[test]
    fn align_up_rounds_to_any_alignment() {
        assert_eq!(align_up(0, 16), 0);
        assert_eq!(align_up(1, 16), 16);
        assert_eq!(align_up(16, 16), 16);
        assert_eq!(align_up(17, 12), 24);
        assert_eq!(align_up(5, 0), 5);
    }
}
