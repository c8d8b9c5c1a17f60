//! The kernel of each op in unfused execution: one dispatch per op (none for the aliases).
//!
//! Shapes, eps, theta and scales are specialization constants (a decode program has few
//! distinct shapes, so pipelines are shared across layers); operand dtypes are `DTYPE_<binding>`
//! defines; nothing is a push constant. The position is never a constant: kernels read it.

use super::KernelCall;
use crate::ir::{DType, OpId, OpKind, Program, Shape, Type};

/// Workgroup counts above this are split over x and y (`maxComputeWorkGroupCount[0]` is at
/// least 65535 everywhere); kernels compute `group_id = y * num_x + x` and bounds-check.
pub const MAX_WORKGROUPS_X: usize = 65535;

/// Workgroup size of the elementwise and copy kernels.
const ELEMENTWISE_WG: usize = 128;
/// Workgroup size of the delta-rule kernels (one invocation per state column).
const DELTA_WG: usize = 64;
/// Most output dims (after merging) the binary kernel handles.
const BINARY_MAX_RANK: usize = 4;

/// The ops that alias an existing buffer and have no kernel.
pub fn is_alias(kind: &OpKind) -> bool {
    matches!(
        kind,
        OpKind::Weight { .. }
            | OpKind::WeightStack { .. }
            | OpKind::ReadState { .. }
            | OpKind::Reshape { .. }
    )
}

