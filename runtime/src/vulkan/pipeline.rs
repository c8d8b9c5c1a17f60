//! Compute pipelines from SPIR-V: specialization constants, the layout (one descriptor set of N
//! storage buffers plus a push-constant range) and the optional pipeline cache.

use std::ffi::CString;
use std::fmt;
use std::sync::Arc;

use ash::vk;

use super::device::{Device, DeviceShared};
use super::handoff::{HandoffRole, HANDOFF_PUSH_BYTES};
use crate::error::{vk_err, Error, Result};

/// The first word of every SPIR-V module.
const SPIRV_MAGIC: u32 = 0x0723_0203;

/// Specialization constants by `constant_id`, each 4 bytes (u32, i32, f32 or bool).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecConstants {
    entries: Vec<(u32, [u8; 4])>,
}

impl SpecConstants {
    /// No constants: the shader's defaults apply.
    pub fn new() -> Self {
        Self::default()
    }

    fn set(mut self, id: u32, bytes: [u8; 4]) -> Self {
        match self.entries.iter_mut().find(|(i, _)| *i == id) {
            Some(entry) => entry.1 = bytes,
            None => self.entries.push((id, bytes)),
        }
        self
    }

    /// `layout(constant_id = id) const uint`; also `local_size_x_id` and friends.
    pub fn u32(self, id: u32, value: u32) -> Self {
        self.set(id, value.to_ne_bytes())
    }

    /// `layout(constant_id = id) const int`.
    pub fn i32(self, id: u32, value: i32) -> Self {
        self.set(id, value.to_ne_bytes())
    }

    /// `layout(constant_id = id) const float`.
    pub fn f32(self, id: u32, value: f32) -> Self {
        self.set(id, value.to_ne_bytes())
    }

    /// `layout(constant_id = id) const bool` (a 32-bit `VkBool32`).
    pub fn bool(self, id: u32, value: bool) -> Self {
        self.set(id, u32::from(value).to_ne_bytes())
    }

    /// Whether no constant is set.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The 4 bytes of constant `id` as a `u32`, if set.
    pub fn get_u32(&self, id: u32) -> Option<u32> {
        self.entries
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, b)| u32::from_ne_bytes(*b))
    }

    fn map_and_data(&self) -> (Vec<vk::SpecializationMapEntry>, Vec<u8>) {
        let mut map = Vec::with_capacity(self.entries.len());
        let mut data = Vec::with_capacity(4 * self.entries.len());
        for (id, bytes) in &self.entries {
            map.push(
                vk::SpecializationMapEntry::default()
                    .constant_id(*id)
                    .offset(data.len() as u32)
                    .size(4),
            );
            data.extend_from_slice(bytes);
        }
        (map, data)
    }
}

/// SPIR-V words from a `.spv` file's bytes (checks length and magic number).
pub fn spirv_from_bytes(bytes: &[u8]) -> Result<Vec<u32>> {
    if bytes.len() % 4 != 0 {
        return Err(Error::InvalidSpirv(format!(
            "{} bytes is not a whole number of 32-bit words",
            bytes.len()
        )));
    }
    let words: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    check_spirv(&words)?;
    Ok(words)
}

fn check_spirv(words: &[u32]) -> Result<()> {
    match words.first() {
        // Five words of header come before any instruction.
        _ if words.len() < 5 => Err(Error::InvalidSpirv(format!(
            "{} words is shorter than the SPIR-V header",
            words.len()
        ))),
        Some(&SPIRV_MAGIC) => Ok(()),
        Some(&w) if w == SPIRV_MAGIC.swap_bytes() => Err(Error::InvalidSpirv(
            "the module is byte-swapped (big-endian words)".into(),
        )),
        Some(&w) => Err(Error::InvalidSpirv(format!("bad magic number {w:#010x}"))),
        None => Err(Error::InvalidSpirv("empty module".into())),
    }
}

/// A descriptor-set layout of N storage buffers at bindings `0..N`, visible to compute.
pub(crate) struct SetLayout {
    pub(crate) raw: vk::DescriptorSetLayout,
    pub(crate) n_bindings: u32,
    shared: Arc<DeviceShared>,
}

impl Drop for SetLayout {
    fn drop(&mut self) {
        // SAFETY: pipelines and descriptor sets made with this layout hold this Arc; destroyed once.
        unsafe {
            self.shared
                .raw
                .destroy_descriptor_set_layout(self.raw, None)
        };
    }
}

