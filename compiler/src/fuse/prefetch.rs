//! Weight prefetch into the L2 cache: a level that streams no weights of its own (the attention
//! block: bound by latency, the memory otherwise idle for ~10 µs per layer on an H100) gets one
//! more dispatch, in the same level and so without a barrier, that reads the weights of the
//! (at most two) matvec levels right after it (kernels/glsl/prefetch.comp). Those levels then
//! find their weights in L2 instead of paying DRAM latency and bandwidth after their barrier.
//!
//! Bounded by [`Prefetch::budget`] (8 MiB by default: on an H100 8 beat 16 and 24, as the
//! attention block slows under more traffic) and skipped under [`Prefetch::min`] (tiny models
//! gain nothing but a dispatch).

use crate::kernels::{KernelCall, KernelError, MAX_WORKGROUPS_X};
use crate::lower::{declare_kernel, SpirvCache};
use std::collections::HashSet;
use std::ops::Range;
use vkfuse_runtime::schedule::{BufferId, Dispatch, KernelDecl, KernelId, Slice};

/// How much to prefetch beside weight-free levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefetch {
    /// The most bytes one prefetch reads (0: none).
    pub budget: u64,
    /// The fewest bytes worth a prefetch dispatch.
    pub min: u64,
}

impl Default for Prefetch {
    fn default() -> Self {
        Prefetch {
            budget: 8 << 20,
            min: 1 << 20,
        }
    }
}

/// Weight bytes a level may bind and still count as streaming none (norm weights).
const WEIGHT_FREE: u64 = 64 << 10;
/// Matvec levels after the weight-free one whose weights it may read: further ahead, the data
/// would wait longer in L2 (and a small model's lm_head would be read beside its attention).
const LEVELS_AHEAD: usize = 2;
/// Slices one prefetch dispatch binds (prefetch.comp's bindings).
const MAX_SLICES: usize = 8;
/// Prefetch workgroup size, and sectors each invocation reads (on an H100, 8 beat 2, 4 and 32:
/// fewer workgroups take longer than the attention block beside them, more crowd it).
const WG: u32 = 256;
const SECTORS_PER_INVOCATION: u64 = 8;

/// The weight slices to prefetch beside each weight-free level: (level, slices). `streams`:
/// the kernels that stream weights from binding 1 (matvecs, and chained matvecs, whose
/// binding 1 is the inner weight they read first).
pub fn plan(
    dispatches: &[Dispatch],
    levels: &[Range<u32>],
    streams: &HashSet<KernelId>,
    weights: BufferId,
    opts: Prefetch,
) -> Vec<(usize, Vec<Slice>)> {
    let of = |l: &Range<u32>| &dispatches[l.start as usize..l.end as usize];
    let weight_bytes = |l: &Range<u32>| -> u64 {
        of(l)
            .iter()
            .flat_map(|d| &d.bindings)
            .filter(|b| b.buffer == weights)
            .map(|b| b.size)
            .sum()
    };
    let mut out = vec![];
    if opts.budget == 0 {
        return out;
    }
    for (i, l) in levels.iter().enumerate() {
        if weight_bytes(l) > WEIGHT_FREE || of(l).iter().any(|d| streams.contains(&d.kernel)) {
            continue;
        }
        let mut slices: Vec<Slice> = vec![];
        let mut left = opts.budget;
        'next: for next in levels[i + 1..].iter().take(LEVELS_AHEAD) {
            for d in of(next) {
                // Only levels streaming weights from binding 1.
                let w = match (streams.contains(&d.kernel), d.bindings.get(1)) {
                    (true, Some(w)) if w.buffer == weights => *w,
                    _ => break 'next,
                };
                if left == 0 || slices.len() == MAX_SLICES {
                    break 'next;
                }
                // Whole 32-byte sectors, the last slice cut to the budget.
                let size = w.size.min(left) / 32 * 32;
                if size > 0 {
                    slices.push(Slice { size, ..w });
                    left -= size;
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
    let mut added = 0u32;
    let mut plan = plan.into_iter().peekable();
    let mut out = Vec::with_capacity(dispatches.len() + plan.len());
    let old = std::mem::take(dispatches);
    let mut old = old.into_iter();
    for (i, l) in levels.iter_mut().enumerate() {
        let n = l.end - l.start;
        out.extend(old.by_ref().take(n as usize));
        l.start += added;
        l.end += added;
        if plan.peek().is_some_and(|(at, _)| *at == i) {
            let (_, slices) = plan.next().expect("peeked");
            out.push(dispatch(kernels, &slices, sink, spirv)?);
            l.end += 1;
            added += 1;
        }
    }
    out.extend(old);
    *dispatches = out;
    Ok(())
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
    })
}
