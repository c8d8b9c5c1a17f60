//! Persistent-region probe (issue 7, "fewer dependency levels"): what does a chain of dependent
//! matvecs cost when every level is its own dispatch behind a pipeline barrier, against ONE
//! dispatch whose workgroups stay resident and wait for each other on a counter in device
//! memory (a grid barrier), with and without loading the next level's weights before waiting?
//!
//! The chain has the matvec shapes of a Qwen3-0.6B layer (bf16 weights, f32 activations):
//! q/k/v stacked [4096 x 1024] -> o_proj [1024 x 2048] -> gate/up [6144 x 1024] -> down
//! [1024 x 3072], repeated `--layers` times, each level reading the previous one's output: the
//! dependency structure of a dense decode step without its attention and elementwise work. The
//! result is checked against the same chain on the CPU, so a grid barrier that lets a workgroup
//! run ahead shows up as a wrong answer, not as a fast one.
//!
//! ```sh
//! cargo run --release -p vkfuse-compiler --example persistent_probe -- --layers 2 --groups 2
//! ```
//!
//! On the H100 (`bench/h100 probe`): `--layers 28 --groups 132,264`. A grid barrier needs every
//! workgroup resident at once; more groups than the device can hold deadlock (528 groups of 256
//! threads did on the H100: at this kernel's register use two fit per SM), which the probe turns
//! into a timeout and an exit without cleanup. On lavapipe only `--groups 1` is allowed: with
//! more, counter increments were lost and results wrong (its workgroups are not all resident).

use anyhow::{bail, ensure, Context, Result};
use std::time::Duration;
use vkfuse_compiler::kernels::compile_source;
use vkfuse_runtime::{
    BufferBinding, BufferKind, Device, Instance, InstanceOptions, Requirements, SpecConstants,
    Stages,
};

const SHADER: &str = r#"
#version 450
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x_id = 0) in;
// uvec4 loads per lane per row: the widest row's 16-byte chunks over the subgroup size.
layout(constant_id = 1) const uint MAXJ = 12;
layout(push_constant) uniform P { uint first; uint count; uint grid_sync; uint prefetch; uint base; } pc;
layout(std430, set = 0, binding = 0) readonly buffer Wt { uvec4 w[]; };
layout(std430, set = 0, binding = 1) coherent buffer Act4 { vec4 act4[]; };
layout(std430, set = 0, binding = 2) coherent buffer Act { float act[]; };
layout(std430, set = 0, binding = 3) coherent buffer Sync { uint counter; };
// Per level: rows, cols, weight offset (uvec4 units), input offset (floats); output offset.
layout(std430, set = 0, binding = 4) readonly buffer Levels { uvec4 lv[]; };

shared vec4 xs[768];

float dot8(uvec4 q, vec4 a, vec4 b) {
    // Eight bf16 weights: element 2i in the low half of word i, 2i+1 in the high half.
    vec4 lo = uintBitsToFloat(q << 16);
    vec4 hi = uintBitsToFloat(q & 0xffff0000u);
    return lo.x * a.x + hi.x * a.y + lo.y * a.z + hi.y * a.w
         + lo.z * b.x + hi.z * b.y + lo.w * b.z + hi.w * b.w;
}

