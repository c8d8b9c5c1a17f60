//! Physical devices: what each can do, and which one to use.

use std::fmt;
use std::sync::Arc;

use ash::vk;

use super::instance::InstanceShared;
use crate::error::{Error, Result};

/// A packed Vulkan version (`major.minor.patch` in `Display`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32);

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{}.{}",
            vk::api_version_major(self.0),
            vk::api_version_minor(self.0),
            vk::api_version_patch(self.0)
        )
    }
}

/// The kind of a physical device, in the order vkfuse prefers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DeviceType {
    /// A discrete GPU.
    Discrete,
    /// A GPU sharing memory with the CPU.
    Integrated,
    /// A GPU in a virtual machine.
    Virtual,
    /// Vulkan running on the CPU (lavapipe, SwiftShader).
    Cpu,
    /// Anything else.
    Other,
}

impl DeviceType {
    fn from_vk(t: vk::PhysicalDeviceType) -> Self {
        match t {
            vk::PhysicalDeviceType::DISCRETE_GPU => DeviceType::Discrete,
            vk::PhysicalDeviceType::INTEGRATED_GPU => DeviceType::Integrated,
            vk::PhysicalDeviceType::VIRTUAL_GPU => DeviceType::Virtual,
            vk::PhysicalDeviceType::CPU => DeviceType::Cpu,
            _ => DeviceType::Other,
        }
    }
}

impl fmt::Display for DeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceType::Discrete => "discrete GPU",
            DeviceType::Integrated => "integrated GPU",
            DeviceType::Virtual => "virtual GPU",
            DeviceType::Cpu => "CPU",
            DeviceType::Other => "other",
        })
    }
}

/// Subgroup operations available in compute shaders (`VkSubgroupFeatureFlags`), all false when
/// the device does not offer subgroups in the compute stage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)] // each field is the Vulkan flag of the same name
pub struct SubgroupOps {
    pub basic: bool,
    pub vote: bool,
    pub arithmetic: bool,
    pub ballot: bool,
    pub shuffle: bool,
    pub shuffle_relative: bool,
    pub clustered: bool,
    pub quad: bool,
}

impl SubgroupOps {
    fn from_vk(f: vk::SubgroupFeatureFlags) -> Self {
        use vk::SubgroupFeatureFlags as F;
        SubgroupOps {
            basic: f.contains(F::BASIC),
            vote: f.contains(F::VOTE),
            arithmetic: f.contains(F::ARITHMETIC),
            ballot: f.contains(F::BALLOT),
            shuffle: f.contains(F::SHUFFLE),
            shuffle_relative: f.contains(F::SHUFFLE_RELATIVE),
            clustered: f.contains(F::CLUSTERED),
            quad: f.contains(F::QUAD),
        }
    }

    fn names(&self) -> Vec<&'static str> {
        [
            (self.basic, "basic"),
            (self.vote, "vote"),
            (self.arithmetic, "arithmetic"),
            (self.ballot, "ballot"),
            (self.shuffle, "shuffle"),
            (self.shuffle_relative, "shuffle_relative"),
            (self.clustered, "clustered"),
            (self.quad, "quad"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}

impl fmt::Display for SubgroupOps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = self.names();
        if names.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&names.join(" "))
        }
    }
}

/// Shader features that must be enabled at device creation before a shader may use them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShaderFeatures {
    /// `shaderFloat16`: f16 arithmetic.
    pub shader_float16: bool,
    /// `shaderInt8`: i8 arithmetic.
    pub shader_int8: bool,
    /// `shaderInt16`.
    pub shader_int16: bool,
    /// `shaderInt64`.
    pub shader_int64: bool,
    /// `storageBuffer16BitAccess`: f16/i16 in storage buffers.
    pub storage_buffer_16bit: bool,
    /// `storageBuffer8BitAccess`: i8 in storage buffers (quantised weights).
    pub storage_buffer_8bit: bool,
    /// `shaderBufferFloat32AtomicAdd` (`VK_EXT_shader_atomic_float`): float atomicAdd on
    /// storage buffers (the chained matvec kernel accumulates with it).
    pub buffer_float32_atomic_add: bool,
    /// `shaderBufferInt64Atomics` (Vulkan 1.2): 64-bit atomics on storage buffers (the matvec
    /// computing the logits picks the next token with a 64-bit atomicMax).
    pub buffer_int64_atomics: bool,
    /// `pipelineExecutableInfo` (`VK_KHR_pipeline_executable_properties`): the driver's
    /// statistics of a compiled pipeline (registers per invocation on NVIDIA), for `vkfuse
    /// kernels`. Not a shader feature, but enabled and reported the same way.
    pub pipeline_executable_info: bool,
    /// `shaderDeviceClock` (`VK_KHR_shader_clock`): a clock shaders read that is comparable
    /// across the device's compute units (the timeline probe, `compile-model --timeline`).
    pub shader_device_clock: bool,
    /// `bufferDeviceAddress` (Vulkan 1.2): buffers reached by address (the timeline probe's
    /// records, addressed without a binding).
    pub buffer_device_address: bool,
    /// `hostQueryReset` (Vulkan 1.2): timestamp pools reset by the host between submissions
    /// instead of in the command buffer (replay's chains: a reset recorded at the start of each
    /// cost the H100 0.4-1% of its tokens per second). Not a shader feature either.
    pub host_query_reset: bool,
    /// `shaderIntegerDotProduct` (Vulkan 1.3, `VK_KHR_shader_integer_dot_product`): dot
    /// products of packed 8-bit integers (the chained MLP's int8 dots, `compile-model --dots`).
    pub integer_dot_product: bool,
    /// `pipelineRobustness` (`VK_EXT_pipeline_robustness`): a pipeline may ask for its buffer
    /// accesses unchecked (NVIDIA's driver checks every storage-buffer access against its
    /// binding's range otherwise, robustBufferAccess enabled or not). Not a shader feature.
    pub pipeline_robustness: bool,
    /// `shaderSMBuiltins` (`VK_NV_shader_sm_builtins`): the SM a shader runs on (the timeline
    /// probe's `compile-model --timeline-sm`).
    pub shader_sm_builtins: bool,
}

