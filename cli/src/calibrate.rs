//! `vkfuse calibrate`: measures what the fusion compiler's cost model charges
//! ([`DeviceCost`]) on this device, so that `compile-model --device-cost FILE` minimises this
//! device's costs instead of an H100's (issue 7: "the compiler's cost model charges barriers
//! as the device measures them").
//!
//! One streaming kernel (16-byte loads, four in flight per invocation) does all the timing, on
//! GPU timestamps:
//! - bandwidth: one dispatch reading a buffer much larger than any last-level cache;
//! - a level boundary: LEVELS dispatches each reading its own slice (the bytes of a typical
//!   decode level), once with a barrier between consecutive ones and once without: the
//!   difference per boundary is what a dependency level costs streaming work beyond the work
//!   itself (the barrier, the drain before it, the ramp after it). The cost model charges what
//!   a boundary costs a decode step, whose levels are latency chains with longer ramps: on an
//!   H100 this measures 2.4 µs where dropping a step's boundaries saved 3.0-4.4 (docs/perf.md,
//!   sessions 13 and 21), so it is a lower bound of that price;
//! - a dispatch: LEVELS one-workgroup dispatches with no barrier between them.
//!
//! The compute units are the driver's count (NVIDIA and AMD report theirs); elsewhere the host's
//! CPU count for a CPU device, else 1, said in the output, for the user to correct in the file.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;
use vkfuse_compiler::fuse::cost::DeviceCost;
use vkfuse_compiler::kernels::compile_source;
use vkfuse_runtime::{
    BufferBinding, BufferKind, Device, DeviceType, Pipeline, SpecConstants, Stages, TimestampPool,
};