/// What [`Device::create_pipeline_with`] needs.
#[derive(Clone, Copy, Debug)]
pub struct PipelineDesc<'a> {
    /// A name for errors.
    pub label: &'a str,
    /// The module's words.
    pub spirv: &'a [u32],
    /// The entry point, usually `"main"`.
    pub entry_point: &'a str,
    /// Specialization constants.
    pub spec_constants: &'a SpecConstants,
    /// Storage buffers at bindings `0..n_bindings` of set 0.
    pub n_bindings: u32,
    /// Bytes of push constants (a multiple of 4, at most `maxPushConstantsSize`); 0 for none.
    pub push_constant_bytes: u32,
    /// A pipeline cache to use and fill.
    pub cache: Option<&'a PipelineCache>,
    /// Keep the driver's statistics and internal representations of the compiled pipeline
    /// ([`Pipeline::statistics`], [`Pipeline::representations`]) where the device offers them
    /// (`VK_KHR_pipeline_executable_properties`; both are kept, whether or not a caller then
    /// asks for the representations); some drivers compile
    /// slower or bypass their caches for it, so only tools ask.
    pub capture_statistics: bool,
}

/// A compute pipeline with its layout.
pub struct Pipeline {
    pub(crate) inner: Arc<PipelineInner>,
}

pub(crate) struct PipelineInner {
    pub(crate) raw: vk::Pipeline,
    pub(crate) layout: vk::PipelineLayout,
    pub(crate) set_layout: Arc<SetLayout>,
    /// The handoff interface (set 1 and [`HANDOFF_PUSH_BYTES`] of push constants), when the
    /// module declares a role (`kernels/glsl/handoff.glsl`).
    pub(crate) handoff: Option<(HandoffRole, Arc<SetLayout>)>,
    pub(crate) push_constant_bytes: u32,
    /// The specialization it was created with.
    pub(crate) spec_constants: SpecConstants,
    pub(crate) label: String,
    /// Created with the driver's statistics kept (`capture_statistics` where offered).
    pub(crate) captured: bool,
    pub(crate) shared: Arc<DeviceShared>,
}

impl fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pipeline")
            .field("label", &self.inner.label)
            .field("n_bindings", &self.inner.set_layout.n_bindings)
            .field("push_constant_bytes", &self.inner.push_constant_bytes)
            .finish()
    }
}

impl Pipeline {
    /// Storage-buffer bindings of its descriptor set.
    pub fn n_bindings(&self) -> u32 {
        self.inner.set_layout.n_bindings
    }

    /// Bytes of push constants it takes.
    pub fn push_constant_bytes(&self) -> u32 {
        self.inner.push_constant_bytes
    }

    /// The specialization constants the pipeline was created with.
    pub fn spec_constants(&self) -> &SpecConstants {
        &self.inner.spec_constants
    }

    /// The handoff role its module declares (`kernels/glsl/handoff.glsl`); such a pipeline
    /// needs handoff words bound before each dispatch ([`crate::HandoffWords::bind`]).
    pub fn handoff_role(&self) -> Option<&HandoffRole> {
        self.inner.handoff.as_ref().map(|(r, _)| r)
    }

    /// The label given at creation.
    pub fn label(&self) -> &str {
        &self.inner.label
    }

    /// The Vulkan pipeline.
    pub fn raw(&self) -> vk::Pipeline {
        self.inner.raw
    }

    /// The Vulkan pipeline layout.
    pub fn raw_layout(&self) -> vk::PipelineLayout {
        self.inner.layout
    }
}

impl Drop for PipelineInner {
    fn drop(&mut self) {
        // SAFETY: command buffers using the pipeline hold this Arc, so none is pending;
        // each handle is destroyed once.
        unsafe {
            self.shared.raw.destroy_pipeline(self.raw, None);
            self.shared.raw.destroy_pipeline_layout(self.layout, None);
        }
    }
}

/// A `VkPipelineCache`: saves compile time across runs when its bytes are stored and reloaded.
pub struct PipelineCache {
    raw: vk::PipelineCache,
    shared: Arc<DeviceShared>,
}

impl fmt::Debug for PipelineCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PipelineCache").finish_non_exhaustive()
    }
}

impl PipelineCache {
    /// The cache's bytes, to store and pass to [`Device::create_pipeline_cache`] next time.
    pub fn data(&self) -> Result<Vec<u8>> {
        // SAFETY: the cache is live; pipeline caches are internally synchronised.
        unsafe { self.shared.raw.get_pipeline_cache_data(self.raw) }
            .map_err(vk_err("vkGetPipelineCacheData"))
    }
}

impl Drop for PipelineCache {
    fn drop(&mut self) {
        // SAFETY: pipeline creation borrows the cache only for the call; destroyed once.
        unsafe { self.shared.raw.destroy_pipeline_cache(self.raw, None) };
    }
}

