//! Weight prefetch into the L2 cache: a level that streams no weights of its own and holds a
//! host ([`Role::hosts`]: the attention block, bound by latency, the memory otherwise idle for
//! ~10 µs per layer on an H100) gets one more dispatch, in the same
//! level and so without a barrier, that reads the weights of the (at most three) matvec levels
//! right after it, every weight slice they bind, in order (kernels/glsl/prefetch.comp). Those
//! levels then find their weights in L2 instead of paying DRAM latency and bandwidth after
//! their barrier.
//!
//! Bounded by [`Prefetch::budget`] and skipped under [`Prefetch::min`] (tiny models gain
//! nothing but a dispatch). What it reads depends on the matvec weights' format
//! ([`Prefetch::for_weights`]), as measured on an H100 (docs/perf.md, session 18):
//! - 16-bit floats: 14 MiB, o_proj, the chained MLP's down and the first half of the next
//!   q/k/v, but not the chained MLP's gate/up. The chained kernel loads those into registers
//!   itself while it waits for o_proj (fused_chain.glsl's PRE_STEPS, `codegen::preload_steps`),
//!   so in L2 they only took the budget: bf16 +5.3% at 256 tokens, +4.7% at 1024, +2.5% at 3000
//!   over 8 MiB of o_proj and gate/up's first part. More than 14 MiB slows the attention block
//!   beside it.
//! - Block formats: gate/up included (without it −0.3..−0.5%). q4_0 12 MiB, a layer's o_proj,
//!   MLP and the next q/k/v whole: +0.85% over 8 MiB (session 18), level with 8 and 16 since.
//!   q8_0 beside the attention block's bands (`fuse::bands`, session 19), whose smaller grids at
//!   short positions leave the prefetch room: 14 MiB, o_proj, the MLP and the next q/k/v's
//!   first part, +3.6% at 256 tokens, +2.9% at 1024 and +1.1% at 3000 over 12 MiB. Without
//!   bands 12 MiB (session 18: more lost 1.5%, and still does).
//! - f32 (whose chained kernel preloads nothing; not measured since): 8 MiB, gate/up included,
//!   the choice before session 18.
//!
//! The third level after a layer's last attention block is the lm_head, whose first rows the
//! rest of the budget reads.
//!
//! Norm weights ([`is_norm_weight`]) are read even past the budget and do not count against
//! it: every workgroup of their matvec waits on them before its first dot, and where the budget
//! ran out on the matrix before them (q8_0's and bf16's next q/k/v) they came from DRAM. On an
//! H200 (three calls): bf16 +0.26..+0.34%, q8_0 +0.22..+0.37%, q4_0 (whose budget already held
//! them) +0.00..+0.06% (docs/perf.md, session 35).

use crate::ir::{DType, OpKind, Program};
use crate::kernels::{KernelCall, KernelError, MAX_WORKGROUPS_X};
use crate::lower::{declare_kernel, SpirvCache};
use std::collections::HashMap;
use std::ops::Range;
use vkfuse_runtime::schedule::{BufferId, Dispatch, KernelDecl, KernelId, Slice};

/// How much to prefetch beside weight-free levels, and what.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefetch {
    /// The most bytes one prefetch reads (0: none).
    pub budget: u64,
    /// The fewest bytes worth a prefetch dispatch.
    pub min: u64,
    /// Whether a chained kernel's inner weights (binding 1, gate/up) are read too.
    pub chain_inner: bool,
}

impl Default for Prefetch {
    /// The choice for 16-bit float weights (checkpoints' usual bf16).
    fn default() -> Self {
        Prefetch::for_weights(DType::BF16, false)
    }
}

impl Prefetch {
    /// The choice for matvec weights of `dtype` (see the top), `banded` where the attention
    /// block has bands.
    pub fn for_weights(dtype: DType, banded: bool) -> Self {
        let (mib, chain_inner) = match dtype {
            DType::Q8_0 if banded => (14, true),
            DType::Q8_0 => (12, true),
            DType::Q4_0 => (12, true),
            DType::F16 | DType::BF16 => (14, false),
            DType::F32 | DType::I32 => (8, true),
        };
        Prefetch {
            budget: mib << 20,
            min: 1 << 20,
            chain_inner,
        }
    }

