//! The driver's statistics of a compiled pipeline (`VK_KHR_pipeline_executable_properties`):
//! what the kernel became on this device, registers per invocation above all, which with the
//! workgroup size bounds how many workgroups an SM holds at once (`vkfuse kernels`); and its
//! internal representations, where the driver offers any (its IR or machine code: what a
//! source change did to the code when the statistics do not move).

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

/// One of the driver's internal representations of a compiled pipeline's executable.
#[derive(Clone, Debug, PartialEq)]
pub struct Representation {
    /// The executable it belongs to (a compute pipeline usually has one).
    pub executable: u32,
    /// The driver's short name of it ("NIR", "Assembly", ...).
    pub name: String,
    /// The driver's description of it.
    pub description: String,
    /// Whether `data` is text (without its terminating NUL); bytes otherwise.
    pub is_text: bool,
    /// Its contents.
    pub data: Vec<u8>,
}

impl Pipeline {
    /// The driver's statistics of this pipeline's executables (a compute pipeline has one;
    /// where a driver splits it, each one's statistics follow the last's), or `None` where it
    /// was not created with `capture_statistics` on a device that offers them.
    pub fn statistics(&self) -> Result<Option<Vec<Statistic>>> {
        self.per_executable(|ext, exe, _| {
            // SAFETY: the pipeline is live and was created with CAPTURE_STATISTICS on a device
            // with pipelineExecutableInfo enabled; `exe` names one of its executables.
            let stats = unsafe { ext.get_pipeline_executable_statistics(exe) }
                .map_err(vk_err("vkGetPipelineExecutableStatisticsKHR"))?;
            Ok(stats
                .iter()
                .map(|s| Statistic {
                    name: text(s.name_as_c_str()),
                    description: text(s.description_as_c_str()),
                    value: StatisticValue::of(s.format, s.value),
                })
                .collect())
        })
    }

    /// `f`'s findings about each of the pipeline's executables, in order, or `None` where it
    /// was not created with `capture_statistics` on a device that offers them.
    fn per_executable<T>(
        &self,
        mut f: impl FnMut(
            &ash::khr::pipeline_executable_properties::Device,
            &vk::PipelineExecutableInfoKHR<'_>,
            u32,
        ) -> Result<Vec<T>>,
    ) -> Result<Option<Vec<T>>> {
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
            out.extend(f(&ext, &exe, index)?);
        }
        Ok(Some(out))
    }

    /// The driver's internal representations of this pipeline's executables (none where the
    /// driver offers none), or `None` where it was not created with `capture_statistics` on a
    /// device that offers them.
    pub fn representations(&self) -> Result<Option<Vec<Representation>>> {
        self.per_executable(|ext, exe, index| {
            // SAFETY: the pipeline is live and was created with CAPTURE_INTERNAL_REPRESENTATIONS
            // on a device with pipelineExecutableInfo enabled; ash's call leaves every pData
            // null, so the driver fills in each representation's dataSize only.
            let mut reps = unsafe { ext.get_pipeline_executable_internal_representations(exe) }
                .map_err(vk_err("vkGetPipelineExecutableInternalRepresentationsKHR"))?;
            let mut data: Vec<Vec<u8>> = reps.iter().map(|r| vec![0u8; r.data_size]).collect();
            for (r, d) in reps.iter_mut().zip(&mut data) {
                r.p_data = d.as_mut_ptr().cast();
            }
            let mut count = reps.len() as u32;
            // SAFETY: `reps` holds `count` structures, each pData pointing at dataSize bytes
            // that outlive the call; the driver writes at most dataSize bytes to each.
            unsafe {
                (ext.fp()
                    .get_pipeline_executable_internal_representations_khr)(
                    ext.device(),
                    exe,
                    &mut count,
                    reps.as_mut_ptr(),
                )
            }
            .result()
            .map_err(vk_err("vkGetPipelineExecutableInternalRepresentationsKHR"))?;
            let mut out = vec![];
            for (r, mut d) in reps.iter().zip(data).take(count as usize) {
                let is_text = r.is_text == vk::TRUE;
                d.truncate(r.data_size);
                if is_text {
                    // Text comes NUL-terminated.
                    while d.last() == Some(&0) {
                        d.pop();
                    }
                }
                out.push(Representation {
                    executable: index,
                    name: text(r.name_as_c_str()),
                    description: text(r.description_as_c_str()),
                    is_text,
                    data: d,
                });
            }
            Ok(out)
        })
    }
}

fn text(r: std::result::Result<&std::ffi::CStr, std::ffi::FromBytesUntilNulError>) -> String {
    r.map(|s| s.to_string_lossy().trim().to_string())
        .unwrap_or_default()
}
