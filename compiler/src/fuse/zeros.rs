//! The zero kernels of a level merged into few dispatches. A chained matvec accumulates into an
//! output that a zero kernel clears first (`KernelKind::Zero`); those depend on nothing, so all
//! of them land in level 0, one dispatch each: 28 for Qwen3-0.6B. Dispatches without a barrier
//! between them still cost ~0.3 µs each on an H100 (level 0 took ~10 µs). Here every level's
//! zero dispatches become one dispatch per [`MAX_SLICES`] of them, each invocation clearing its
//! word of every slice. Runs after the buffer plan, so the slices keep their offsets and
//! lifetimes (from level 0, where the zeroing happens, to the chain).

use crate::fuse::codegen;
use crate::fuse::FuseError;
use crate::kernels::KernelError;
use crate::lower::{declare_kernel, SpirvCache};
use std::collections::HashSet;
use std::ops::Range;
use vkfuse_runtime::schedule::{Dispatch, KernelDecl, KernelId, Slice};

/// Slices one merged dispatch binds (as the prefetch's: within any device's per-stage limit of
/// storage buffers that vkfuse targets).
pub const MAX_SLICES: usize = 8;

/// Merges the dispatches of `zeros` (single-binding zero kernels) that share a level, then drops
/// the kernel declarations no dispatch uses any more. Returns the old-to-new kernel ids (None:
/// dropped; the merged kernels' ids included) for maps keyed by kernel id.
pub fn merge(
    dispatches: &mut Vec<Dispatch>,
    levels: &mut [Range<u32>],
    kernels: &mut Vec<KernelDecl>,
    zeros: &HashSet<KernelId>,
    spirv: &mut SpirvCache,
) -> Result<Vec<Option<KernelId>>, KernelError> {
    let old = std::mem::take(dispatches);
    let mut out = Vec::with_capacity(old.len());
    for l in levels.iter_mut() {
        let start = out.len() as u32;
        let level = &old[l.start as usize..l.end as usize];
        let (zero, rest): (Vec<&Dispatch>, Vec<&Dispatch>) =
            level.iter().partition(|d| zeros.contains(&d.kernel));
        out.extend(rest.into_iter().cloned());
        if zero.len() > 1 {
            for group in zero.chunks(MAX_SLICES) {
                out.push(merged(kernels, group, spirv)?);
            }
        } else {
            out.extend(zero.into_iter().cloned());
        }
        *l = start..out.len() as u32;
    }
    *dispatches = out;
    Ok(prune(dispatches, kernels))
}

/// Adds the dispatch that sets the token state's argmax key (`TokenEncoding::Key`, slice
/// `token`) back to zero to level 1: after level 0, whose embedding reads the key (and beside
/// which replay copies it to the host), and long before the step's matvec folds its rows into
/// it again. A dispatch of its own rather than level 0's merged zeros, which run beside those
/// readers.
pub fn reset_token_key(
    dispatches: &mut Vec<Dispatch>,
    levels: &mut [Range<u32>],
    kernels: &mut Vec<KernelDecl>,
    token: Slice,
    spirv: &mut SpirvCache,
) -> Result<(), FuseError> {
    let binds_token = |l: &Range<u32>| {
        dispatches[l.start as usize..l.end as usize]
            .iter()
            .any(|d| d.bindings.iter().any(|b| b.overlaps(&token)))
    };
    // The key is read in level 0 (the embedding) and written in the last level (the matvec
    // computing the logits) only, with level 1 between them to reset it in.
    let last = levels.len().saturating_sub(1);
    if let Some(i) = (1..last).find(|&i| binds_token(&levels[i])) {
        return Err(FuseError::Internal(format!(
            "level {i} binds the token key, which only level 0 and the last level may"
        )));
    }
    if levels.len() < 3 {
        return Err(FuseError::Internal(format!(
            "no level after the embedding's to reset the token key in ({} levels)",
            levels.len()
        )));
    }
    let label = "zero the token key (the argmax's, for this step's logits)";
    let d = zero_dispatch(kernels, vec![token], label.into(), spirv)?;
    dispatches.insert(levels[1].end as usize, d);
    levels[1].end += 1;
    for l in &mut levels[2..] {
        l.start += 1;
        l.end += 1;
    }
    Ok(())
}