impl Device {
    /// A pipeline cache, seeded from `initial` bytes of an earlier [`PipelineCache::data`]
    /// (empty for a new one). The driver checks the header and ignores bytes of another device
    /// or driver version.
    pub fn create_pipeline_cache(&self, initial: &[u8]) -> Result<PipelineCache> {
        let info = vk::PipelineCacheCreateInfo::default().initial_data(initial);
        // SAFETY: the device is live; `initial` outlives the call.
        let raw = unsafe { self.shared.raw.create_pipeline_cache(&info, None) }
            .map_err(vk_err("vkCreatePipelineCache"))?;
        Ok(PipelineCache {
            raw,
            shared: Arc::clone(&self.shared),
        })
    }

    /// A compute pipeline from SPIR-V (`main` entry point): `n_bindings` storage buffers at
    /// set 0, bindings `0..n_bindings`, and `push_constant_bytes` of push constants.
    pub fn create_pipeline(
        &self,
        spirv: &[u32],
        spec_constants: &SpecConstants,
        n_bindings: u32,
        push_constant_bytes: u32,
    ) -> Result<Pipeline> {
        self.create_pipeline_with(&PipelineDesc {
            label: "pipeline",
            spirv,
            entry_point: "main",
            spec_constants,
            n_bindings,
            push_constant_bytes,
            cache: None,
            capture_statistics: false,
        })
    }

    /// A compute pipeline described in full.
    pub fn create_pipeline_with(&self, desc: &PipelineDesc<'_>) -> Result<Pipeline> {
        let shared = &self.shared;
        check_spirv(desc.spirv)?;
        let limit = shared.info.max_push_constants_size;
        if desc.push_constant_bytes % 4 != 0 || desc.push_constant_bytes > limit {
            return Err(Error::InvalidArgument(format!(
                "{}: {} bytes of push constants (must be a multiple of 4, at most {limit} here)",
                desc.label, desc.push_constant_bytes
            )));
        }
        let entry = CString::new(desc.entry_point).map_err(|_| {
            Error::InvalidArgument(format!("{}: entry point contains NUL", desc.label))
        })?;

        let set_layout = Arc::new(self.create_set_layout(desc.n_bindings)?);
        // A module that declares a handoff role reads its words at set 1, and where they are
        // from its push constants, which it then has no others of.
        let role = HandoffRole::of_spirv(desc.spirv);
        if role.is_some() && desc.push_constant_bytes != 0 {
            return Err(Error::InvalidArgument(format!(
                "{}: a kernel with a handoff role takes no push constants of its own ({} bytes)",
                desc.label, desc.push_constant_bytes
            )));
        }
        let handoff = match role {
            Some(r) => Some((r, Arc::new(self.create_set_layout(1)?))),
            None => None,
        };
        let push_constant_bytes = match handoff {
            Some(_) => HANDOFF_PUSH_BYTES,
            None => desc.push_constant_bytes,
        };
        let set_layouts: Vec<vk::DescriptorSetLayout> = std::iter::once(set_layout.raw)
            .chain(handoff.as_ref().map(|(_, l)| l.raw))
            .collect();
        let ranges = [vk::PushConstantRange::default()
            .stage_flags(vk::ShaderStageFlags::COMPUTE)
            .offset(0)
            .size(push_constant_bytes)];
        let ranges: &[vk::PushConstantRange] = if push_constant_bytes == 0 {
            &[]
        } else {
            &ranges
        };
        let layout_info = vk::PipelineLayoutCreateInfo::default()
            .set_layouts(&set_layouts)
            .push_constant_ranges(ranges);
        // SAFETY: the set layout is live; the arrays outlive the call.
        let layout = unsafe { shared.raw.create_pipeline_layout(&layout_info, None) }
            .map_err(vk_err("vkCreatePipelineLayout"))?;

        let module_info = vk::ShaderModuleCreateInfo::default().code(desc.spirv);
        // SAFETY: the words start with the SPIR-V header (checked above); the driver and the
        // validation layer check the rest.
        let module = match unsafe { shared.raw.create_shader_module(&module_info, None) } {
            Ok(m) => m,
            Err(r) => {
                // SAFETY: the layout is unused; destroyed once.
                unsafe { shared.raw.destroy_pipeline_layout(layout, None) };
                return Err(Error::vk("vkCreateShaderModule", r));
            }
        };

        let (map, data) = desc.spec_constants.map_and_data();
        let spec = vk::SpecializationInfo::default()
            .map_entries(&map)
            .data(&data);
        let mut stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(module)
            .name(&entry);
        if !desc.spec_constants.is_empty() {
            stage = stage.specialization_info(&spec);
        }
        let captured = desc.capture_statistics && shared.enabled.pipeline_executable_info;
        let flags = if captured {
            vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
                | vk::PipelineCreateFlags::CAPTURE_INTERNAL_REPRESENTATIONS_KHR
        } else {
            vk::PipelineCreateFlags::empty()
        };
        // Without the driver's bounds checks where the device lets a pipeline ask: NVIDIA's
        // driver otherwise checks every storage-buffer access against its binding's range,
        // robustBufferAccess enabled or not, and no kernel here reads or writes past its
        // bindings (the suites pass unchecked on an H200). On an H200 bf16 +1.1%, q8_0 +2.4%,
        // q4_0 +5.0%, Qwen3-Next +1.8..2.8% (docs/perf.md, session 55).
        let mut robustness = vk::PipelineRobustnessCreateInfoEXT::default()
            .storage_buffers(vk::PipelineRobustnessBufferBehaviorEXT::DISABLED)
            .uniform_buffers(vk::PipelineRobustnessBufferBehaviorEXT::DISABLED);
        let mut info = vk::ComputePipelineCreateInfo::default()
            .flags(flags)
            .stage(stage)
            .layout(layout);
        if shared.enabled.pipeline_robustness {
            info = info.push_next(&mut robustness);
        }
        let info = [info];
        let cache = desc.cache.map_or(vk::PipelineCache::null(), |c| c.raw);
        // SAFETY: module, layout and cache are live; every pointer in `info` outlives the call.
        let created = unsafe { shared.raw.create_compute_pipelines(cache, &info, None) };
        // SAFETY: a module may be destroyed once its pipelines are created; destroyed once.
        unsafe { shared.raw.destroy_shader_module(module, None) };
        let raw = match created {
            Ok(p) if p.len() == 1 => p[0],
            Ok(_) | Err(_) => {
                // SAFETY: the layout is unused (no pipeline was made); destroyed once.
                unsafe { shared.raw.destroy_pipeline_layout(layout, None) };
                let result = created.err().map_or(vk::Result::ERROR_UNKNOWN, |(_, r)| r);
                return Err(Error::vk("vkCreateComputePipelines", result));
            }
        };
        Ok(Pipeline {
            inner: Arc::new(PipelineInner {
                raw,
                layout,
                set_layout,
                handoff,
                push_constant_bytes,
                spec_constants: desc.spec_constants.clone(),
                label: desc.label.to_string(),
                captured,
                shared: Arc::clone(shared),
            }),
        })
    }

