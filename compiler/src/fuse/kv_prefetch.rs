//! The attention block's K/V caches read into L2 ahead of it: one dispatch per block, a level
//! or two before the block's own (kernels/glsl/prefetch.comp with `PF_KV`), reads every kv
//! head's first slots up to the step's position, so that the block's first K/V tile, which it
//! loads at its start, comes from L2 instead of DRAM.
//!
//! Why: where the block starts only as its q/k/v level ends (q8_0, whose 1024 q/k/v workgroups
//! leave the block no room before), its path to the q/k/v words runs through that first tile's
//! DRAM latency (docs/perf.md, session 43: 1.47 µs of a layer). Read beside the weight prefetch
//! instead, in the block's level a layer ahead, the caches gained only 0.2-0.4% (sessions 35
//! and 44): the lines are read too early. The H200's figures (docs/perf.md, session 44; 256
//! tokens, 2048 in brackets), against the same build with none:
//! - q8_0: first in the level before the block's q/k/v (in a dense layer the previous layer's
//!   chained MLP, whose 96 workgroups leave most compute units idle), +1.20% (+0.56%); last beside q/k/v
//!   +0.40%, first there −0.21%.
//! - 16-bit floats: last in the q/k/v's level, +1.28% (+1.80%); in the MLP's level +0.34%.
//! - q4_0, whose block starts beside its q/k/v and loads the tile while q/k/v runs: −0.2..−2.3%
//!   wherever it goes (−4.2% at 2048 tokens beside q/k/v); none.
//! - 768 slots: 320 gained as much at 256 tokens and less at 2048, the first 128 less than
//!   half as much, the whole cache (4096) 1.1% less for bf16 at 2048.
//! - Only where the lead level streams weights (see [`add`]): Qwen3-Next's bf16 blocks, led by
//!   the q/k/v's slices, got none (session 45); since the gated block reads q and its gate
//!   from the projection itself (session 48), their lead is that matvec, as a dense layer's.
//!
//! The timeline (`compile-model --timeline`, position 128) shows no stage of the block moving
//! with it (docs/perf.md, session 44, item 5): its kernels wrapped fit differently, so the
//! tile from L2 is the intent, the end-to-end gain what was measured.
//!
//! The dispatch declares itself unordered (its reads are discarded, its one write is a sink
//! nothing reads), so the handoff plan (`session::handoff`) keeps the block's level handed over
//! although the block writes the caches it reads.

use super::prefetch::{Place, Role, SECTORS_PER_INVOCATION, WG};
use crate::ir::{DType, Program};
use crate::kernels::{KernelCall, KernelError, MAX_WORKGROUPS_X};
use crate::lower::{declare_kernel, SpirvCache};
use std::collections::HashMap;
use std::ops::Range;
use vkfuse_runtime::schedule::{Dispatch, KernelDecl, KernelId, Slice};

/// The attention block's bindings of its K cache, V cache and position
/// (kernels/glsl/fused_attention.glsl).
const K_CACHE: usize = 4;
const V_CACHE: usize = 5;
const POSITION: usize = 6;

/// Which level before the block's the K/V prefetch goes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lead {
    /// The level of the block's input (q/k/v), recorded after it.
    Input,
    /// The level before that (in a dense layer the previous layer's MLP; the first layer's:
    /// the embedding's), recorded first.
    BeforeInput,
}

impl Lead {
    /// Levels before the block's, and where in that level.
    fn at(self) -> (usize, Place) {
        match self {
            Lead::Input => (1, Place::Last),
            Lead::BeforeInput => (2, Place::First),
        }
    }
}

/// How much of each attention block's caches to prefetch, and where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvPrefetch {
    /// The most slots per kv head read (0: none).
    pub slots: u32,
    pub lead: Lead,
}

impl KvPrefetch {
    /// No K/V prefetch.
    pub const NONE: KvPrefetch = KvPrefetch {
        slots: 0,
        lead: Lead::Input,
    };
    /// The slots the measured choices read (see the top).
    pub const SLOTS: u32 = 768;

    /// The choice for matvec weights of `dtype`, as measured (see the top): where the choice
    /// is none, `slots` still places its lead.
    pub fn for_weights(dtype: DType) -> KvPrefetch {
        match dtype {
            DType::Q8_0 => KvPrefetch {
                slots: Self::SLOTS,
                lead: Lead::BeforeInput,
            },
            DType::F16 | DType::BF16 => KvPrefetch {
                slots: Self::SLOTS,
                lead: Lead::Input,
            },
            DType::Q4_0 | DType::F32 | DType::I32 => KvPrefetch::NONE,
        }
    }