/// A capability a caller can require of a device (see [`Requirements`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Feature {
    /// 16-bit types in storage buffers (`storageBuffer16BitAccess`).
    StorageBuffer16Bit,
    /// 8-bit types in storage buffers (`storageBuffer8BitAccess`).
    StorageBuffer8Bit,
    /// f16 arithmetic (`shaderFloat16`).
    ShaderFloat16,
    /// i8 arithmetic (`shaderInt8`).
    ShaderInt8,
    /// i16 arithmetic (`shaderInt16`).
    ShaderInt16,
    /// i64 arithmetic (`shaderInt64`).
    ShaderInt64,
    /// Basic subgroup operations in compute shaders.
    SubgroupBasic,
    /// Subgroup arithmetic (`subgroupAdd`, `subgroupMax`...) in compute shaders.
    SubgroupArithmetic,
    /// Subgroup shuffles in compute shaders.
    SubgroupShuffle,
    /// Subgroup ballots in compute shaders.
    SubgroupBallot,
    /// Timestamp queries on the compute queue.
    Timestamps,
    /// Float atomicAdd on storage buffers (`shaderBufferFloat32AtomicAdd`).
    BufferFloat32AtomicAdd,
    /// 64-bit integer atomics on storage buffers (`shaderBufferInt64Atomics`).
    BufferInt64Atomics,
    /// Dot products of packed 8-bit integers (`shaderIntegerDotProduct`).
    IntegerDotProduct,
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Feature::StorageBuffer16Bit => "16-bit storage buffers (storageBuffer16BitAccess)",
            Feature::StorageBuffer8Bit => "8-bit storage buffers (storageBuffer8BitAccess)",
            Feature::ShaderFloat16 => "f16 arithmetic (shaderFloat16)",
            Feature::ShaderInt8 => "i8 arithmetic (shaderInt8)",
            Feature::ShaderInt16 => "i16 arithmetic (shaderInt16)",
            Feature::ShaderInt64 => "i64 arithmetic (shaderInt64)",
            Feature::SubgroupBasic => "subgroup basic operations in compute",
            Feature::SubgroupArithmetic => "subgroup arithmetic in compute",
            Feature::SubgroupShuffle => "subgroup shuffle in compute",
            Feature::SubgroupBallot => "subgroup ballot in compute",
            Feature::Timestamps => "timestamp queries on the compute queue",
            Feature::BufferFloat32AtomicAdd => {
                "float atomic add on storage buffers (shaderBufferFloat32AtomicAdd, VK_EXT_shader_atomic_float)"
            }
            Feature::BufferInt64Atomics => {
                "64-bit integer atomics on storage buffers (shaderInt64 and shaderBufferInt64Atomics)"
            }
            Feature::IntegerDotProduct => {
                "packed 8-bit integer dot products (shaderIntegerDotProduct, VK_KHR_shader_integer_dot_product)"
            }
        })
    }
}

/// What a caller needs of a device; checked by [`crate::Device::new`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Requirements {
    /// Capabilities that must be present.
    pub features: Vec<Feature>,
}

impl Requirements {
    /// Nothing beyond Vulkan 1.1 compute.
    pub fn none() -> Self {
        Self::default()
    }

    /// What every vkfuse kernel needs: they reduce with subgroup arithmetic
    /// (kernels/glsl/reduce.glsl), so a device without it is refused by name when it opens
    /// rather than by the validation layer or the driver.
    pub fn kernels() -> Self {
        Self::new(&[Feature::SubgroupBasic, Feature::SubgroupArithmetic])
    }

    /// These capabilities.
    pub fn new(features: &[Feature]) -> Self {
        Self {
            features: features.to_vec(),
        }
    }

    /// Adds one capability.
    pub fn with(mut self, feature: Feature) -> Self {
        if !self.features.contains(&feature) {
            self.features.push(feature);
        }
        self
    }
}