    fn create_set_layout(&self, n_bindings: u32) -> Result<SetLayout> {
        let bindings: Vec<_> = (0..n_bindings)
            .map(|b| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        let info = vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings);
        // SAFETY: the device is live; `bindings` outlives the call.
        let raw = unsafe { self.shared.raw.create_descriptor_set_layout(&info, None) }
            .map_err(vk_err("vkCreateDescriptorSetLayout"))?;
        Ok(SetLayout {
            raw,
            n_bindings,
            shared: Arc::clone(&self.shared),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spirv_bytes_are_checked() {
        assert!(spirv_from_bytes(&[1, 2, 3]).is_err());
        assert!(spirv_from_bytes(&[0; 20]).is_err());
        let mut ok = SPIRV_MAGIC.to_le_bytes().to_vec();
        ok.extend_from_slice(&[0; 16]);
        assert_eq!(spirv_from_bytes(&ok).map(|w| w.len()).ok(), Some(5));
        let swapped: Vec<u8> = ok.chunks(4).flat_map(|c| c.iter().rev().copied()).collect();
        let msg = spirv_from_bytes(&swapped).unwrap_err().to_string();
        assert!(msg.contains("byte-swapped"), "{msg}");
    }

    #[test]
    fn spec_constants_pack_four_bytes_each_and_replace_by_id() {
        let spec = SpecConstants::new()
            .u32(0, 64)
            .f32(1, 2.0)
            .i32(2, -3)
            .u32(0, 32)
            .bool(7, true);
        let (map, data) = spec.map_and_data();
        assert_eq!(map.len(), 4);
        assert_eq!((map[0].constant_id, map[0].offset), (0, 0));
        assert_eq!((map[3].constant_id, map[3].offset), (7, 12));
        assert_eq!(&data[0..4], &32u32.to_ne_bytes());
        assert_eq!(&data[4..8], &2.0f32.to_ne_bytes());
        assert_eq!(&data[8..12], &(-3i32).to_ne_bytes());
        assert_eq!(&data[12..16], &1u32.to_ne_bytes());
    }
}
