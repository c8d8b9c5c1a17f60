//! `vkfuse kernels FILE`: what a schedule's kernels become on one device, as its driver reports
//! them (`VK_KHR_pipeline_executable_properties`: registers per invocation on NVIDIA, which with
//! the workgroup size bounds the workgroups an SM holds at once, the residency that handoffs'
//! waiting consumers and the L2 prefetch beside them compete for: docs/perf.md).

use anyhow::Result;
use std::io::Write;
use std::path::PathBuf;
use vkfuse_runtime::session::kernel_pipeline;
use vkfuse_runtime::Statistic;

#[derive(clap::Args)]
pub struct KernelsArgs {
    /// A schedule file (from `compile-model -o`).
    pub file: PathBuf,
    #[command(flatten)]
    pub device: crate::options::DeviceArg,
}

pub fn run(args: &KernelsArgs) -> Result<()> {
    // Only the kernels are built: the weights' checksum is left out, as `inspect` leaves it.
    let file = crate::options::open_schedule_with(
        &args.file,
        vkfuse_runtime::schedule::Verify::SkipWeightsChecksum,
    )?;
    let schedule = file.schedule();
    let device = args.device.open()?;
    let info = device.info();
    // A timeline probe's kernels need the device clock and buffer addresses (built here
    // without the records' address, they show the kernel's own statistics, the recording
    // folded away).
    vkfuse_runtime::session::timeline::check_device(&device, schedule)?;
    let mut out = std::io::stdout().lock();
    let offered = info.features.pipeline_executable_info;
    writeln!(
        out,
        "kernels of {} on {}{}",
        args.file.display(),
        info.name,
        if offered {
            ", with the driver's statistics (VK_KHR_pipeline_executable_properties)"
        } else {
            " (it offers no pipeline statistics: VK_KHR_pipeline_executable_properties)"
        }
    )?;
    writeln!(
        out,
        "{:>4} {:>10} {:>9}  {:<60} statistics",
        "#", "dispatches", "workgroup", "kernel"
    )?;
    for (i, k) in schedule.kernels.iter().enumerate() {
        // Dispatches running it, as their own kernel or as a band's alternative.
        let uses = schedule
            .dispatches
            .iter()
            .map(|d| {
                usize::from(d.kernel.index() == i)
                    + d.alternatives
                        .iter()
                        .filter(|a| a.kernel.index() == i)
                        .count()
            })
            .sum::<usize>();
        let pipeline = kernel_pipeline(&device, k, None, true, None)?;
        let stats = match pipeline.statistics()? {
            Some(s) => describe(&s),
            None => "-".to_string(),
        };
        let wg = pipeline
            .spec_constants()
            .get_u32(0)
            .map_or("-".to_string(), |w| w.to_string());
        writeln!(out, "{i:>4} {uses:>10} {wg:>9}  {:<60} {stats}", k.label)?;
    }
    Ok(())
}

/// `name value` pairs, comma-separated.
fn describe(stats: &[Statistic]) -> String {
    stats
        .iter()
        .map(|s| format!("{} {}", s.name, s.value))
        .collect::<Vec<_>>()
        .join(", ")
}