/// What vkfuse needs to know about a physical device.
#[derive(Clone, Debug, PartialEq)]
pub struct AdapterInfo {
    /// The device name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Discrete, integrated, virtual, CPU.
    pub device_type: DeviceType,
    /// PCI vendor id.
    pub vendor_id: u32,
    /// PCI device id.
    pub device_id: u32,
    /// The Vulkan version the device supports.
    pub api_version: Version,
    /// The driver's own packed version number (vendor specific).
    pub driver_version: u32,
    /// `pipelineCacheUUID`: pipeline cache data is only valid for a device and driver with
    /// the same UUID (Vulkan's own cache header check).
    pub pipeline_cache_uuid: [u8; 16],
    /// The driver's name (`VkPhysicalDeviceDriverProperties`, Vulkan 1.2+; else empty).
    pub driver_name: String,
    /// The driver's version text (Vulkan 1.2+; else empty).
    pub driver_info: String,
    /// `maxComputeWorkGroupSize`.
    pub max_workgroup_size: [u32; 3],
    /// `maxComputeWorkGroupInvocations`.
    pub max_workgroup_invocations: u32,
    /// `maxComputeWorkGroupCount`.
    pub max_workgroup_count: [u32; 3],
    /// `maxComputeSharedMemorySize` in bytes.
    pub max_shared_memory_bytes: u32,
    /// The default subgroup size.
    pub subgroup_size: u32,
    /// Subgroup operations available in compute shaders.
    pub subgroup_ops: SubgroupOps,
    /// Nanoseconds per timestamp tick.
    pub timestamp_period_ns: f32,
    /// `timestampValidBits` of the compute queue family; 0 = no timestamps there.
    pub timestamp_valid_bits: u32,
    /// The queue family vkfuse would use for compute, if any.
    pub compute_queue_family: Option<u32>,
    /// `minStorageBufferOffsetAlignment` in bytes.
    pub min_storage_buffer_offset_alignment: u64,
    /// `maxStorageBufferRange` in bytes: the largest range one binding may cover.
    pub max_storage_buffer_range: u32,
    /// `maxPushConstantsSize` in bytes.
    pub max_push_constants_size: u32,
    /// `maxMemoryAllocationSize` in bytes: the largest single allocation (so the largest buffer).
    pub max_memory_allocation_size: u64,
    /// `maxBufferSize` in bytes (Vulkan 1.3; `u64::MAX` where the device does not say).
    pub max_buffer_size: u64,
    /// The size of the largest device-local memory heap in bytes.
    pub device_local_bytes: u64,
    /// Shader features the device supports.
    pub features: ShaderFeatures,
    /// Streaming multiprocessors / compute units, where the driver says
    /// (`VK_NV_shader_sm_builtins`, `VK_AMD_shader_core_properties`): how many workgroups a
    /// persistent region can keep resident at once (one per unit).
    pub compute_units: Option<u32>,
    /// `maxPerStageDescriptorStorageBuffers`.
    pub max_storage_buffers_per_stage: u32,
}

impl AdapterInfo {
    /// Whether the compute queue can write timestamps.
    pub fn timestamps(&self) -> bool {
        self.timestamp_valid_bits > 0
    }

    /// Whether the device offers `feature`.
    pub fn supports(&self, feature: Feature) -> bool {
        let s = &self.features;
        let g = &self.subgroup_ops;
        match feature {
            Feature::StorageBuffer16Bit => s.storage_buffer_16bit,
            Feature::StorageBuffer8Bit => s.storage_buffer_8bit,
            Feature::ShaderFloat16 => s.shader_float16,
            Feature::ShaderInt8 => s.shader_int8,
            Feature::ShaderInt16 => s.shader_int16,
            Feature::ShaderInt64 => s.shader_int64,
            Feature::SubgroupBasic => g.basic,
            Feature::SubgroupArithmetic => g.arithmetic,
            Feature::SubgroupShuffle => g.shuffle,
            Feature::SubgroupBallot => g.ballot,
            Feature::Timestamps => self.timestamps(),
            Feature::BufferFloat32AtomicAdd => s.buffer_float32_atomic_add,
            Feature::BufferInt64Atomics => s.shader_int64 && s.buffer_int64_atomics,
            Feature::IntegerDotProduct => s.integer_dot_product,
        }
    }

    /// The required capabilities this device lacks.
    pub fn missing(&self, requirements: &Requirements) -> Vec<Feature> {
        requirements
            .features
            .iter()
            .copied()
            .filter(|f| !self.supports(*f))
            .collect()
    }