    /// The choice for `program`'s matvec weights ([`super::prefetch::matvec_dtype`]).
    pub fn for_program(program: &Program) -> KvPrefetch {
        KvPrefetch::for_weights(super::prefetch::matvec_dtype(program))
    }
}

/// Adds a K/V prefetch for every attention block (a dispatch whose kernel's role is
/// [`Role::Attention`]) at `choice`'s lead before its level, writing `sink` (4 bytes), and
/// their kernels to `kernels`. Blocks too early in the step for the lead get none, and so do
/// blocks whose lead level streams no weights (no matvec or chain in it): the
/// prefetch only pays beside a level long enough to hide it. Beside Qwen3-Next's q/k/v slices
/// (two copies of 16 workgroups), bf16 lost 0.4% at 256 tokens and 1.0% at 1024 on an H200
/// (docs/perf.md, session 45); in a dense layer this drops only the first block's under q8_0's
/// lead (the embedding's level).
pub fn add(
    dispatches: &mut Vec<Dispatch>,
    levels: &mut [Range<u32>],
    kernels: &mut Vec<KernelDecl>,
    roles: &HashMap<KernelId, Role>,
    choice: KvPrefetch,
    sink: Slice,
    spirv: &mut SpirvCache,
) -> Result<(), KernelError> {
    if choice.slots == 0 {
        return Ok(());
    }
    let (ahead, place) = choice.lead.at();
    let mut added = vec![];
    let of = |l: &Range<u32>| &dispatches[l.start as usize..l.end as usize];
    let role = |d: &Dispatch| roles.get(&d.kernel).copied();
    for (b, l) in levels.iter().enumerate().skip(ahead) {
        let block = of(l).iter().find_map(|d| match role(d) {
            Some(Role::Attention { heads, capacity }) => Some((d, heads, capacity)),
            _ => None,
        });
        let Some((d, heads, capacity)) = block else {
            continue;
        };
        let at = b - ahead;
        if !of(&levels[at])
            .iter()
            .any(|d| role(d).is_some_and(Role::streams))
        {
            continue;
        }
        let slots = choice.slots.min(capacity);
        added.push((
            at,
            place,
            dispatch(kernels, d, heads, capacity, slots, sink, spirv)?,
        ));
    }
    super::prefetch::insert(dispatches, levels, added);
    Ok(())
}

/// The K/V prefetch dispatch of attention block `block`.
fn dispatch(
    decls: &mut Vec<KernelDecl>,
    block: &Dispatch,
    heads: u32,
    capacity: u32,
    slots: u32,
    sink: Slice,
    spirv: &mut SpirvCache,
) -> Result<Dispatch, KernelError> {
    let k = block.bindings[K_CACHE];
    let row_words = (k.size / 4 / u64::from(heads) / u64::from(capacity)) as u32;
    // prefetch.comp reads V at K's offsets: both [heads, capacity, row_words words].
    debug_assert_eq!(
        k.size,
        u64::from(heads) * u64::from(capacity) * u64::from(row_words) * 4
    );
    debug_assert_eq!(block.bindings[V_CACHE].size, k.size);
    // One word per sector read, K and V in the same pass.
    let sectors = u64::from(heads) * (u64::from(slots) * u64::from(row_words)).div_ceil(8);
    let groups = sectors
        .div_ceil(WG as u64 * SECTORS_PER_INVOCATION)
        .clamp(1, MAX_WORKGROUPS_X as u64) as u32;
    let mut spec = vec![WG, 0, 0, 0, 0, 0, 0, 0, 0];
    spec.extend([heads, capacity, row_words, slots]);
    let call = KernelCall {
        kernel: "prefetch",
        defines: vec![
            ("PF_SLICES".into(), "0".into()),
            ("PF_KV".into(), "1".into()),
        ],
        spec_constants: spec.clone(),
        push_constants: vec![],
        workgroups: [groups, 1, 1],
        bindings: 4,
    };
    let label = "prefetch[PF_SLICES=0,PF_KV]".to_string();
    let kernel = declare_kernel(decls, label, spec, call.bindings, || spirv.get(&call))?;
    Ok(Dispatch {
        kernel,
        bindings: vec![
            sink,
            block.bindings[POSITION],
            k,
            block.bindings[V_CACHE],
        ],
        push_constants: vec![],
        workgroups: call.workgroups,
        label: format!(
            "prefetch into L2: the next attention block's K and V caches, up to {slots} slots per kv head"
        ),
        alternatives: vec![],
        ops: vec![],
    })
}