/// The kernel for op `id` of `program` (None for weight, weight_stack, read_state, reshape).
///
/// Panics only on programs the verifier rejects, or on shapes past the kernels' documented
/// limits (binary ops needing more than 4 dims after merging, rope with rotary_dim > 256,
/// attention with head_dim > 1024, any value of 2^32 or more elements).
pub fn select(program: &Program, id: OpId) -> Option<KernelCall> {
    use OpKind::*;
    let op = program.op(id);
    if is_alias(&op.kind) {
        return None;
    }
    let arg = |i: usize| program.ty(op.args[i]);
    let out = || program.ty(op.result.expect("every op but write_state has a result"));
    let bindings = 1 + op.kind.arity();
    let call =
        |kernel: &'static str, defines: Vec<(&str, String)>, spec: Vec<u32>, groups: usize| {
            let mut defines: Vec<(String, String)> = defines
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
            defines.sort();
            KernelCall {
                kernel,
                defines,
                spec_constants: spec,
                push_constants: Vec::new(),
                workgroups: workgroups(groups),
                bindings,
            }
        };
    let elementwise = |n: usize| n.div_ceil(ELEMENTWISE_WG);
    let wg = ELEMENTWISE_WG as u32;

    Some(match &op.kind {
        Weight { .. } | WeightStack { .. } | ReadState { .. } | Reshape { .. } => unreachable!(),
        WriteState { .. } => {
            let words = arg(0).bytes().div_ceil(4);
            call("copy", vec![], vec![wg, u(words)], elementwise(words))
        }
        KvWrite { state } => {
            let cache = &program.state(*state).ty;
            let c = cache.shape.dims();
            let (hkv, cap, d) = (c[0], c[1], c[2]);
            // f16: one word (two elements) per invocation.
            let per = if cache.dtype == DType::F16 { 2 } else { 1 };
            call(
                "kv_write",
                vec![("KV_DTYPE", dtype(cache))],
                vec![wg, u(hkv), u(cap), u(d)],
                elementwise(hkv * d / per),
            )
        }
        Embedding => {
            let (v, h) = (arg(0).shape.dims()[0], arg(0).shape.dims()[1]);
            call(
                "embedding",
                vec![("DTYPE_1", dtype(arg(0)))],
                vec![wg, u(v), u(h)],
                elementwise(h),
            )
        }
        RmsNorm { eps, zero_centered } => {
            let (rows, n) = rows(&arg(0).shape);
            let spec = vec![
                row_wg(n),
                u(n),
                eps.0.to_bits(),
                u32::from(*zero_centered),
                u(rows),
            ];
            call("rms_norm", vec![("DTYPE_2", dtype(arg(1)))], spec, rows)
        }
        GatedRmsNorm { eps } => {
            let (rows, n) = rows(&arg(0).shape);
            let spec = vec![row_wg(n), u(n), eps.0.to_bits(), u(rows)];
            call(
                "gated_rms_norm",
                vec![("DTYPE_3", dtype(arg(2)))],
                spec,
                rows,
            )
        }
        L2Norm { eps } => {
            let (rows, n) = rows(&arg(0).shape);
            call(
                "l2_norm",
                vec![],
                vec![row_wg(n), u(n), eps.0.to_bits(), u(rows)],
                rows,
            )
        }
        Matvec => {
            let w = arg(0);
            let (o, i) = (w.shape.dims()[0], w.shape.dims()[1]);
            let (wg, rows) = matvec_tuning(o, w.dtype);
            let spec = vec![wg, u(o), u(i), rows, vec4(w.dtype, i)];
            call(
                "matvec",
                vec![("DTYPE_1", dtype(w))],
                spec,
                o.div_ceil(rows as usize),
            )
        }
        ExpertMatvec => {
            let w = arg(0);
            let (e, o, i) = (w.shape.dims()[0], w.shape.dims()[1], w.shape.dims()[2]);
            let k = arg(1).shape.dims()[0];
            let per_row = arg(2).shape.rank() == 2;
            let (wg, rows) = matvec_tuning(o, w.dtype);
            let spec = vec![
                wg,
                u(o),
                u(i),
                rows,
                vec4(w.dtype, i),
                u(e),
                u(k),
                u32::from(per_row),
            ];
            call(
                "expert_matvec",
                vec![("DTYPE_1", dtype(w))],
                spec,
                k * o.div_ceil(rows as usize),
            )
        }
        Add | Mul | Div => {
            let name = match op.kind {
                Add => "ADD",
                Mul => "MUL",
                _ => "DIV",
            };
            let out = out();
            let (dims, sa, sb) = broadcast_strides(&out.shape, &arg(0).shape, &arg(1).shape);
            let n = out.shape.numel();
            let mut spec = vec![wg, u(n)];
            spec.extend(dims.iter().chain(&sa).chain(&sb).map(|&x| u(x)));
            let defines = vec![
                ("DTYPE_1", dtype(arg(0))),
                ("DTYPE_2", dtype(arg(1))),
                ("OP", name.into()),
            ];
            call("binary", defines, spec, elementwise(n))
        }
        Silu | Sigmoid | Softplus | Exp | Neg => {
            let name = match op.kind {
                Silu => "SILU",
                Sigmoid => "SIGMOID",
                Softplus => "SOFTPLUS",
                Exp => "EXP",
                _ => "NEG",
            };
            let n = arg(0).shape.numel();
            call(
                "unary",
                vec![("DTYPE_1", dtype(arg(0))), ("OP", name.into())],
                vec![wg, u(n)],
                elementwise(n),
            )
        }
        Rope { theta, rotary_dim } => {
            let (heads, d) = (arg(0).shape.dims()[0], arg(0).shape.dims()[1]);
            let half = rotary_dim / 2;
            assert!(
                half <= vkfuse_kernels::ROPE_MAX_HALF,
                "rope: rotary_dim {rotary_dim} is past the kernel's {}",
                2 * vkfuse_kernels::ROPE_MAX_HALF
            );
            let mut spec = vec![wg, u(heads), u(d), u(*rotary_dim)];
            spec.extend(
                rope_inv_freq(theta.0, *rotary_dim)
                    .iter()
                    .map(|f| f.to_bits()),
            );
            call("rope", vec![], spec, elementwise(heads * d))
        }
        Slice { axis, start, end } => {
            let x = arg(0);
            let (outer, len, inner) = around(&x.shape, *axis);
            let n = outer * (end - start) * inner;
            let spec = vec![wg, u(outer), u(len), u(*start), u(end - start), u(inner)];
            call(
                "slice",
                vec![("DTYPE_1", dtype(x))],
                spec,
                elementwise(words(x.dtype, n)),
            )
        }
        Concat { axis } => {
            let (a, b) = (arg(0), arg(1));
            let (outer, la, inner) = around(&a.shape, *axis);
            let lb = b.shape.dims()[*axis];
            let n = outer * (la + lb) * inner;
            let spec = vec![wg, u(outer), u(la * inner), u(lb * inner)];
            let defines = vec![("DTYPE_1", dtype(a)), ("DTYPE_2", dtype(b))];
            call("concat", defines, spec, elementwise(words(a.dtype, n)))
        }
        Attention { scale } => {
            let (hq, d) = (arg(0).shape.dims()[0], arg(0).shape.dims()[1]);
            let (hkv, cap) = (arg(1).shape.dims()[0], arg(1).shape.dims()[1]);
            let wg = attention_wg(d);
            call(
                "attention",
                vec![("KV_DTYPE", dtype(arg(1)))],
                vec![wg, u(hq), u(hkv), u(cap), u(d), scale.0.to_bits()],
                hq,
            )
        }
        CausalConv1d => {
            let (c, km1) = (arg(0).shape.dims()[0], arg(0).shape.dims()[1]);
            call(
                "causal_conv1d",
                vec![("DTYPE_3", dtype(arg(2)))],
                vec![wg, u(c), u(km1)],
                elementwise(c),
            )
        }
        ConvShift => {
            let (c, km1) = (arg(0).shape.dims()[0], arg(0).shape.dims()[1]);
            call(
                "conv_shift",
                vec![],
                vec![wg, u(c), u(km1)],
                elementwise(c * km1),
            )
        }
        DeltaRuleUpdate => {
            let s = arg(0).shape.dims();
            let (hv, dk, dv, hk) = (s[0], s[1], s[2], arg(1).shape.dims()[0]);
            let spec = vec![DELTA_WG as u32, u(hv), u(hk), u(dk), u(dv)];
            call(
                "delta_rule_update",
                vec![],
                spec,
                hv * dv.div_ceil(DELTA_WG),
            )
        }
        DeltaRuleReadout { scale } => {
            let s = arg(0).shape.dims();
            let (hv, dk, dv, hk) = (s[0], s[1], s[2], arg(1).shape.dims()[0]);
            let spec = vec![
                DELTA_WG as u32,
                u(hv),
                u(hk),
                u(dk),
                u(dv),
                scale.0.to_bits(),
            ];
            call(
                "delta_rule_readout",
                vec![],
                spec,
                hv * dv.div_ceil(DELTA_WG),
            )
        }
        Softmax => {
            let (rows, n) = rows(&arg(0).shape);
            call("softmax", vec![], vec![row_wg(n), u(n), u(rows)], rows)
        }
        TopK { k } => {
            let n = arg(0).shape.numel();
            call("top_k", vec![], vec![row_wg(n), u(n), u(*k)], 1)
        }
        Gather => {
            let (n, k) = (arg(0).shape.numel(), arg(1).shape.numel());
            call("gather", vec![], vec![wg, u(n), u(k)], elementwise(k))
        }
        Sum { axis } => {
            let (outer, len, inner) = around(&arg(0).shape, *axis);
            if inner == 1 {
                call(
                    "sum",
                    vec![],
                    vec![row_wg(len), u(outer), u(len), u(inner), 1],
                    outer,
                )
            } else {
                call(
                    "sum",
                    vec![],
                    vec![wg, u(outer), u(len), u(inner), 0],
                    elementwise(outer * inner),
                )
            }
        }
        Argmax => {
            let n = arg(0).shape.numel();
            let wg = u(n.div_ceil(4).next_power_of_two().clamp(32, 1024));
            call("argmax", vec![], vec![wg, u(n)], 1)
        }
        Increment => call("increment", vec![], vec![1], 1),
    })
}