    /// The choice for `program`'s matvec weights ([`matvec_dtype`]), `banded` where its
    /// attention block has bands.
    pub fn for_program(program: &Program, banded: bool) -> Self {
        Prefetch::for_weights(matvec_dtype(program), banded)
    }
}

/// The format of `program`'s matvec weights, which several of the compiler's measured choices
/// follow: a block format where any matrix is stored in one (`--weights q8_0|q4_0`: a matrix
/// whose rows are not whole blocks keeps its dtype), else BF16 where any matrix is in a 16-bit
/// float, else F32.
pub fn matvec_dtype(program: &Program) -> DType {
    let matrices: Vec<DType> = program
        .ops
        .iter()
        .filter(|op| matches!(op.kind, OpKind::Weight { .. }))
        .filter_map(|op| op.result.map(|v| program.ty(v)))
        .filter(|ty| ty.shape.dims().len() == 2)
        .map(|ty| ty.dtype)
        .collect();
    if let Some(&q) = matrices.iter().find(|d| d.is_quantized()) {
        q
    } else if matrices
        .iter()
        .any(|&d| d == DType::F16 || d == DType::BF16)
    {
        DType::BF16
    } else {
        DType::F32
    }
}

/// A kernel's part in the prefetches: a target streaming weights from binding 1 (matvecs), or
/// from binding 1 (inner, gate/up) and later ones (outer, down) (chained matvecs); or a host,
/// bound by latency and long enough that a prefetch beside it ends with it (the attention
/// block, whose caches the K/V prefetch reads). The linear-attention step hosts none since it
/// reads its projection as handoff words: it then runs beside the projection's last rows, and
/// a prefetch beside it streams while they do (qwen3-next-small on an H200 without it: bf16
/// +0.14%, q8_0 +0.60%, q4_0 +0.47%; docs/perf.md, session 49).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Matvec,
    Chain,
    /// An attention block with `heads` kv heads of `capacity` slots in its caches.
    Attention {
        heads: u32,
        capacity: u32,
    },
}

impl Role {
    /// Whether the kernel streams weights (a prefetch target).
    pub fn streams(self) -> bool {
        matches!(self, Role::Matvec | Role::Chain)
    }

    /// Whether a prefetch may run beside the kernel.
    pub fn hosts(self) -> bool {
        matches!(self, Role::Attention { .. })
    }
}

/// Weight bytes a level's kernels other than its hosts may bind and still count as streaming
/// none (norm weights).
const WEIGHT_FREE: u64 = 64 << 10;
/// Matvec levels after the weight-free one whose weights it may read: a dense layer's o_proj,
/// its MLP and the next layer's q/k/v. Further ahead, the data would wait longer in L2.
const LEVELS_AHEAD: usize = 3;
/// Slices one prefetch dispatch binds (prefetch.comp's bindings).
const MAX_SLICES: usize = 8;
/// Prefetch workgroup size, and sectors each invocation reads (on an H100, 8 beat 2, 4 and 32:
/// fewer workgroups take longer than the attention block beside them, more crowd it; on an
/// H200 with the chained MLP needing whole SMs, 4, 6, 12 and 16 each lost or were level:
/// docs/perf.md, session 54).
pub(super) const WG: u32 = 256;
pub(super) const SECTORS_PER_INVOCATION: u64 = 8;

