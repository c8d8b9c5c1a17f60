//! `vkfuse kernels FILE`: what a schedule's kernels become on one device, as its driver reports
//! them (`VK_KHR_pipeline_executable_properties`: registers per invocation on NVIDIA, which with
//! the workgroup size bounds the workgroups an SM holds at once, the residency that handoffs'
//! waiting consumers and the L2 prefetch beside them compete for: docs/perf.md).

use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use vkfuse_runtime::session::kernel_pipeline;
use vkfuse_runtime::{Representation, Statistic};

#[derive(clap::Args)]
pub struct KernelsArgs {
    /// A schedule file (from `compile-model -o`).
    pub file: PathBuf,
    /// Also write the driver's internal representations of each kernel (its IR or machine
    /// code, where it offers any) into this folder, one file per kernel and representation:
    /// `NNN-REPRESENTATION.txt` (or `.bin`), NNN the kernel's number in the table.
    #[arg(long, value_name = "DIR")]
    pub representations: Option<PathBuf>,
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
    // Refused before the work where a file stands at the folder's place or above it; the
    // folder is made only when there is something to write (most drivers offer nothing).
    if let Some(dir) = &args.representations {
        // ("" ends a relative path's ancestors: the current folder.)
        let existing = dir
            .ancestors()
            .find(|a| !a.as_os_str().is_empty() && a.exists());
        if let Some(file) = existing.filter(|a| !a.is_dir()) {
            anyhow::bail!(
                "--representations {}: {} is a file, not a folder to write into",
                dir.display(),
                file.display()
            );
        }
    }
    // The representations' names, as the file names carry them.
    let mut written = std::collections::BTreeSet::new();
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
        if let Some(dir) = &args.representations {
            for r in pipeline.representations()?.unwrap_or_default() {
                written.insert(write_representation(dir, i, &r)?);
            }
        }
    }
    if let Some(dir) = &args.representations {
        if written.is_empty() {
            writeln!(
                out,
                "{} offers no internal representations of its kernels{}: nothing written to {}",
                info.name,
                if offered {
                    ""
                } else {
                    " (nor their statistics: VK_KHR_pipeline_executable_properties)"
                },
                dir.display()
            )?;
        } else {
            writeln!(
                out,
                "internal representations ({}) written to {}",
                Vec::from_iter(written).join(", "),
                dir.display()
            )?;
        }
    }
    Ok(())
}

/// Writes one representation of kernel `i` under `dir`; its name, as the file names carry it.
fn write_representation(dir: &Path, i: usize, r: &Representation) -> Result<String> {
    // Only letters, digits and dashes in file names: drivers' names hold spaces and slashes.
    let name: String = r
        .name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    // A second executable's representations are told apart by its number.
    let exe = if r.executable > 0 {
        format!("-{}", r.executable)
    } else {
        String::new()
    };
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating the folder {}", dir.display()))?;
    let path = dir.join(format!(
        "{i:03}{exe}-{name}.{}",
        if r.is_text { "txt" } else { "bin" }
    ));
    std::fs::write(&path, &r.data).with_context(|| format!("writing {}", path.display()))?;
    Ok(name)
}

/// `name value` pairs, comma-separated.
fn describe(stats: &[Statistic]) -> String {
    stats
        .iter()
        .map(|s| format!("{} {}", s.name, s.value))
        .collect::<Vec<_>>()
        .join(", ")
}