    /// `Ok` when the device can be used with `requirements`; otherwise an error naming the
    /// device and everything it lacks.
    pub fn check(&self, requirements: &Requirements) -> Result<()> {
        if self.api_version < Version(vk::API_VERSION_1_1) {
            return Err(Error::UnsupportedDevice {
                device: self.name.clone(),
                reason: format!("it offers Vulkan {}; vkfuse needs 1.1", self.api_version),
            });
        }
        if self.compute_queue_family.is_none() {
            return Err(Error::UnsupportedDevice {
                device: self.name.clone(),
                reason: "it has no compute queue".into(),
            });
        }
        let missing = self.missing(requirements);
        if missing.is_empty() {
            return Ok(());
        }
        Err(Error::MissingCapabilities {
            device: self.name.clone(),
            missing: missing
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    /// `Ok` when `bytes` fit the largest device-local heap, else
    /// "model needs X GiB, device has Y GiB". Other allocations (scratch, the driver's own)
    /// need room too, so treat `Ok` as necessary, not sufficient.
    pub fn check_fits(&self, bytes: u64) -> Result<()> {
        if bytes <= self.device_local_bytes {
            Ok(())
        } else {
            Err(Error::ModelTooLarge {
                needed: bytes,
                available: self.device_local_bytes,
                device: self.name.clone(),
            })
        }
    }

    /// One line: name, type, Vulkan version.
    pub fn summary(&self) -> String {
        format!(
            "{} ({}, Vulkan {})",
            self.name, self.device_type, self.api_version
        )
    }
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn human_bytes(b: u64) -> String {
    const K: u64 = 1024;
    if b >= K * K * K {
        format!("{:.1} GiB", b as f64 / (K * K * K) as f64)
    } else if b >= K * K {
        format!("{:.1} MiB", b as f64 / (K * K) as f64)
    } else if b >= K {
        format!("{:.1} KiB", b as f64 / K as f64)
    } else {
        format!("{b} B")
    }
}

impl fmt::Display for AdapterInfo {
    /// The multi-line block `vkfuse devices` prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.summary())?;
        let driver = if self.driver_name.is_empty() {
            format!("version {:#x}", self.driver_version)
        } else {
            format!("{} {}", self.driver_name, self.driver_info)
        };
        writeln!(
            f,
            "    driver:     {driver} (vendor {:#06x}, device {:#06x})",
            self.vendor_id, self.device_id
        )?;
        let [x, y, z] = self.max_workgroup_size;
        writeln!(
            f,
            "    compute:    workgroup <= {} invocations, size {x}x{y}x{z}, shared memory {}",
            self.max_workgroup_invocations,
            human_bytes(self.max_shared_memory_bytes.into())
        )?;
        writeln!(
            f,
            "    subgroups:  size {}, ops: {}",
            self.subgroup_size, self.subgroup_ops
        )?;
        if let Some(units) = self.compute_units {
            writeln!(f, "    units:      {units} compute units (SMs / CUs)")?;
        }
        writeln!(
            f,
            "    memory:     device-local {}, max allocation {}, storage range {}, \
             storage offset alignment {} B, push constants {} B",
            human_bytes(self.device_local_bytes),
            human_bytes(self.max_memory_allocation_size),
            human_bytes(self.max_storage_buffer_range.into()),
            self.min_storage_buffer_offset_alignment,
            self.max_push_constants_size
        )?;
        if self.timestamps() {
            writeln!(
                f,
                "    timestamps: yes, {} ns per tick, {} valid bits",
                self.timestamp_period_ns, self.timestamp_valid_bits
            )?;
        } else {
            writeln!(f, "    timestamps: no (on the compute queue)")?;
        }
        let s = &self.features;
        write!(
            f,
            "    features:   f16 {}, int8 {}, int16 {}, int64 {}, 16-bit storage {}, 8-bit storage {}, float atomic add {}, int64 atomics {}, pipeline statistics {}, device clock {}, buffer addresses {}, host query reset {}, int8 dot products {}, pipeline robustness {}, SM ids {}",
            yes(s.shader_float16),
            yes(s.shader_int8),
            yes(s.shader_int16),
            yes(s.shader_int64),
            yes(s.storage_buffer_16bit),
            yes(s.storage_buffer_8bit),
            yes(s.buffer_float32_atomic_add),
            yes(s.buffer_int64_atomics),
            yes(s.pipeline_executable_info),
            yes(s.shader_device_clock),
            yes(s.buffer_device_address),
            yes(s.host_query_reset),
            yes(s.integer_dot_product),
            yes(s.pipeline_robustness),
            yes(s.shader_sm_builtins)
        )
    }
}

/// A physical device of an [`Instance`](crate::Instance), with its [`AdapterInfo`].
#[derive(Clone)]
pub struct Adapter {
    pub(crate) instance: Arc<InstanceShared>,
    pub(crate) raw: vk::PhysicalDevice,
    index: usize,
    info: AdapterInfo,
}

impl fmt::Debug for Adapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Adapter")
            .field("index", &self.index)
            .field("name", &self.info.name)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for Adapter {
    /// `[index] ` and the info block.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.index, self.info)
    }
}

impl Adapter {
    /// Its position in [`Instance::adapters`](crate::Instance::adapters).
    pub fn index(&self) -> usize {
        self.index
    }

    /// What the device can do.
    pub fn info(&self) -> &AdapterInfo {
        &self.info
    }

    /// The `ash` handle.
    pub fn raw(&self) -> vk::PhysicalDevice {
        self.raw
    }

    pub(crate) fn query(
        instance: &Arc<InstanceShared>,
        raw: vk::PhysicalDevice,
        index: usize,
    ) -> Self {
        Adapter {
            instance: Arc::clone(instance),
            raw,
            index,
            info: query_info(&instance.raw, instance.api_version, raw),
        }
    }
}

/// The compute queue family vkfuse uses: one with timestamps first, then one without graphics
/// (a dedicated compute queue, as ggml-vulkan prefers), then the lowest index.
pub(crate) fn pick_compute_family(families: &[vk::QueueFamilyProperties]) -> Option<u32> {
    families
        .iter()
        .enumerate()
        .filter(|(_, f)| f.queue_flags.contains(vk::QueueFlags::COMPUTE) && f.queue_count > 0)
        .max_by_key(|(i, f)| {
            (
                f.timestamp_valid_bits > 0,
                !f.queue_flags.contains(vk::QueueFlags::GRAPHICS),
                std::cmp::Reverse(*i),
            )
        })
        .and_then(|(i, _)| u32::try_from(i).ok())
}

/// What the device `pd` offers; `instance_api` is the version the instance was created at.
fn query_info(instance: &ash::Instance, instance_api: u32, pd: vk::PhysicalDevice) -> AdapterInfo {
    // SAFETY: `pd` was enumerated from this live instance.
    let props = unsafe { instance.get_physical_device_properties(pd) };
    let v1_1 = props.api_version >= vk::API_VERSION_1_1;
    let v1_2 = props.api_version >= vk::API_VERSION_1_2;
    let v1_3 = props.api_version >= vk::API_VERSION_1_3;

    // Version-gated chains: a struct from a newer core version than the device's must not be
    // chained (the 1.2 structs are used one by one, not VkPhysicalDeviceVulkan12*, so the same
    // code serves 1.1 devices).
    let mut subgroup = vk::PhysicalDeviceSubgroupProperties::default();
    let mut maint3 = vk::PhysicalDeviceMaintenance3Properties::default();
    let mut driver = vk::PhysicalDeviceDriverProperties::default();
    let mut maint4 = vk::PhysicalDeviceMaintenance4Properties::default().max_buffer_size(u64::MAX);
    // Extension structs may only be chained where the device offers the extension.
    // SAFETY: `pd` was enumerated from this live instance.
    let extensions =
        unsafe { instance.enumerate_device_extension_properties(pd) }.unwrap_or_default();
    let offers = |name: &std::ffi::CStr| {
        extensions
            .iter()
            .any(|e| e.extension_name_as_c_str() == Ok(name))
    };
    let mut sm = vk::PhysicalDeviceShaderSMBuiltinsPropertiesNV::default();
    let mut amd = vk::PhysicalDeviceShaderCorePropertiesAMD::default();
    let has_sm = offers(ash::nv::shader_sm_builtins::NAME);
    let has_amd = offers(ash::amd::shader_core_properties::NAME);
    if v1_1 {
        let mut props2 = vk::PhysicalDeviceProperties2::default()
            .push_next(&mut subgroup)
            .push_next(&mut maint3);
        if v1_2 {
            props2 = props2.push_next(&mut driver);
        }
        if v1_3 {
            props2 = props2.push_next(&mut maint4);
        }
        if has_sm {
            props2 = props2.push_next(&mut sm);
        }
        if has_amd {
            props2 = props2.push_next(&mut amd);
        }
        // SAFETY: the chain holds only structs of the device's core version.
        unsafe { instance.get_physical_device_properties2(pd, &mut props2) };
    }

    let mut storage16 = vk::PhysicalDevice16BitStorageFeatures::default();
    let mut storage8 = vk::PhysicalDevice8BitStorageFeatures::default();
    let mut f16i8 = vk::PhysicalDeviceShaderFloat16Int8Features::default();
    let mut atomic_float = vk::PhysicalDeviceShaderAtomicFloatFeaturesEXT::default();
    let mut atomic_int64 = vk::PhysicalDeviceShaderAtomicInt64Features::default();
    let has_atomic_float = offers(ash::ext::shader_atomic_float::NAME);
    let mut executables = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
    let has_executables = offers(ash::khr::pipeline_executable_properties::NAME);
    let mut clock = vk::PhysicalDeviceShaderClockFeaturesKHR::default();
    let has_clock = offers(ash::khr::shader_clock::NAME);
    let mut addresses = vk::PhysicalDeviceBufferDeviceAddressFeatures::default();
    let mut host_reset = vk::PhysicalDeviceHostQueryResetFeatures::default();
    let mut int_dot = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default();
    let mut robustness = vk::PhysicalDevicePipelineRobustnessFeaturesEXT::default();
    let has_robustness = offers(ash::ext::pipeline_robustness::NAME);
    let mut sm_builtins = vk::PhysicalDeviceShaderSMBuiltinsFeaturesNV::default();
    // Core where both the device and the instance are 1.3; below that, the extension (which
    // the device then enables).
    let has_int_dot = (v1_3 && instance_api >= vk::API_VERSION_1_3)
        || offers(ash::khr::shader_integer_dot_product::NAME);
    let core = if v1_1 {
        let mut features2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut storage16);
        if v1_2 {
            features2 = features2
                .push_next(&mut storage8)
                .push_next(&mut f16i8)
                .push_next(&mut atomic_int64)
                .push_next(&mut addresses)
                .push_next(&mut host_reset);
        }
        if has_atomic_float {
            features2 = features2.push_next(&mut atomic_float);
        }
        if has_executables {
            features2 = features2.push_next(&mut executables);
        }
        if has_clock {
            features2 = features2.push_next(&mut clock);
        }
        if has_int_dot {
            features2 = features2.push_next(&mut int_dot);
        }
        if has_robustness {
            features2 = features2.push_next(&mut robustness);
        }
        if has_sm {
            features2 = features2.push_next(&mut sm_builtins);
        }
        // SAFETY: as above.
        unsafe { instance.get_physical_device_features2(pd, &mut features2) };
        features2.features
    } else {
        // SAFETY: `pd` belongs to this instance.
        unsafe { instance.get_physical_device_features(pd) }
    };

    // SAFETY: as above.
    let families = unsafe { instance.get_physical_device_queue_family_properties(pd) };
    let compute_queue_family = pick_compute_family(&families);
    let timestamp_valid_bits = compute_queue_family
        .and_then(|i| families.get(i as usize))
        .map_or(0, |f| f.timestamp_valid_bits);

    // SAFETY: as above.
    let memory = unsafe { instance.get_physical_device_memory_properties(pd) };
    let heaps = &memory.memory_heaps[..memory.memory_heap_count as usize];
    let device_local_bytes = heaps
        .iter()
        .filter(|h| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
        .map(|h| h.size)
        .max()
        .unwrap_or(0);

    let compute_units = if v1_1 && has_sm && sm.shader_sm_count > 0 {
        Some(sm.shader_sm_count)
    } else if v1_1 && has_amd && amd.compute_units_per_shader_array > 0 {
        Some(
            amd.shader_engine_count
                * amd.shader_arrays_per_engine_count
                * amd.compute_units_per_shader_array,
        )
    } else {
        None
    };
    let compute_subgroups = subgroup
        .supported_stages
        .contains(vk::ShaderStageFlags::COMPUTE);
    let text = |r: std::result::Result<&std::ffi::CStr, _>| {
        r.map(|s: &std::ffi::CStr| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let limits = &props.limits;
    AdapterInfo {
        name: text(props.device_name_as_c_str()),
        device_type: DeviceType::from_vk(props.device_type),
        vendor_id: props.vendor_id,
        device_id: props.device_id,
        api_version: Version(props.api_version),
        driver_version: props.driver_version,
        pipeline_cache_uuid: props.pipeline_cache_uuid,
        driver_name: text(driver.driver_name_as_c_str()),
        driver_info: text(driver.driver_info_as_c_str()),
        max_workgroup_size: limits.max_compute_work_group_size,
        max_workgroup_invocations: limits.max_compute_work_group_invocations,
        max_workgroup_count: limits.max_compute_work_group_count,
        max_shared_memory_bytes: limits.max_compute_shared_memory_size,
        subgroup_size: subgroup.subgroup_size,
        subgroup_ops: if compute_subgroups {
            SubgroupOps::from_vk(subgroup.supported_operations)
        } else {
            SubgroupOps::default()
        },
        timestamp_period_ns: limits.timestamp_period,
        timestamp_valid_bits,
        compute_queue_family,
        min_storage_buffer_offset_alignment: limits.min_storage_buffer_offset_alignment,
        max_storage_buffer_range: limits.max_storage_buffer_range,
        max_push_constants_size: limits.max_push_constants_size,
        max_memory_allocation_size: maint3.max_memory_allocation_size,
        max_buffer_size: maint4.max_buffer_size,
        device_local_bytes,
        features: ShaderFeatures {
            shader_float16: f16i8.shader_float16 == vk::TRUE,
            shader_int8: f16i8.shader_int8 == vk::TRUE,
            shader_int16: core.shader_int16 == vk::TRUE,
            shader_int64: core.shader_int64 == vk::TRUE,
            storage_buffer_16bit: storage16.storage_buffer16_bit_access == vk::TRUE,
            storage_buffer_8bit: storage8.storage_buffer8_bit_access == vk::TRUE,
            buffer_float32_atomic_add: atomic_float.shader_buffer_float32_atomic_add == vk::TRUE,
            buffer_int64_atomics: atomic_int64.shader_buffer_int64_atomics == vk::TRUE,
            pipeline_executable_info: executables.pipeline_executable_info == vk::TRUE,
            shader_device_clock: clock.shader_device_clock == vk::TRUE,
            buffer_device_address: addresses.buffer_device_address == vk::TRUE,
            host_query_reset: host_reset.host_query_reset == vk::TRUE,
            integer_dot_product: has_int_dot && int_dot.shader_integer_dot_product == vk::TRUE,
            pipeline_robustness: robustness.pipeline_robustness == vk::TRUE,
            shader_sm_builtins: sm_builtins.shader_sm_builtins == vk::TRUE,
        },
        compute_units,
        max_storage_buffers_per_stage: limits.max_per_stage_descriptor_storage_buffers,
    }
}

fn listing(infos: &[AdapterInfo]) -> String {
    infos
        .iter()
        .enumerate()
        .map(|(i, info)| format!("  [{i}] {}", info.summary()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A device asked for by the caller (the CLI's `--device`): its index in the instance's list
/// (`vkfuse devices`), or a case-insensitive part of its name, as `VKFUSE_DEVICE` takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The device's index in the instance's list.
    Index(usize),
    /// A case-insensitive part of the device's name; the first that holds it.
    Name(String),
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;

    /// A number is an index; any other text part of a name (empty text is neither).
    fn from_str(text: &str) -> std::result::Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("give a device index or part of a device name".into());
        }
        Ok(match text.parse::<usize>() {
            Ok(index) => DeviceChoice::Index(index),
            Err(_) => DeviceChoice::Name(text.to_string()),
        })
    }
}

/// Chooses among `infos`: `explicit` (the caller's, named `--device` in errors), else `env`
/// (`VKFUSE_DEVICE`: an index, or a case-insensitive part of a name), else by type: discrete,
/// integrated, virtual, CPU.
pub(crate) fn pick(
    infos: &[AdapterInfo],
    explicit: Option<&DeviceChoice>,
    env: Option<&str>,
) -> Result<usize> {
    if infos.is_empty() {
        return Err(Error::NoDevice);
    }
    let by_index = |index: usize, source: &str| {
        if index < infos.len() {
            Ok(index)
        } else {
            Err(Error::AdapterIndex {
                source_of_choice: source.to_string(),
                index,
                count: infos.len(),
                list: listing(infos),
            })
        }
    };
    let by_name = |value: &str, source: &str| {
        let needle = value.to_lowercase();
        infos
            .iter()
            .position(|i| i.name.to_lowercase().contains(&needle))
            .ok_or_else(|| Error::AdapterName {
                source_of_choice: source.to_string(),
                value: value.to_string(),
                list: listing(infos),
            })
    };
    // An explicit choice is the CLI's `--device` (embedders pass `SessionOptions::device`);
    // the variable, parsed the same way (empty: unset), names itself.
    let from_env = env.and_then(|v| v.parse::<DeviceChoice>().ok());
    match (explicit, &from_env) {
        (Some(DeviceChoice::Index(index)), _) => return by_index(*index, "--device"),
        (Some(DeviceChoice::Name(name)), _) => return by_name(name, "--device"),
        (None, Some(DeviceChoice::Index(index))) => {
            return by_index(*index, &format!("VKFUSE_DEVICE={index}"))
        }
        (None, Some(DeviceChoice::Name(name))) => return by_name(name, "VKFUSE_DEVICE"),
        (None, None) => {}
    }
    // `min_by_key` keeps the first of equals: the driver's order breaks ties.
    infos
        .iter()
        .enumerate()
        .min_by_key(|(_, i)| i.device_type)
        .map(|(index, _)| index)
        .ok_or(Error::NoDevice)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn fake(name: &str, device_type: DeviceType) -> AdapterInfo {
        AdapterInfo {
            name: name.into(),
            device_type,
            vendor_id: 0,
            device_id: 0,
            api_version: Version(vk::API_VERSION_1_3),
            driver_version: 0,
            pipeline_cache_uuid: [0; 16],
            driver_name: String::new(),
            driver_info: String::new(),
            max_workgroup_size: [1024, 1024, 64],
            max_workgroup_invocations: 1024,
            max_workgroup_count: [65535; 3],
            max_shared_memory_bytes: 49152,
            subgroup_size: 32,
            subgroup_ops: SubgroupOps::default(),
            timestamp_period_ns: 1.0,
            timestamp_valid_bits: 0,
            compute_queue_family: Some(0),
            min_storage_buffer_offset_alignment: 16,
            max_storage_buffer_range: u32::MAX,
            max_push_constants_size: 256,
            max_memory_allocation_size: 1 << 32,
            max_buffer_size: u64::MAX,
            device_local_bytes: 1 << 30,
            features: ShaderFeatures::default(),
            compute_units: None,
            max_storage_buffers_per_stage: 1 << 20,
        }
    }

    #[test]
    fn prefers_discrete_then_integrated_then_virtual_then_cpu() {
        let infos = [
            fake("cpu", DeviceType::Cpu),
            fake("igpu", DeviceType::Integrated),
            fake("dgpu", DeviceType::Discrete),
        ];
        assert_eq!(pick(&infos, None, None).ok(), Some(2));
        assert_eq!(pick(&infos[..2], None, None).ok(), Some(1));
        let infos = [
            fake("cpu", DeviceType::Cpu),
            fake("vm", DeviceType::Virtual),
        ];
        assert_eq!(pick(&infos, None, None).ok(), Some(1));
    }

    #[test]
    fn explicit_index_beats_env_and_type() {
        let infos = [
            fake("cpu", DeviceType::Cpu),
            fake("dgpu", DeviceType::Discrete),
        ];
        assert_eq!(
            pick(&infos, Some(&DeviceChoice::Index(0)), Some("1")).ok(),
            Some(0)
        );
        let name = DeviceChoice::Name("CPU".into());
        assert_eq!(pick(&infos, Some(&name), Some("1")).ok(), Some(0));
    }

    #[test]
    fn explicit_choice_parses_an_index_or_a_name() {
        let infos = [
            fake("llvmpipe", DeviceType::Cpu),
            fake("NVIDIA H100", DeviceType::Discrete),
        ];
        let choose = |text: &str| pick(&infos, Some(&text.parse().unwrap()), None);
        assert_eq!(choose("0").ok(), Some(0));
        assert_eq!(choose(" h100 ").ok(), Some(1));
        let err = choose("radeon").unwrap_err().to_string();
        assert!(
            err.starts_with("--device=\"radeon\" matches no device"),
            "{err}"
        );
        assert!(err.contains("llvmpipe"), "{err}");
        assert!("  ".parse::<DeviceChoice>().is_err());
    }

    #[test]
    fn env_selects_by_index_or_name() {
        let infos = [
            fake("llvmpipe", DeviceType::Cpu),
            fake("NVIDIA H100", DeviceType::Discrete),
        ];
        assert_eq!(pick(&infos, None, Some("0")).ok(), Some(0));
        assert_eq!(pick(&infos, None, Some("h100")).ok(), Some(1));
        assert_eq!(pick(&infos, None, Some("  ")).ok(), Some(1));
        let err = pick(&infos, None, Some("radeon")).unwrap_err().to_string();
        assert!(
            err.contains("VKFUSE_DEVICE=\"radeon\"") && err.contains("llvmpipe"),
            "{err}"
        );
    }

    #[test]
    fn index_out_of_range_names_the_count_and_lists_devices() {
        let infos = [fake("llvmpipe", DeviceType::Cpu)];
        let err = pick(&infos, Some(&DeviceChoice::Index(3)), None).unwrap_err();
        assert!(matches!(
            err,
            Error::AdapterIndex {
                index: 3,
                count: 1,
                ..
            }
        ));
        let msg = err.to_string();
        assert!(
            msg.contains("--device asks for device 3, but there are 1 device(s)")
                && msg.contains("[0] llvmpipe"),
            "{msg}"
        );
        let msg = pick(&infos, None, Some("7")).unwrap_err().to_string();
        assert!(msg.contains("VKFUSE_DEVICE=7"), "{msg}");
    }

    #[test]
    fn no_devices_is_no_device() {
        assert!(matches!(pick(&[], None, None), Err(Error::NoDevice)));
    }

    #[test]
    fn missing_capabilities_are_named_with_the_device() {
        let mut info = fake("tiny gpu", DeviceType::Discrete);
        info.features.storage_buffer_16bit = true;
        let req = Requirements::new(&[Feature::StorageBuffer16Bit, Feature::ShaderFloat16])
            .with(Feature::SubgroupArithmetic)
            .with(Feature::Timestamps);
        assert_eq!(
            info.missing(&req),
            vec![
                Feature::ShaderFloat16,
                Feature::SubgroupArithmetic,
                Feature::Timestamps
            ]
        );
        let msg = info.check(&req).unwrap_err().to_string();
        assert!(
            msg.contains("tiny gpu") && msg.contains("shaderFloat16"),
            "{msg}"
        );
        assert!(
            msg.contains("subgroup arithmetic") && msg.contains("timestamp"),
            "{msg}"
        );
        assert!(info
            .check(&Requirements::new(&[Feature::StorageBuffer16Bit]))
            .is_ok());
    }

    #[test]
    fn model_fit_check_compares_with_device_local_memory() {
        let info = fake("small", DeviceType::Discrete);
        assert!(info.check_fits(1 << 30).is_ok());
        let msg = info.check_fits(3 << 30).unwrap_err().to_string();
        assert_eq!(
            msg,
            "model needs 3.00 GiB, device \"small\" has 1.00 GiB of device-local memory"
        );
    }

    #[test]
    fn compute_family_prefers_timestamps_then_dedicated_compute() {
        let fam = |flags, ts| vk::QueueFamilyProperties {
            queue_flags: flags,
            queue_count: 1,
            timestamp_valid_bits: ts,
            ..Default::default()
        };
        let gfx = vk::QueueFlags::GRAPHICS | vk::QueueFlags::COMPUTE;
        let comp = vk::QueueFlags::COMPUTE;
        let xfer = vk::QueueFlags::TRANSFER;
        assert_eq!(pick_compute_family(&[fam(gfx, 64), fam(comp, 64)]), Some(1));
        assert_eq!(pick_compute_family(&[fam(gfx, 64), fam(comp, 0)]), Some(0));
        assert_eq!(pick_compute_family(&[fam(xfer, 64)]), None);
    }

    #[test]
    fn display_lists_the_key_limits() {
        let text = fake("llvmpipe", DeviceType::Cpu).to_string();
        for needle in [
            "llvmpipe (CPU, Vulkan 1.3.0)",
            "subgroups:  size 32",
            "timestamps: no",
            "f16 no",
        ] {
            assert!(text.contains(needle), "{needle:?} not in\n{text}");
        }
    }
}