/// The weight slices to prefetch beside each weight-free level that holds a host: (level,
/// slices). `roles`: the kernels that stream weights, and how, and the hosts. The slices follow
/// the levels' order, and each dispatch's bindings in theirs (a chain's inner weights left out
/// unless [`Prefetch::chain_inner`]), until the budget runs out or a level does not stream.
///
/// Only beside a host: the levels after a prefetch wait for it where a barrier follows, so
/// beside a short level (Qwen3-Next's attention gate, an elementwise kernel of 16
/// workgroups) the prefetch only lengthened it. On an H200 (the qwen3-next-small shape, 256
/// tokens) the weight prefetch beside the gate cost about 2.1% bf16, 1.8% q4_0 and 0.5% q8_0,
/// while beside the linear-attention steps it gained 0.4% bf16, 1.1% q4_0 and 0.5% q8_0
/// (docs/perf.md, session 45), until the steps ran beside their projections (session 49).
pub fn plan(
    dispatches: &[Dispatch],
    levels: &[Range<u32>],
    roles: &HashMap<KernelId, Role>,
    weights: BufferId,
    opts: Prefetch,
) -> Vec<(usize, Vec<Slice>)> {
    let of = |l: &Range<u32>| &dispatches[l.start as usize..l.end as usize];
    let weight_bytes = |ds: &[&Dispatch]| -> u64 {
        ds.iter()
            .flat_map(|d| &d.bindings)
            .filter(|b| b.buffer == weights)
            .map(|b| b.size)
            .sum()
    };
    let mut out = vec![];
    if opts.budget == 0 {
        return out;
    }
    let role = |d: &Dispatch| roles.get(&d.kernel).copied();
    for (i, l) in levels.iter().enumerate() {
        let hosted = of(l).iter().any(|d| role(d).is_some_and(Role::hosts));
        let streaming = of(l).iter().any(|d| role(d).is_some_and(Role::streams));
        // The hosts' own weights (the attention block's norms) do not make a level a streaming
        // one.
        let others: Vec<&Dispatch> = of(l)
            .iter()
            .filter(|d| !role(d).is_some_and(Role::hosts))
            .collect();
        if !hosted || streaming || weight_bytes(&others) > WEIGHT_FREE {
            continue;
        }
        let mut slices: Vec<Slice> = vec![];
        let mut left = opts.budget;
        'next: for next in levels[i + 1..].iter().take(LEVELS_AHEAD) {
            for d in of(next) {
                // Only levels streaming weights (binding 1 first).
                let kind = match (role(d), d.bindings.get(1)) {
                    (Some(kind), Some(w)) if kind.streams() && w.buffer == weights => kind,
                    _ => break 'next,
                };
                let skip = usize::from(kind == Role::Chain && !opts.chain_inner);
                for w in d.bindings[1..]
                    .iter()
                    .filter(|b| b.buffer == weights)
                    .skip(skip)
                {
                    if slices.len() == MAX_SLICES {
                        break 'next;
                    }
                    // A norm weight is read even past the budget, which it does not count
                    // against: its matvec's workgroups all wait on it before their first dot,
                    // from DRAM where the budget ran out on the matrix before it (q8_0's and
                    // bf16's next q/k/v).
                    let small = is_norm_weight(w, &d.bindings[1]);
                    // Whole 32-byte sectors, the last matrix cut to the budget: a matrix partly
                    // in L2 still shortens its level (bf16's next q/k/v; whole matrices only
                    // lost bf16 0.4-1.2% on an H100, docs/perf.md session 18).
                    let size = if small { w.size } else { w.size.min(left) } / 32 * 32;
                    if size > 0 {
                        slices.push(Slice { size, ..*w });
                        if !small {
                            left -= size;
                        }
                    }
                }
            }
        }
        let bytes: u64 = slices.iter().map(|s| s.size).sum();
        if bytes >= opts.min.max(1) {
            out.push((i, slices));
        }
    }
    out
}

/// Whether weight slice `w` of a streaming kernel whose first matrix is `first` is a norm
/// weight (or another vector beside its matrices): a sixteenth of that matrix or less, where a
/// vector is one row against the matrix's rows and the chained kernel's down projection is half
/// its gate/up.
pub fn is_norm_weight(w: &Slice, first: &Slice) -> bool {
    w.size.saturating_mul(16) <= first.size
}

/// Adds the dispatches of `plan` (writing to `sink`, 4 bytes) to their levels, and their
/// kernels to `kernels`.
pub fn add(
    dispatches: &mut Vec<Dispatch>,
    levels: &mut [Range<u32>],
    kernels: &mut Vec<KernelDecl>,
    plan: Vec<(usize, Vec<Slice>)>,
    sink: Slice,
    spirv: &mut SpirvCache,
) -> Result<(), KernelError> {
    let mut added = Vec::with_capacity(plan.len());
    for (at, slices) in plan {
        added.push((at, Place::Last, dispatch(kernels, &slices, sink, spirv)?));
    }
    insert(dispatches, levels, added);
    Ok(())
}

/// Where in its level an added dispatch is recorded (and so launched: NVIDIA launches a
/// level's dispatches in order, each as the ones before it leave room).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    First,
    Last,
}

