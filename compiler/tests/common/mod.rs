//! What the compiler's GPU test binaries share: a generated kernel's pipeline and its one
//! recorded dispatch, whole-buffer bindings, timing a kernel on the device.
// Each test binary includes this module and uses a part of it.
#![allow(dead_code)]

use std::time::Duration;
use vkfuse_compiler::fuse::codegen::Generated;
use vkfuse_compiler::kernels;
use vkfuse_runtime::{
    Buffer, BufferBinding, BufferKind, CommandBuffer, DescriptorSet, Device, Instance,
    InstanceOptions, Pipeline, Requirements, SpecConstants, ValidationLog,
};

/// The default Vulkan device with the validation layer on, and the layer's log.
pub fn validated_device() -> (Device, ValidationLog) {
    let instance =
        Instance::new(&InstanceOptions::validated()).expect("Vulkan with the validation layer");
    let adapter = instance.select_adapter(None).expect("a Vulkan device");
    let device = Device::new(&instance, &adapter, &Requirements::none()).expect("device");
    (device, instance.validation_log())
}

/// A device-local buffer of `bytes` (at least 4: a buffer must have an address).
pub fn buffer(device: &Device, bytes: u64) -> Buffer {
    device
        .create_buffer(bytes.max(4), BufferKind::DeviceLocal)
        .expect("buffer")
}

/// The CPU argmax: total order over the bits (as `f32::total_cmp`), ties to the lower index.
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if v.total_cmp(&x[best]).is_gt() {
            best = i;
        }
    }
    best
}