/// One dispatch clearing every slice of `group`.
fn merged(
    kernels: &mut Vec<KernelDecl>,
    group: &[&Dispatch],
    spirv: &mut SpirvCache,
) -> Result<Dispatch, KernelError> {
    let label = format!("zero {} outputs (the chains')", group.len());
    let slices = group.iter().map(|d| d.bindings[0]).collect();
    zero_dispatch(kernels, slices, label, spirv)
}

/// A dispatch of a generated zero kernel clearing every word of `slices`.
fn zero_dispatch(
    kernels: &mut Vec<KernelDecl>,
    slices: Vec<Slice>,
    label: String,
    spirv: &mut SpirvCache,
) -> Result<Dispatch, KernelError> {
    let words: Vec<usize> = slices.iter().map(|s| (s.size / 4) as usize).collect();
    let gen = codegen::zero(&words);
    let kernel = declare_kernel(
        kernels,
        gen.label.clone(),
        gen.spec_constants.clone(),
        gen.bindings,
        || spirv.get_source(&gen.label, &gen.source),
    )?;
    Ok(Dispatch {
        kernel,
        bindings: slices,
        push_constants: vec![],
        workgroups: gen.workgroups,
        label,
        alternatives: vec![],
        ops: vec![],
    })
}

/// Drops the declarations no dispatch uses (as its kernel or an alternative's) and renumbers the
/// rest (in order).
fn prune(dispatches: &mut [Dispatch], kernels: &mut Vec<KernelDecl>) -> Vec<Option<KernelId>> {
    let used: HashSet<KernelId> = dispatches
        .iter()
        .flat_map(|d| std::iter::once(d.kernel).chain(d.alternatives.iter().map(|a| a.kernel)))
        .collect();
    let mut map = vec![None; kernels.len()];
    let mut kept = Vec::with_capacity(kernels.len());
    for (i, k) in std::mem::take(kernels).into_iter().enumerate() {
        if used.contains(&KernelId(i as u32)) {
            map[i] = Some(KernelId(kept.len() as u32));
            kept.push(k);
        }
    }
    *kernels = kept;
    for d in dispatches {
        d.kernel = map[d.kernel.index()].expect("a used kernel is kept");
        for a in &mut d.alternatives {
            a.kernel = map[a.kernel.index()].expect("a used kernel is kept");
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;
    use vkfuse_runtime::schedule::{BufferId, Slice};

    fn decl(label: &str, bindings: u32) -> KernelDecl {
        KernelDecl {
            label: label.into(),
            spirv: vec![],
            bindings,
            push_constant_bytes: 0,
            spec_constants: vec![],
            subgroups: None,
        }
    }

    fn dispatch(kernel: u32, offset: u64) -> Dispatch {
        Dispatch {
            kernel: KernelId(kernel),
            bindings: vec![Slice {
                buffer: BufferId(3),
                offset,
                size: 1024,
            }],
            push_constants: vec![],
            workgroups: [1, 1, 1],
            label: format!("d{offset}"),
            alternatives: vec![],
            ops: vec![],
        }
    }

    /// [`merge`] with k1 the zero kernel.
    fn run(
        dispatches: &mut Vec<Dispatch>,
        levels: &mut [Range<u32>],
        kernels: &mut Vec<KernelDecl>,
    ) -> Vec<Option<KernelId>> {
        let zeros = HashSet::from([KernelId(1)]);
        merge(
            dispatches,
            levels,
            kernels,
            &zeros,
            &mut SpirvCache::default(),
        )
        .unwrap()
    }

    #[test]
    fn should_merge_a_levels_zeros_in_groups_and_drop_their_kernel() {
        // k0 embedding, k1 zero, k2 matvec; level 0: the embedding and ten zeros, level 1: the
        // matvec and one zero (alone in its level: left as it is).
        let mut kernels = vec![decl("embedding", 1), decl("zero[256]", 1), decl("mv", 1)];
        let mut dispatches = vec![dispatch(0, 0)];
        dispatches.extend((0..10).map(|i| dispatch(1, 1024 * (i + 1))));
        dispatches.push(dispatch(2, 0));
        dispatches.push(dispatch(1, 99 * 1024));
        let mut levels = vec![0..11, 11..13];
        let map = run(&mut dispatches, &mut levels, &mut kernels);

        // Level 0: the embedding, then 8 slices and 2, in their order.
        assert_eq!(levels, vec![0..3, 3..5]);
        let offsets = |d: &Dispatch| d.bindings.iter().map(|b| b.offset).collect::<Vec<_>>();
        assert_eq!(
            offsets(&dispatches[1]),
            (1..=8).map(|i| 1024 * i).collect::<Vec<_>>()
        );
        assert_eq!(offsets(&dispatches[2]), vec![9 * 1024, 10 * 1024]);
        assert_eq!(dispatches[1].workgroups, [1, 1, 1]);
        // The single zero still uses k1, so nothing is dropped here; the merged kernels are new.
        assert_eq!(
            map[..3],
            [Some(KernelId(0)), Some(KernelId(1)), Some(KernelId(2))]
        );
        assert_eq!(kernels[dispatches[1].kernel.index()].bindings, 8);
        assert_eq!(kernels[dispatches[2].kernel.index()].bindings, 2);
        assert_eq!(dispatches[3].kernel, KernelId(2));
        assert_eq!(dispatches[4].kernel, KernelId(1));

        // Without the lone zero its kernel goes and the later ids close up.
        let mut kernels = vec![decl("embedding", 1), decl("zero[256]", 1), decl("mv", 1)];
        let mut dispatches = vec![dispatch(0, 0), dispatch(1, 1024), dispatch(1, 2048)];
        dispatches.push(dispatch(2, 0));
        let mut levels = vec![0..3, 3..4];
        let map = run(&mut dispatches, &mut levels, &mut kernels);
        assert_eq!(map[..3], [Some(KernelId(0)), None, Some(KernelId(1))]);
        assert_eq!(kernels.len(), 3);
        assert_eq!(dispatches[2].kernel, KernelId(1));
        assert_eq!(kernels[dispatches[1].kernel.index()].label, "zero[256,256]");
    }

    #[test]
    fn should_keep_and_renumber_a_kernel_used_only_as_an_alternative() {
        // k0 attention, k1 zero (merged away), k2 the attention's alternative grid, k3 unused.
        let mut kernels = vec![
            decl("attention", 1),
            decl("zero[256]", 1),
            decl("attention short", 1),
            decl("unused", 1),
        ];
        let mut attention = dispatch(0, 0);
        attention.alternatives = vec![vkfuse_runtime::schedule::Alternative {
            below: 128,
            kernel: KernelId(2),
            workgroups: [4, 1, 1],
        }];
        let mut dispatches = vec![dispatch(1, 1024), dispatch(1, 2048), attention];
        let mut levels = vec![0..2, 2..3];
        let map = run(&mut dispatches, &mut levels, &mut kernels);
        assert_eq!(map[..4], [Some(KernelId(0)), None, Some(KernelId(1)), None]);
        let d = &dispatches[1];
        assert_eq!(kernels[d.kernel.index()].label, "attention");
        assert_eq!(
            kernels[d.alternatives[0].kernel.index()].label,
            "attention short"
        );
        assert_eq!(kernels.len(), 3, "the two kept and the merged zero kernel");
    }

    #[test]
    fn should_reset_the_token_key_in_level_1_and_refuse_a_key_read_between() {
        // The token key at b3[+2048, 8], read in level 0 and written in the last level.
        let token = Slice {
            buffer: BufferId(3),
            offset: 2048,
            size: 8,
        };
        let mut ds = vec![dispatch(0, 0), dispatch(1, 4096), dispatch(2, 8192)];
        ds[0].bindings.push(token);
        ds[2].bindings.push(token);
        let mut kernels = vec![decl("a", 2), decl("b", 1), decl("c", 2)];
        let mut levels = vec![0..1, 1..2, 2..3];
        let mut spirv = SpirvCache::default();
        reset_token_key(&mut ds, &mut levels, &mut kernels, token, &mut spirv).unwrap();
        assert_eq!(levels, vec![0..1, 1..3, 3..4]);
        assert_eq!(ds[2].bindings, vec![token]);
        assert_eq!(kernels[ds[2].kernel.index()].label, "zero[2]");
        assert_eq!(ds[3].label, "d8192");

        // A key read in level 1 (here overlapping it, not equal) leaves nowhere to reset it.
        let mut ds = vec![dispatch(0, 0), dispatch(1, 4096), dispatch(2, 8192)];
        ds[1].bindings.push(Slice {
            size: 4,
            offset: 2052,
            ..token
        });
        let mut levels = vec![0..1, 1..2, 2..3];
        let err = reset_token_key(&mut ds, &mut levels, &mut kernels, token, &mut spirv)
            .unwrap_err()
            .to_string();
        assert!(err.contains("level 1 binds the token key"), "{err}");
    }
}