/// Adds each `(level, place, dispatch)` of `added` (levels ascending, one per level) to its
/// level, renumbering the levels after it.
pub(super) fn insert(
    dispatches: &mut Vec<Dispatch>,
    levels: &mut [Range<u32>],
    added: Vec<(usize, Place, Dispatch)>,
) {
    let mut shift = 0u32;
    let mut added = added.into_iter().peekable();
    let mut out = Vec::with_capacity(dispatches.len() + added.len());
    let old = std::mem::take(dispatches);
    let mut old = old.into_iter();
    for (i, l) in levels.iter_mut().enumerate() {
        let n = l.end - l.start;
        l.start += shift;
        l.end += shift;
        let (first, last) = match added.next_if(|(at, _, _)| *at == i) {
            Some((_, Place::First, d)) => (Some(d), None),
            Some((_, Place::Last, d)) => (None, Some(d)),
            None => (None, None),
        };
        if first.is_some() || last.is_some() {
            l.end += 1;
            shift += 1;
        }
        out.extend(first);
        out.extend(old.by_ref().take(n as usize));
        out.extend(last);
    }
    debug_assert!(
        added.peek().is_none(),
        "added dispatches out of level order, or two in one level"
    );
    out.extend(old);
    *dispatches = out;
}

/// The prefetch dispatch of `slices`.
fn dispatch(
    decls: &mut Vec<KernelDecl>,
    slices: &[Slice],
    sink: Slice,
    spirv: &mut SpirvCache,
) -> Result<Dispatch, KernelError> {
    let sectors: Vec<u64> = slices.iter().map(|s| s.size / 32).collect();
    let total: u64 = sectors.iter().sum();
    // Each invocation strides over the sectors, so any count reads them all.
    let groups = total
        .div_ceil(WG as u64 * SECTORS_PER_INVOCATION)
        .clamp(1, MAX_WORKGROUPS_X as u64) as u32;
    let mut spec = vec![WG];
    spec.extend(sectors.iter().map(|&s| s as u32));
    let call = KernelCall {
        kernel: "prefetch",
        defines: vec![("PF_SLICES".into(), slices.len().to_string())],
        spec_constants: spec.clone(),
        push_constants: vec![],
        workgroups: [groups, 1, 1],
        bindings: 1 + slices.len(),
    };
    let label = format!("prefetch[PF_SLICES={}]", slices.len());
    let kernel = declare_kernel(decls, label, spec, call.bindings, || spirv.get(&call))?;
    let mut bindings = vec![sink];
    bindings.extend_from_slice(slices);
    Ok(Dispatch {
        kernel,
        bindings,
        push_constants: vec![],
        workgroups: call.workgroups,
        label: format!(
            "prefetch into L2: {:.1} MB of the next levels' weights",
            total as f64 * 32.0 / 1e6
        ),
        alternatives: vec![],
        ops: vec![],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: BufferId = BufferId(0);
    const ARENA: BufferId = BufferId(1);
    const MIB: u64 = 1 << 20;

    fn slice(buffer: BufferId, offset: u64, size: u64) -> Slice {
        Slice {
            buffer,
            offset,
            size,
        }
    }

    /// A dispatch of kernel `k` binding the arena (binding 0) then `bindings`.
    fn dispatch(k: u32, bindings: &[Slice]) -> Dispatch {
        let mut all = vec![slice(ARENA, 0, 4096)];
        all.extend_from_slice(bindings);
        Dispatch {
            kernel: KernelId(k),
            bindings: all,
            push_constants: vec![],
            workgroups: [1, 1, 1],
            label: String::new(),
            alternatives: vec![],
            ops: vec![],
        }
    }

    /// One dispatch per level: an attention block (kernel 0, no weights), o_proj (kernel 1),
    /// a chain (kernel 2: gate/up, its norm weight, the arena, down), q/k/v (kernel 1), then
    /// another matvec (kernel 1) four levels past the block.
    fn layer() -> (Vec<Dispatch>, Vec<Range<u32>>) {
        let ds = vec![
            dispatch(0, &[slice(ARENA, 0, 4096), slice(W, 0, 2048)]),
            dispatch(1, &[slice(W, 0, MIB)]),
            dispatch(
                2,
                &[
                    slice(W, MIB, 3 * MIB),
                    slice(ARENA, 0, 4096),
                    slice(W, 4 * MIB, 2048),
                    slice(W, 5 * MIB, 2 * MIB),
                ],
            ),
            dispatch(1, &[slice(W, 7 * MIB, 2 * MIB)]),
            dispatch(1, &[slice(W, 9 * MIB, MIB)]),
        ];
        let levels = (0..ds.len() as u32).map(|i| i..i + 1).collect();
        (ds, levels)
    }

    /// The attention block hosts (kernel 0), o_proj and q/k/v (kernel 1) and the chain
    /// (kernel 2) stream.
    fn roles() -> HashMap<KernelId, Role> {
        [
            (
                KernelId(0),
                Role::Attention {
                    heads: 1,
                    capacity: 1,
                },
            ),
            (KernelId(1), Role::Matvec),
            (KernelId(2), Role::Chain),
        ]
        .into_iter()
        .collect()
    }

    fn budget(budget: u64, chain_inner: bool) -> Prefetch {
        Prefetch {
            budget,
            min: 1,
            chain_inner,
        }
    }

    #[test]
    fn every_weight_matrix_of_three_levels_in_order() {
        let (ds, levels) = layer();
        let opts = budget(64 * MIB, true);
        let plan = plan(&ds, &levels, &roles(), W, opts);
        assert_eq!(plan.len(), 1, "only the attention level streams nothing");
        let (at, slices) = &plan[0];
        assert_eq!(*at, 0);
        // o_proj; gate/up, the chain's norm weight and down, in binding order, not the arena;
        // q/k/v; and not the matvec a fourth level ahead.
        assert_eq!(
            slices,
            &vec![
                slice(W, 0, MIB),
                slice(W, MIB, 3 * MIB),
                slice(W, 4 * MIB, 2048),
                slice(W, 5 * MIB, 2 * MIB),
                slice(W, 7 * MIB, 2 * MIB),
            ]
        );
    }

    #[test]
    fn without_chain_inner_the_chain_gives_its_outer_weights_only() {
        let (ds, levels) = layer();
        let plan = plan(&ds, &levels, &roles(), W, budget(64 * MIB, false));
        // The chain's gate/up (its binding 1) is left out; its norm weight and down are read,
        // and the levels around it as before.
        assert_eq!(
            plan[0].1,
            vec![
                slice(W, 0, MIB),
                slice(W, 4 * MIB, 2048),
                slice(W, 5 * MIB, 2 * MIB),
                slice(W, 7 * MIB, 2 * MIB),
            ]
        );
    }

    #[test]
    fn the_budget_cuts_the_last_matrix_to_whole_sectors_and_norm_weights_pass_it() {
        let (ds, levels) = layer();
        let opts = budget(2 * MIB + 100, true);
        let plan = plan(&ds, &levels, &roles(), W, opts);
        let cut = (MIB + 100) / 32 * 32;
        // o_proj, then gate/up cut; past the budget only the chain's norm weight, not its
        // down or the next q/k/v.
        assert_eq!(
            plan[0].1,
            vec![
                slice(W, 0, MIB),
                slice(W, MIB, cut),
                slice(W, 4 * MIB, 2048)
            ]
        );
        // A norm weight does not count against the budget: with exactly o_proj's and
        // gate/up's bytes, down is not read.
        let plan = super::plan(&ds, &levels, &roles(), W, budget(4 * MIB, true));
        assert_eq!(
            plan[0].1,
            vec![
                slice(W, 0, MIB),
                slice(W, MIB, 3 * MIB),
                slice(W, 4 * MIB, 2048)
            ]
        );
    }

    #[test]
    fn a_level_that_does_not_stream_ends_the_walk() {
        let (mut ds, levels) = layer();
        // The chain's kernel is not a streaming one: only o_proj before it.
        ds[2].kernel = KernelId(3);
        let opts = budget(64 * MIB, true);
        let plan = plan(&ds, &levels, &roles(), W, opts);
        assert_eq!(plan, vec![(0, vec![slice(W, 0, MIB)])]);
    }

    #[test]
    fn a_hosts_own_weights_do_not_make_its_level_streaming() {
        // The block binds 1 MiB of weights of its own (its norm weights, larger): it still
        // hosts.
        let (mut ds, levels) = layer();
        ds[0].bindings.push(slice(W, 20 * MIB, MIB));
        let hosted = plan(&ds, &levels, &roles(), W, budget(64 * MIB, true));
        assert_eq!(hosted.len(), 1);
        assert_eq!(hosted[0].0, 0);
        // Beside it, a kernel with no role binding as much: the level is not weight-free.
        ds.insert(1, dispatch(9, &[slice(W, 30 * MIB, MIB)]));
        let levels: Vec<Range<u32>> = std::iter::once(0..2)
            .chain((2..ds.len() as u32).map(|i| i..i + 1))
            .collect();
        assert!(plan(&ds, &levels, &roles(), W, budget(64 * MIB, true)).is_empty());
    }

    #[test]
    fn only_beside_a_host() {
        // The weight-free level's kernel is not a host (Qwen3-Next's attention gate): none.
        let (mut ds, levels) = layer();
        ds[0].kernel = KernelId(3);
        assert!(plan(&ds, &levels, &roles(), W, budget(64 * MIB, true)).is_empty());
        // A host beside it in its level: the prefetch again.
        ds.insert(0, dispatch(0, &[]));
        let levels: Vec<Range<u32>> = std::iter::once(0..2)
            .chain((2..ds.len() as u32).map(|i| i..i + 1))
            .collect();
        let plan = plan(&ds, &levels, &roles(), W, budget(64 * MIB, true));
        assert_eq!(plan.len(), 1);
        assert_eq!(plan[0].0, 0);
    }

    #[test]
    fn the_choice_follows_the_weights_format() {
        use crate::ir::{DType, Type};
        let program = |dtype| {
            let mut p = Program::new();
            let norm = OpKind::Weight { name: "n".into() };
            p.push(norm, vec![], Some(Type::new(DType::F32, [64])))
                .unwrap();
            let w = OpKind::Weight { name: "w".into() };
            p.push(w, vec![], Some(Type::new(dtype, [4, 64]))).unwrap();
            p
        };
        // (matrix dtype, beside bands, budget in MiB, the chain's gate/up read)
        for (dtype, banded, mib, inner) in [
            (DType::BF16, false, 14, false),
            (DType::F16, false, 14, false),
            (DType::F32, false, 8, true),
            (DType::Q8_0, true, 14, true),
            (DType::Q8_0, false, 12, true),
            (DType::Q4_0, true, 12, true),
            (DType::Q4_0, false, 12, true),
        ] {
            let got = Prefetch::for_program(&program(dtype), banded);
            assert_eq!(got.budget, mib * MIB, "{dtype:?}");
            assert_eq!(got.chain_inner, inner, "{dtype:?}");
            assert_eq!(got, Prefetch::for_weights(dtype, banded), "{dtype:?}");
        }
        assert_eq!(
            Prefetch::default(),
            Prefetch::for_weights(DType::BF16, false)
        );
    }

    #[test]
    fn at_most_max_slices_slices() {
        // One streaming level binding ten weight matrices: the first MAX_SLICES are read.
        let many: Vec<Slice> = (0..10).map(|k| slice(W, k * MIB, MIB)).collect();
        let ds = vec![dispatch(0, &[]), dispatch(1, &many)];
        let levels = vec![0..1, 1..2];
        let plan = plan(&ds, &levels, &roles(), W, budget(64 * MIB, true));
        assert_eq!(plan[0].1, many[..MAX_SLICES].to_vec());
    }

    #[test]
    fn no_budget_or_too_little_to_read_plans_nothing() {
        let (ds, levels) = layer();
        let none = budget(0, true);
        assert!(plan(&ds, &levels, &roles(), W, none).is_empty());
        let small = Prefetch {
            min: 16 * MIB,
            ..budget(64 * MIB, true)
        };
        assert!(plan(&ds, &levels, &roles(), W, small).is_empty());
    }

    #[test]
    fn insert_places_first_or_last_and_renumbers_the_levels_after() {
        // Levels 0..2 of 1, 2 and 1 dispatches (kernels 0..4); one added first in level 1 and
        // one last in level 2 (kernels 10 and 11).
        let mut ds: Vec<Dispatch> = (0..4).map(|k| dispatch(k, &[])).collect();
        let mut levels = vec![0..1, 1..3, 3..4];
        let added = vec![
            (1, Place::First, dispatch(10, &[])),
            (2, Place::Last, dispatch(11, &[])),
        ];
        insert(&mut ds, &mut levels, added);
        let kernels: Vec<u32> = ds.iter().map(|d| d.kernel.0).collect();
        assert_eq!(kernels, vec![0, 10, 1, 2, 3, 11]);
        assert_eq!(levels, vec![0..1, 1..4, 4..6]);
    }
}