void main() {
    uint G = gl_NumWorkGroups.x;
    uint warp = gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID;
    uint warps = G * gl_NumSubgroups;
    uint lane = gl_SubgroupInvocationID;
    uint S = gl_SubgroupSize;
    for (uint l = pc.first; l < pc.first + pc.count; l++) {
        uvec4 a = lv[2 * l];
        uint rows = a.x, chunks = a.y / 8, w_off = a.z, in4 = a.w / 4;
        uint out_off = lv[2 * l + 1].x;
        // Two rows in flight per subgroup, all their loads issued before any arithmetic.
        uvec4 qa[MAXJ], qb[MAXJ];
        uint r = warp;
        bool loaded = false;
        if (pc.prefetch != 0) {
            // The weights do not depend on the previous level: load the first two rows
            // before waiting, so their latency overlaps the wait.
            [[unroll]] for (uint j = 0; j < MAXJ; j++) {
                uint c = lane + j * S;
                qa[j] = (r < rows && c < chunks) ? w[w_off + r * chunks + c] : uvec4(0);
                qb[j] = (r + warps < rows && c < chunks) ? w[w_off + (r + warps) * chunks + c] : uvec4(0);
            }
            loaded = true;
        }
        if (pc.grid_sync != 0 && l > pc.first) {
            // Acquire: what the other workgroups wrote before their release is visible here.
            if (gl_LocalInvocationIndex == 0) {
                uint want = pc.base + G * (l - pc.first);
                while (atomicLoad(counter, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                                  gl_SemanticsAcquire) < want) {}
            }
            controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                           gl_SemanticsAcquireRelease);
        }
        for (uint i = gl_LocalInvocationIndex; i < chunks * 2; i += gl_WorkGroupSize.x)
            xs[i] = act4[in4 + i];
        barrier();
        for (; r < rows; r += 2 * warps) {
            if (!loaded) {
                [[unroll]] for (uint j = 0; j < MAXJ; j++) {
                    uint c = lane + j * S;
                    qa[j] = (c < chunks) ? w[w_off + r * chunks + c] : uvec4(0);
                    qb[j] = (r + warps < rows && c < chunks) ? w[w_off + (r + warps) * chunks + c] : uvec4(0);
                }
            }
            loaded = false;
            float acc_a = 0.0, acc_b = 0.0;
            [[unroll]] for (uint j = 0; j < MAXJ; j++) {
                uint c = min(lane + j * S, chunks - 1);
                vec4 x0 = xs[2 * c], x1 = xs[2 * c + 1];
                acc_a += dot8(qa[j], x0, x1);
                acc_b += dot8(qb[j], x0, x1);
            }
            acc_a = subgroupAdd(acc_a);
            acc_b = subgroupAdd(acc_b);
            if (subgroupElect()) {
                act[out_off + r] = acc_a;
                if (r + warps < rows) act[out_off + r + warps] = acc_b;
            }
        }
        // Release: every store of this workgroup's level happens before the count (and the
        // staged input is no longer read before the next level overwrites it).
        controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                       gl_SemanticsAcquireRelease);
        if (pc.grid_sync != 0 && gl_LocalInvocationIndex == 0)
            atomicAdd(counter, 1u, gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsRelease);
    }
}
"#;

/// One matvec of the chain.
#[derive(Clone, Copy)]
struct Level {
    rows: u32,
    cols: u32,
    /// Where its weights start, in bf16 elements.
    w_elem: u64,
    in_off: u32,
    out_off: u32,
}

/// Activation slots (floats): x (1024), y (4096), z (1024), u (6144).
const X: u32 = 0;
const Y: u32 = 8192;
const Z: u32 = 16384;
const U: u32 = 24576;
const ACT_FLOATS: u32 = 32768;

fn chain(layers: u32) -> Vec<Level> {
    let mut levels = vec![];
    let mut w_elem = 0u64;
    for _ in 0..layers {
        for (rows, cols, in_off, out_off) in [
            (4096, 1024, X, Y),
            (1024, 2048, Y, Z),
            (6144, 1024, Z, U),
            (1024, 3072, U, X),
        ] {
            levels.push(Level {
                rows,
                cols,
                w_elem,
                in_off,
                out_off,
            });
            w_elem += u64::from(rows) * u64::from(cols);
        }
    }
    levels
}

/// Deterministic weights in [-1, 1) / sqrt(cols) so the chain neither explodes nor vanishes.
fn weights(levels: &[Level]) -> Vec<u16> {
    let total = levels
        .last()
        .map_or(0, |l| l.w_elem as usize + l.rows as usize * l.cols as usize);
    let mut out = vec![0u16; total];
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for l in levels {
        let scale = 1.0 / (l.cols as f32).sqrt();
        let n = l.rows as usize * l.cols as usize;
        for v in &mut out[l.w_elem as usize..l.w_elem as usize + n] {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = ((seed >> 40) as f32) / (1u64 << 24) as f32 * 2.0 - 1.0;
            *v = half::bf16::from_f32(u * scale * 1.7).to_bits();
        }
    }
    out
}

