//! The driver's statistics of a compiled pipeline (`VK_KHR_pipeline_executable_properties`):
//! what the kernel became on this device, registers per invocation above all, which with the
//! workgroup size bounds how many workgroups an SM holds at once (`vkfuse kernels`).

use super::pipeline::Pipeline;
use crate::error::{vk_err, Result};
use ash::vk;
use std::fmt;

/// One statistic of a compiled pipeline, as the driver names it.
#[derive(Clone, Debug, PartialEq)]
pub struct Statistic {
    /// The driver's short name ("Register Count" on NVIDIA).
    pub name: String,
    /// The driver's description of it.
    pub description: String,
    /// Its value.
    pub value: StatisticValue,
}

/// A statistic's value, in the format the driver reports it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StatisticValue {
    /// `VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR`.
    Bool(bool),
    /// `..._INT64_KHR`.
    Int(i64),
    /// `..._UINT64_KHR`.
    Uint(u64),
    /// `..._FLOAT64_KHR`.
    Float(f64),
}

impl fmt::Display for StatisticValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StatisticValue::Bool(b) => write!(f, "{b}"),
            StatisticValue::Int(i) => write!(f, "{i}"),
            StatisticValue::Uint(u) => write!(f, "{u}"),
            StatisticValue::Float(x) => write!(f, "{x:.3}"),
        }
    }
}

impl StatisticValue {
    fn of(
        format: vk::PipelineExecutableStatisticFormatKHR,
        v: vk::PipelineExecutableStatisticValueKHR,
    ) -> Self {
        // SAFETY: the driver filled the union member its format names.
        unsafe {
            match format {
                vk::PipelineExecutableStatisticFormatKHR::BOOL32 => {
                    StatisticValue::Bool(v.b32 == vk::TRUE)
                }
                vk::PipelineExecutableStatisticFormatKHR::INT64 => StatisticValue::Int(v.i64),
                vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => StatisticValue::Float(v.f64),
                _ => StatisticValue::Uint(v.u64),
            }
        }
    }
}

impl Pipeline {
    /// The driver's statistics of this pipeline's executables (a compute pipeline has one;
    /// where a driver splits it, each one's statistics follow the last's), or `None` where it
    /// was not created with `capture_statistics` on a device that offers them.
    pub fn statistics(&self) -> Result<Option<Vec<Statistic>>> {
        let inner = &self.inner;
        if !inner.captured {
            return Ok(None);
        }
        let shared = &inner.shared;
        let ext = ash::khr::pipeline_executable_properties::Device::new(
            &shared.instance.raw,
            &shared.raw,
        );
        let info = vk::PipelineInfoKHR::default().pipeline(inner.raw);
        // SAFETY: the pipeline is live and was created with CAPTURE_STATISTICS on a device
        // with pipelineExecutableInfo enabled.
        let executables = unsafe { ext.get_pipeline_executable_properties(&info) }
            .map_err(vk_err("vkGetPipelineExecutablePropertiesKHR"))?;
        let mut out = vec![];
        for index in 0..executables.len() as u32 {
            let exe = vk::PipelineExecutableInfoKHR::default()
                .pipeline(inner.raw)
                .executable_index(index);
            // SAFETY: as above; `index` is below the count the driver reported.
            let stats = unsafe { ext.get_pipeline_executable_statistics(&exe) }
                .map_err(vk_err("vkGetPipelineExecutableStatisticsKHR"))?;
            out.extend(stats.iter().map(|s| Statistic {
                name: text(s.name_as_c_str()),
                description: text(s.description_as_c_str()),
                value: StatisticValue::of(s.format, s.value),
            }));
        }
        Ok(Some(out))
    }
}

fn text(r: std::result::Result<&std::ffi::CStr, std::ffi::FromBytesUntilNulError>) -> String {
    r.map(|s| s.to_string_lossy().trim().to_string())
        .unwrap_or_default()
}