/// A deterministic value in [-1, 1) per index and seed.
pub fn noise(i: usize, seed: u64) -> f32 {
    let mut z = (i as u64 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_add(1);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// Relative L2 distance of a device result from the CPU's f64 values.
pub fn rel_l2(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| (*a as f64 - b).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| b * b).sum();
    (num / den).sqrt()
}

/// A stacked fused matvec of one part, `rows` x `cols` of `dtype`, with no norm, no extra
/// input and the dot as its output; the step's tail (argmax, position) if `step`.
pub fn bare_matvec(
    dtype: vkfuse_compiler::ir::DType,
    rows: usize,
    cols: usize,
    step: bool,
) -> vkfuse_compiler::fuse::codegen::MatvecSpec {
    vkfuse_compiler::fuse::codegen::MatvecSpec {
        dtype,
        cols,
        part_rows: vec![rows],
        zipped: false,
        norm: None,
        extras: vec![],
        epi: vkfuse_compiler::fuse::codegen::Epi::Acc,
        step,
        x_published: false,
    }
}

/// `gen` as a schedule's kernel declaration (compiled), for what the runtime reads from one.
pub fn kernel_decl(gen: &Generated) -> vkfuse_runtime::schedule::KernelDecl {
    vkfuse_runtime::schedule::KernelDecl {
        label: gen.label.clone(),
        spirv: vkfuse_compiler::kernels::compile_source(&gen.label, &gen.source).expect("compiles"),
        bindings: gen.bindings as u32,
        push_constant_bytes: 0,
        spec_constants: gen.spec_constants.clone(),
        subgroups: None,
    }
}

/// The pipeline of a generated fused kernel, its spec constants applied in order.
pub fn generated_pipeline(device: &Device, gen: &Generated) -> Pipeline {
    let spirv = kernels::compile_source(&gen.label, &gen.source).unwrap_or_else(|e| panic!("{e}"));
    let consts = gen
        .spec_constants
        .iter()
        .enumerate()
        .fold(SpecConstants::new(), |c, (i, v)| c.u32(i as u32, *v));
    device
        .create_pipeline(&spirv, &consts, gen.bindings as u32, 0)
        .expect("pipeline")
}

/// `gen`'s one dispatch over `bufs` (buffer b at binding b), recorded once to be submitted again
/// and again (the command buffer keeps its descriptor set, and the set its pool, alive).
pub fn record_generated(
    device: &Device,
    pipeline: &Pipeline,
    gen: &Generated,
    bufs: &[Buffer],
) -> CommandBuffer {
    let pool = device
        .create_descriptor_pool(1, bufs.len() as u32)
        .expect("descriptor pool");
    let set = pool.allocate(pipeline).expect("set");
    bind_whole(device, &set, bufs);
    let mut cmd = device.create_command_buffer().expect("command buffer");
    {
        let mut rec = cmd.begin().expect("begin");
        rec.bind_pipeline(pipeline).expect("bind");
        rec.bind_descriptor_set(&set).expect("set");
        no_handoff(device, pipeline, &mut rec);
        let [x, y, z] = gen.workgroups;
        rec.dispatch(x, y, z).expect("dispatch");
        rec.finish().expect("finish");
    }
    cmd
}

/// Median GPU time (µs) of `iters` dispatches of `pipeline` over `workgroups`, each alone
/// between two timestamps with a barrier after it; dispatch i binds `sets[i % sets.len()]`
/// (buffer b at binding b), so operands rotated over copies larger than the L2 come from DRAM.
/// `None` where the device has no timestamps.
pub fn median_dispatch_us(
    device: &Device,
    pipeline: &Pipeline,
    sets: &[Vec<Buffer>],
    workgroups: [u32; 3],
    iters: u32,
    wait: Duration,
) -> Option<f64> {
    let pool_ts = device.create_timestamp_pool(2 * iters).expect("pool")?;
    let bindings: usize = sets.iter().map(Vec::len).sum();
    let dpool = device
        .create_descriptor_pool(sets.len() as u32, bindings as u32)
        .expect("descriptor pool");
    let dsets: Vec<_> = sets
        .iter()
        .map(|bufs| {
            let set = dpool.allocate(pipeline).expect("set");
            bind_whole(device, &set, bufs);
            set
        })
        .collect();
    let mut cmd = device.create_command_buffer().expect("cmd");
    {
        let mut rec = cmd.begin().expect("begin");
        rec.reset_timestamps(&pool_ts).expect("reset");
        rec.bind_pipeline(pipeline).expect("bind");
        // Set 1 and the push constants stay bound while set 0 changes.
        no_handoff(device, pipeline, &mut rec);
        for i in 0..iters {
            rec.bind_descriptor_set(&dsets[i as usize % dsets.len()])
                .expect("set");
            rec.write_timestamp(&pool_ts, 2 * i).expect("ts");
            let [x, y, z] = workgroups;
            rec.dispatch(x, y, z).expect("dispatch");
            rec.write_timestamp(&pool_ts, 2 * i + 1).expect("ts");
            rec.compute_barrier();
        }
        rec.finish().expect("finish");
    }
    device.submit_and_wait(&mut cmd, wait).expect("run");
    let mut times: Vec<f64> = (0..iters)
        .filter_map(|i| pool_ts.elapsed_ns(2 * i, 2 * i + 1).expect("ticks"))
        .collect();
    times.sort_by(f64::total_cmp);
    Some(times.get(times.len() / 2)? / 1e3)
}

/// For a pipeline with a handoff role (the fused kernels): words bound with no handoff, so
/// that it reads and writes its bindings only.
pub fn no_handoff(
    device: &Device,
    pipeline: &Pipeline,
    rec: &mut vkfuse_runtime::CommandRecorder<'_>,
) {
    if pipeline.handoff_role().is_some() {
        let words = vkfuse_runtime::HandoffWords::new(device, pipeline, 1).expect("handoff words");
        words
            .bind(rec, vkfuse_runtime::HandoffPush::NONE)
            .expect("bind handoff words");
    }
}

/// Binds buffer b of `bufs`, whole, at binding b of `set`.
pub fn bind_whole(device: &Device, set: &DescriptorSet, bufs: &[Buffer]) {
    let writes: Vec<BufferBinding> = bufs
        .iter()
        .enumerate()
        .map(|(b, buf)| BufferBinding::whole(b as u32, buf))
        .collect();
    device.write_descriptors(set, &writes).expect("writes");
}