#[derive(clap::Args)]
pub struct CalibrateArgs {
    #[command(flatten)]
    pub device: crate::options::DeviceArg,
    /// Write the costs to this file (JSON), for `compile-model --device-cost FILE`; without it
    /// the JSON is printed as the last line.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

const SHADER: &str = r#"
#version 450
layout(local_size_x = 256) in;
layout(push_constant) uniform P { uint first; uint count; } pc;
layout(std430, set = 0, binding = 0) readonly buffer Src { uvec4 src[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Dst { uint dst[]; };

// Reads src[first .. first + count) once, four 16-byte loads in flight per invocation.
void main() {
    uint stride = gl_NumWorkGroups.x * 256u;
    uint i = gl_GlobalInvocationID.x;
    uvec4 acc = uvec4(0u);
    for (; i + 3u * stride < pc.count; i += 4u * stride) {
        uint at = pc.first + i;
        acc ^= src[at] ^ src[at + stride] ^ src[at + 2u * stride] ^ src[at + 3u * stride];
    }
    for (; i < pc.count; i += stride) {
        acc ^= src[pc.first + i];
    }
    uint a = acc.x ^ acc.y ^ acc.z ^ acc.w;
    // Almost never true: the loads stay without a store per invocation.
    if (a == 0x9e3779b9u) {
        dst[0] = a;
    }
}
"#;

/// Dispatches per level measurement.
const LEVELS: u32 = 64;
/// Measurements per figure; the fastest counts (the others met other work or clocks rising).
const REPEATS: usize = 7;

/// Sizes by device: a CPU device (lavapipe) streams far slower, so it gets less to read.
struct Sizes {
    /// Bytes of the bandwidth read.
    stream: u64,
    /// Bytes of each level (q/k/v of a 0.6B model in bf16 is 8 MiB, o_proj 4 MiB).
    level: u64,
    /// Workgroups of a streaming dispatch.
    groups: u32,
}

struct Bench<'a> {
    device: &'a Device,
    pipeline: Pipeline,
    set: vkfuse_runtime::DescriptorSet,
    ts: TimestampPool,
}

impl Bench<'_> {
    /// The fastest of REPEATS runs of `dispatches` (each: first uvec4, count, workgroups),
    /// in µs, with a barrier after each when `barriers`.
    fn time(&self, dispatches: &[(u32, u32, u32)], barriers: bool) -> Result<f64> {
        let mut best = f64::INFINITY;
        let mut cmd = self.device.create_command_buffer()?;
        for _ in 0..REPEATS {
            let mut rec = cmd.begin()?;
            rec.reset_timestamps(&self.ts)?;
            rec.bind_pipeline(&self.pipeline)?;
            rec.bind_descriptor_set(&self.set)?;
            rec.write_timestamp(&self.ts, 0)?;
            for &(first, count, groups) in dispatches {
                rec.push_constants_pod(0, &[first, count])?;
                rec.dispatch(groups, 1, 1)?;
                if barriers {
                    rec.compute_barrier();
                }
            }
            rec.write_timestamp(&self.ts, 1)?;
            rec.barrier(Stages::COMPUTE, Stages::HOST);
            rec.finish()?;
            self.device
                .submit_and_wait(&mut cmd, Duration::from_secs(60))?;
            let ns = self
                .ts
                .elapsed_ns(0, 1)?
                .context("the timestamps were not written")?;
            best = best.min(ns / 1e3);
        }
        Ok(best)
    }
}

/// Measures the costs of `device`.
pub fn measure(device: &Device, out: &mut dyn Write) -> Result<DeviceCost> {
    let info = device.info();
    let cpu = info.device_type == DeviceType::Cpu;
    let (compute_units, units_from) = match info.compute_units {
        Some(n) if n > 0 => (n as usize, "the driver"),
        _ if cpu => (
            std::thread::available_parallelism().map_or(1, |n| n.get()),
            "the host's CPUs",
        ),
        _ => (
            1,
            "not reported by the driver: 1 written, edit the file to the device's count",
        ),
    };
    // Within what one binding may span and one allocation may hold (128 MiB on some mobile
    // GPUs), in whole 16-byte loads.
    let most = u64::from(info.max_storage_buffer_range).min(info.max_memory_allocation_size) & !15;
    let mut sizes = if cpu {
        Sizes {
            stream: 64 << 20,
            level: 256 << 10,
            groups: 4 * compute_units as u32,
        }
    } else {
        Sizes {
            stream: 1 << 30,
            level: 4 << 20,
            groups: 8 * compute_units.clamp(16, 4096) as u32,
        }
    };
    sizes.stream = sizes.stream.min(most);
    sizes.level = sizes.level.min(sizes.stream / 4);
    let src = device
        .create_buffer(sizes.stream, BufferKind::DeviceLocal)
        .context("the buffer to stream")?;
    let dst = device.create_buffer(256, BufferKind::DeviceLocal)?;
    let spirv = compile_source("calibrate", SHADER)?;
    let pipeline = device.create_pipeline(&spirv, &SpecConstants::new(), 2, 8)?;
    let pool = device.create_descriptor_pool(1, 2)?;
    let set = pool.allocate(&pipeline)?;
    device.write_descriptors(
        &set,
        &[BufferBinding::whole(0, &src), BufferBinding::whole(1, &dst)],
    )?;
    let ts = device
        .create_timestamp_pool(2)?
        .context("the device has no timestamp queries: nothing can be timed")?;
    let bench = Bench {
        device,
        pipeline,
        set,
        ts,
    };

    let words = |bytes: u64| (bytes / 16) as u32;
    let stream_us = bench.time(&[(0, words(sizes.stream), sizes.groups)], false)?;
    let bytes_per_us = sizes.stream as f64 / stream_us;
    let levels: Vec<(u32, u32, u32)> = (0..LEVELS)
        .map(|l| {
            let first = u64::from(l) * sizes.level % (sizes.stream - sizes.level);
            (words(first), words(sizes.level), sizes.groups)
        })
        .collect();
    let with = bench.time(&levels, true)?;
    let without = bench.time(&levels, false)?;
    let barrier = (with - without) / f64::from(LEVELS - 1);
    let tiny: Vec<(u32, u32, u32)> = (0..LEVELS).map(|l| (l, 1, 1)).collect();
    let dispatch = bench.time(&tiny, false)? / f64::from(LEVELS);

    // A boundary that measured nothing (noise on a CPU device) still costs something: the cost
    // model needs a positive price, and the smallest it can tell from zero will do.
    let floor = 0.001;
    let mut notes = vec![];
    if barrier < floor {
        notes.push(format!(
            "the barriers cost nothing measurable here ({barrier:.3} µs per boundary): \
             {floor} µs written"
        ));
    }
    if dispatch < floor {
        notes.push(format!(
            "a dispatch measured {dispatch:.4} µs: {floor} µs written"
        ));
    }
    let cost = DeviceCost {
        name: info.name.clone(),
        dispatch_us: round3(dispatch.max(floor)),
        barrier_us: round3(barrier.max(floor)),
        bytes_per_us: bytes_per_us.round().max(1.0),
        nominal_context: DeviceCost::default().nominal_context,
        compute_units,
    };
    let h100 = DeviceCost::h100();
    writeln!(out, "device: {}", info.name)?;
    writeln!(
        out,
        "{:<14} {:>12} {:>12}  how",
        "cost", "measured", "H100 default"
    )?;
    writeln!(
        out,
        "{:<14} {:>12.1} {:>12.1}  {} MiB in one dispatch of {} workgroups: {:.1} µs",
        "GB/s",
        cost.bytes_per_us / 1e3,
        h100.bytes_per_us / 1e3,
        sizes.stream >> 20,
        sizes.groups,
        stream_us
    )?;
    writeln!(
        out,
        "{:<14} {:>12.3} {:>12.3}  {LEVELS} dispatches of {} KiB each: {with:.1} µs with a \
         barrier between them, {without:.1} µs without",
        "barrier µs",
        cost.barrier_us,
        h100.barrier_us,
        sizes.level >> 10
    )?;
    writeln!(
        out,
        "{:<14} {:>12.3} {:>12.3}  {LEVELS} one-workgroup dispatches, no barrier",
        "dispatch µs", cost.dispatch_us, h100.dispatch_us
    )?;
    writeln!(
        out,
        "{:<14} {:>12} {:>12}  {units_from}",
        "compute units", cost.compute_units, h100.compute_units
    )?;
    for note in notes {
        writeln!(out, "note: {note}")?;
    }
    Ok(cost)
}

fn round3(x: f64) -> f64 {
    (x * 1e3).round() / 1e3
}

pub fn run(args: &CalibrateArgs) -> Result<()> {
    // Before measuring: the costs must have somewhere to go.
    if let Some(out) = &args.output {
        vkfuse_runtime::schedule::check_output(out).context("-o: the costs cannot go there")?;
    }
    let device = args.device.open()?;
    let mut out = std::io::stdout().lock();
    let cost = measure(&device, &mut out)?;
    let json = serde_json::to_string_pretty(&cost)?;
    match &args.output {
        Some(path) => {
            // Whole or not at all: a failed write keeps an earlier file.
            vkfuse_runtime::schedule::write_whole(path, (json + "\n").as_bytes())
                .context("writing the costs")?;
            writeln!(
                out,
                "wrote {} (use: compile-model MODEL -o FILE --device-cost {})",
                path.display(),
                path.display()
            )?;
        }
        None => writeln!(out, "{}", serde_json::to_string(&cost)?)?,
    }
    Ok(())
}