/// `n` as a u32 (kernels index with 32 bits).
fn u(n: usize) -> u32 {
    u32::try_from(n).expect("kernels index values of fewer than 2^32 elements")
}

/// The define value of a dtype, as `common.glsl` names it.
fn dtype(t: &Type) -> String {
    match t.dtype {
        DType::F32 => "F32",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        DType::I32 => "I32",
        DType::Q8_0 => "Q8_0",
        DType::Q4_0 => "Q4_0",
    }
    .to_string()
}

/// Workgroup counts, split over x and y past [`MAX_WORKGROUPS_X`]; never zero.
fn workgroups(n: usize) -> [u32; 3] {
    let n = n.max(1);
    if n <= MAX_WORKGROUPS_X {
        [u(n), 1, 1]
    } else {
        [u(MAX_WORKGROUPS_X), u(n.div_ceil(MAX_WORKGROUPS_X)), 1]
    }
}

/// Workgroup size of a kernel reducing rows of `n`: a power of two in 32..=256.
fn row_wg(n: usize) -> u32 {
    u(n.next_power_of_two().clamp(32, 256))
}

/// Workgroup size and rows per workgroup of a matvec (plain, expert or fused) of `o` rows.
pub(crate) fn matvec_tuning(o: usize, w: DType) -> (u32, u32) {
    // Rows per workgroup trade loads in flight per invocation (more rows) against workgroups
    // to spread over the device (fewer rows): 2 below 4096 output rows, 4 from there; 8 for
    // q4_0, whose rows are the shortest, and for 16-bit floats (an H200, the Qwen3-0.6B shape,
    // where that is the stacked q/k/v's 4096 rows; the chained gate/up has its own grid: q4_0
    // +1.2% tokens/s with f32 dots and with f16 ones, q8_0 -1.7% and -3.3%, docs/perf.md
    // session 38; bf16 +0.9%, and +1.7 to +2.5% with the attention block's subgroup walk
    // that goes with it, session 41; q8_0 with the walk -2.2%; 5, 6 or 7 rows lost 4-11%).
    let large = match w {
        DType::Q4_0 | DType::BF16 | DType::F16 => 8,
        _ => 4,
    };
    let (wg, small, large) = tuning_override().unwrap_or((128, 2, large));
    // Vocabulary-sized (lm_head: Qwen3-0.6B's ~38k workgroups at 4 rows, in waves): 8 rows
    // for block-quantised weights, whose rows are short (H100: lm_head q8_0 92.7 -> 84.4 µs,
    // q4_0 101.9 -> 85.8 µs); 16-bit ones already stream at the copy bandwidth and lose with 8
    // (105.7 -> 108.2).
    let huge = huge_rows().unwrap_or(if w.is_quantized() { 8 } else { large });
    let rows = match o {
        0..=1 => 1,
        2..=4095 => small,
        4096..=65535 => large,
        _ => huge,
    };
    // Block-quantised vocabulary-sized ones in two subgroups per workgroup: two steps of 8
    // weights per invocation and row. On the H100 with the driver's bounds checks one subgroup
    // won (lm_head q4_0: 128 invocations 85.6 µs, 64 73.1, 32 71.2; q8_0: 128 83.8, 64 77.7, 32
    // 80.7 but +0.4% tokens/s); without them (session 55), on an H200, 64 beat 32: q4_0 +0.23
    // and +0.49% tokens/s, q8_0 +0.30%, and +0.89% with its argmax atomics filtered, which lost
    // at 32 (codegen::matvec's STEP_FILTER; 128: q8_0 +0.25%, q4_0 -1.24%; docs/perf.md session
    // 57). One subgroup a workgroup meets the SM's limit of 32 workgroups at 32 warps; two
    // keep 40 resident (q8_0's lm_head 56.7 -> 50.1 µs). Whole 32-weight blocks per invocation
    // (16-byte code loads, x once per block) measured slower: 104.8 µs.
    let huge_wg = if w.is_quantized() { 64 } else { wg };
    let wg = match o {
        0..=65535 => wg,
        _ => knob("VKFUSE_MATVEC_HUGE_WG")
            .filter(|w| w.is_power_of_two() && (32..=512).contains(w))
            .unwrap_or(huge_wg),
    };
    (wg, rows)
}