fn cpu_chain(levels: &[Level], w: &[u16], x0: &[f32]) -> Vec<f32> {
    let mut act = vec![0f32; ACT_FLOATS as usize];
    act[..x0.len()].copy_from_slice(x0);
    for l in levels {
        let (rows, cols) = (l.rows as usize, l.cols as usize);
        let input: Vec<f32> = act[l.in_off as usize..l.in_off as usize + cols].to_vec();
        for r in 0..rows {
            let row = &w[l.w_elem as usize + r * cols..][..cols];
            let dot: f32 = row
                .iter()
                .zip(&input)
                .map(|(&b, &a)| half::bf16::from_bits(b).to_f32() * a)
                .sum();
            act[l.out_off as usize + r] = dot;
        }
    }
    act[X as usize..X as usize + 1024].to_vec()
}

struct Args {
    layers: u32,
    groups: Vec<u32>,
    iters: usize,
    wg: u32,
}

fn parse() -> Result<Args> {
    let mut a = Args {
        layers: 28,
        groups: vec![132],
        iters: 20,
        wg: 256,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--layers" => a.layers = value()?.parse()?,
            "--groups" => {
                a.groups = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            "--iters" => a.iters = value()?.parse()?,
            "--wg" => a.wg = value()?.parse()?,
            "-h" | "--help" => {
                println!(
                    "persistent_probe [--layers N] [--groups G1,G2,..] [--iters N] [--wg 256]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other}"),
        }
    }
    ensure!(
        a.layers > 0 && a.iters > 0,
        "--layers and --iters must be positive"
    );
    Ok(a)
}

fn main() -> Result<()> {
    let args = parse()?;
    let instance = Instance::new(&InstanceOptions::default())?;
    let adapter = instance.select_adapter(None)?;
    let device = Device::new(&instance, &adapter, &Requirements::none())?;
    println!("device: {}", device.info().name);

    let cpu = device.info().device_type == vkfuse_runtime::DeviceType::Cpu;
    if cpu && args.groups.iter().any(|&g| g > 1) {
        // Seen on lavapipe: increments of the counter get lost and the result is wrong, so a
        // grid barrier there measures nothing.
        bail!(
            "a grid barrier needs concurrently resident workgroups: use --groups 1 on a CPU device"
        );
    }
    let levels = chain(args.layers);
    let w = weights(&levels);
    let w_bytes = (w.len() * 2) as u64;
    let x0: Vec<f32> = (0..1024)
        .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
        .collect();
    let want = cpu_chain(&levels, &w, &x0);

    let mut wbuf = device.create_buffer(w_bytes, BufferKind::DeviceLocal)?;
    device.upload(&mut wbuf, 0, bytemuck::cast_slice(&w))?;
    let mut act = device.create_buffer(u64::from(ACT_FLOATS) * 4, BufferKind::Readback)?;
    let mut sync = device.create_buffer(256, BufferKind::Readback)?;
    sync.write_pod(0, &[0u32])?;
    let table: Vec<u32> = levels
        .iter()
        .flat_map(|l| {
            [
                l.rows,
                l.cols,
                (l.w_elem / 8) as u32,
                l.in_off,
                l.out_off,
                0,
                0,
                0,
            ]
        })
        .collect();
    let mut lbuf = device.create_buffer((table.len() * 4) as u64, BufferKind::Upload)?;
    lbuf.write_pod(0, &table)?;

    let subgroup = device.info().subgroup_size.max(1);
    let widest = levels.iter().map(|l| l.cols).max().unwrap_or(8);
    let maxj = (widest / 8).div_ceil(subgroup);
    let spirv = compile_source("persistent_probe", SHADER)?;
    let spec = SpecConstants::new().u32(0, args.wg).u32(1, maxj);
    let pipeline = device.create_pipeline(&spirv, &spec, 5, 20)?;
    let pool = device.create_descriptor_pool(1, 5)?;
    let set = pool.allocate(&pipeline)?;
    device.write_descriptors(
        &set,
        &[
            BufferBinding::whole(0, &wbuf),
            BufferBinding::whole(1, &act),
            BufferBinding::whole(2, &act),
            BufferBinding::whole(3, &sync),
            BufferBinding::whole(4, &lbuf),
        ],
    )?;
    let ts = device
        .create_timestamp_pool(2)?
        .context("the device has no timestamps")?;

    // (label, per-level dispatch?, groups (0: one row per subgroup), prefetch)
    let mut variants: Vec<(String, bool, u32, bool)> =
        vec![("dispatch per level + barrier".into(), true, 0, false)];
    for &g in &args.groups {
        variants.push((
            format!("dispatch per level + barrier, {g} groups"),
            true,
            g,
            false,
        ));
        variants.push((format!("persistent, {g} groups"), false, g, false));
        variants.push((format!("persistent, {g} groups, prefetch"), false, g, true));
    }
    println!(
        "{} levels ({} layers x 4 matvecs), {:.1} MB of bf16 weights, {} iterations, workgroup {}",
        levels.len(),
        args.layers,
        w_bytes as f64 / 1e6,
        args.iters,
        args.wg
    );
    println!(
        "| variant | median µs | min µs | µs per level | weight GB/s | max rel err |\n|---|---|---|---|---|---|"
    );
    let warps_per_wg = (args.wg / subgroup).max(1);
    let mut cmd = device.create_command_buffer()?;
    let mut wrong = vec![];
    for (label, per_level, groups, prefetch) in variants {
        let mut times = vec![];
        let mut err = 0f64;
        for _ in 0..args.iters + 2 {
            act.write_pod(0, &vec![0f32; ACT_FLOATS as usize])?;
            act.write_pod(0, &x0)?;
            // The counter only grows (as it would across tokens): each run waits for counts
            // above what the runs before it left, so no reset has to be ordered before it.
            let base: u32 = sync.read_pod(0, 1)?[0];
            let mut rec = cmd.begin()?;
            rec.reset_timestamps(&ts)?;
            rec.write_timestamp(&ts, 0)?;
            rec.bind_pipeline(&pipeline)?;
            rec.bind_descriptor_set(&set)?;
            if per_level {
                for (i, l) in levels.iter().enumerate() {
                    rec.push_constants_pod(0, &[i as u32, 1, 0, 0, 0])?;
                    let n = if groups == 0 {
                        l.rows.div_ceil(2 * warps_per_wg)
                    } else {
                        groups
                    };
                    rec.dispatch(n, 1, 1)?;
                    rec.compute_barrier();
                }
            } else {
                rec.push_constants_pod(
                    0,
                    &[0u32, levels.len() as u32, 1, u32::from(prefetch), base],
                )?;
                rec.dispatch(groups, 1, 1)?;
                rec.compute_barrier();
            }
            rec.write_timestamp(&ts, 1)?;
            rec.barrier(Stages::COMPUTE, Stages::HOST);
            rec.finish()?;
            if let Err(e) = device.submit_and_wait(&mut cmd, Duration::from_secs(10)) {
                // A grid barrier over more groups than can be resident never finishes; dropping
                // the device would wait for it forever, so leave without dropping anything.
                eprintln!("error: {label}: {e} (more groups than can be resident deadlock)");
                std::process::exit(3);
            }
            times.push(ts.elapsed_ns(0, 1)?.unwrap_or(0.0) / 1e3);
            let got: Vec<f32> = act.read_pod(0, 1024)?;
            // Every workgroup counts every level once: anything else is a broken barrier.
            let count: u32 = sync.read_pod(0, 1)?[0];
            if !per_level && count != base + groups * levels.len() as u32 {
                eprintln!(
                    "{label}: the counter went from {base} to {count}, not by {} x {}",
                    groups,
                    levels.len()
                );
                err = f64::INFINITY;
            }
            let num: f64 = got
                .iter()
                .zip(&want)
                .map(|(g, w)| f64::from(g - w).powi(2))
                .sum();
            let den: f64 = want.iter().map(|w| f64::from(*w).powi(2)).sum();
            err = err.max((num / den.max(1e-30)).sqrt());
        }
        let mut t = times[2..].to_vec();
        t.sort_by(f64::total_cmp);
        let median = t[t.len() / 2];
        println!(
            "| {label} | {median:.1} | {:.1} | {:.2} | {:.0} | {err:.1e} |",
            t[0],
            median / levels.len() as f64,
            w_bytes as f64 / (median * 1e3)
        );
        if err >= 1e-3 {
            wrong.push(label);
        }
    }
    ensure!(
        wrong.is_empty(),
        "wrong results (relative L2 >= 1e-3): {wrong:?}"
    );
    Ok(())
}