/// The subgroup width of the device class schedules are compiled for (NVIDIA's 32): the
/// compile-time workgroup sizes above are measured in it.
pub const CLASS_SUBGROUP: u32 = 32;

/// The subgroups per workgroup a matvec-family kernel with these specialization constants
/// (constant 0: its compiled workgroup size) keeps on every device: its grid does not depend
/// on the size, so the runtime chooses the size at load from the device's subgroup width
/// (`KernelDecl::subgroups`): 128 invocations on a 32-wide device are 4 subgroups, 32
/// invocations on lavapipe's 8-wide ones, 256 on 64-wide.
pub fn matvec_subgroups(spec_constants: &[u32]) -> Option<u32> {
    let &wg = spec_constants.first()?;
    (wg >= CLASS_SUBGROUP && wg.is_multiple_of(CLASS_SUBGROUP)).then_some(wg / CLASS_SUBGROUP)
}

/// A numeric A/B knob read at compile time (unset or malformed: None).
pub(crate) fn knob(name: &str) -> Option<u32> {
    std::env::var(name).ok()?.trim().parse().ok()
}

/// `VKFUSE_MATVEC_HUGE_ROWS=r` (1..=8): rows per workgroup of matvecs of 65536 rows or more
/// (lm_head), the A/B knob of their H100 measurement, read at compile time
/// (`VKFUSE_MATVEC_HUGE_WG=wg`, a power of two in 32..=512: their workgroup size).
fn huge_rows() -> Option<u32> {
    knob("VKFUSE_MATVEC_HUGE_ROWS").filter(|r| (1..=8).contains(r))
}

/// `VKFUSE_MATVEC_TUNING=wg,rows_below_4096,rows_from_4096` (wg a power of two in 32..=512,
/// rows in 1..=8): the A/B knob the H100 measurements of docs/perf.md compare variants with,
/// inside one compile-model run each. Malformed values are ignored (the defaults apply).
fn tuning_override() -> Option<(u32, u32, u32)> {
    let v = std::env::var("VKFUSE_MATVEC_TUNING").ok()?;
    let n: Vec<u32> = v
        .split(',')
        .map(|x| x.trim().parse().ok())
        .collect::<Option<_>>()?;
    match n[..] {
        [wg, a, b]
            if wg.is_power_of_two()
                && (32..=512).contains(&wg)
                && [a, b].iter().all(|r| (1..=8).contains(r)) =>
        {
            Some((wg, a, b))
        }
        _ => None,
    }
}

/// Whether matvec rows and the input are 16-byte aligned (f32: I % 4, 16-bit: I % 8; the
/// block formats' rows always are, and their I is a multiple of 32).
pub(crate) fn vec4(w: DType, i: usize) -> u32 {
    if w.is_quantized() {
        return 1;
    }
    let per_16_bytes = 16 / w.size();
    u32::from(i.is_multiple_of(per_16_bytes))
}

/// Attention workgroup: the tile is a quarter of it (4 invocations per position's score), and
/// it must hold D invocations for the value phase. Large, as one workgroup serves a query head.
fn attention_wg(d: usize) -> u32 {
    assert!(
        d <= 1024,
        "attention: head_dim {d} is past the kernel's 1024"
    );
    1024
}

/// `(rows, n)`: the innermost axis and how many rows of it.
fn rows(s: &Shape) -> (usize, usize) {
    let n = s.last().max(1);
    (s.numel() / n, n)
}

/// `(outer, len, inner)` around `axis`.
fn around(s: &Shape, axis: usize) -> (usize, usize, usize) {
    let d = s.dims();
    (
        d[..axis].iter().product(),
        d[axis],
        d[axis + 1..].iter().product(),
    )
}

/// 32-bit words holding `n` elements of `dtype` (16-bit dtypes: two per word).
fn words(dtype: DType, n: usize) -> usize {
    if dtype.size() == 2 {
        n.div_ceil(2)
    } else {
        n
    }
}

/// inv_freq of rope, computed exactly as the reference does (f32 `powf`), so the device sees
/// bit-identical angles.
pub(crate) fn rope_inv_freq(theta: f32, rotary_dim: usize) -> Vec<f32> {
    (0..rotary_dim / 2)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / rotary_dim as f32))
        .collect()
}

/// Output dims and element strides of `a` and `b` for a broadcast binary op, merged where
/// adjacent dims broadcast alike and left-padded to [`BINARY_MAX_RANK`] (stride 0 = broadcast).
fn broadcast_strides(out: &Shape, a: &Shape, b: &Shape) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
    let rank = out.rank();
    let pad = |s: &Shape| -> Vec<usize> {
        let mut d = vec![1; rank - s.rank()];
        d.extend_from_slice(s.dims());
        d
    };
    let (pa, pb) = (pad(a), pad(b));
    // (size, a present, b present) per output dim of size > 1, merged when both flags agree.
    let mut merged: Vec<(usize, bool, bool)> = Vec::new();
    for i in 0..rank {
        let n = out.dims()[i];
        if n == 1 {
            continue;
        }
        let (ha, hb) = (pa[i] != 1, pb[i] != 1);
        match merged.last_mut() {
            Some(last) if last.1 == ha && last.2 == hb => last.0 *= n,
            _ => merged.push((n, ha, hb)),
        }
    }
    assert!(
        merged.len() <= BINARY_MAX_RANK,
        "binary op over {out} ({a} with {b}) needs {} dims after merging; the kernel takes {BINARY_MAX_RANK}",
        merged.len()
    );
    let strides = |present: fn(&(usize, bool, bool)) -> bool| -> Vec<usize> {
        let mut s = vec![0; merged.len()];
        let mut step = 1;
        for (i, m) in merged.iter().enumerate().rev() {
            if present(m) {
                s[i] = step;
                step *= m.0;
            }
        }
        s
    };
    let (sa, sb) = (strides(|m| m.1), strides(|m| m.2));
    let lead = BINARY_MAX_RANK - merged.len();
    let left_pad = |v: Vec<usize>, fill: usize| -> Vec<usize> {
        let mut p = vec![fill; lead];
        p.extend(v);
        p
    };
    (
        left_pad(merged.iter().map(|m| m.0).collect(), 1),
        left_pad(sa, 0),
        left_pad(sb, 0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: &[usize]) -> Shape {
        Shape::new(d)
    }

    #[test]
    fn broadcast_merges_dims_that_broadcast_alike() {
        // Same shapes collapse to one contiguous dim.
        let (d, a, b) = broadcast_strides(&s(&[2, 3, 4]), &s(&[2, 3, 4]), &s(&[2, 3, 4]));
        assert_eq!(
            (d, a, b),
            (vec![1, 1, 1, 24], vec![0, 0, 0, 1], vec![0, 0, 0, 1])
        );
        // A row vector against a matrix.
        let (d, a, b) = broadcast_strides(&s(&[5, 7]), &s(&[5, 7]), &s(&[7]));
        assert_eq!(
            (d, a, b),
            (vec![1, 1, 5, 7], vec![0, 0, 7, 1], vec![0, 0, 0, 1])
        );
        // A column against a row: both broadcast.
        let (d, a, b) = broadcast_strides(&s(&[3, 4]), &s(&[3, 1]), &s(&[1, 4]));
        assert_eq!(
            (d, a, b),
            (vec![1, 1, 3, 4], vec![0, 0, 1, 0], vec![0, 0, 0, 1])
        );
        // Size-1 output dims vanish.
        let (d, a, b) = broadcast_strides(&s(&[1, 6]), &s(&[1, 6]), &s(&[1]));
        assert_eq!(
            (d, a, b),
            (vec![1, 1, 1, 6], vec![0, 0, 0, 1], vec![0, 0, 0, 0])
        );
    }

    #[test]
    fn large_dispatches_split_over_y() {
        assert_eq!(workgroups(0), [1, 1, 1]);
        assert_eq!(workgroups(65535), [65535, 1, 1]);
        assert_eq!(workgroups(151_936), [65535, 3, 1]);
    }
}
