//! Kernel generation: GLSL sources for the fused kernels, each a few generated lines (dtypes,
//! the epilogue expression, extra-input bindings, rope tables) around an anchor kernel from
//! `vkfuse_kernels` (`fused_matvec.glsl`, `fused_attention.glsl`, `fused_argmax.glsl`).
//! Shapes are specialization constants, as in the unfused kernels; the SPIR-V is compiled by
//! shaderc once per distinct source text (`SpirvCache::get_source`).

use crate::ir::{DType, F32Attr};
use crate::kernels::MAX_WORKGROUPS_X;
use std::fmt;
use std::fmt::Write as _;

/// Output parts of a stacked kernel start at multiples of this many f32 (256 bytes: any
/// device's storage-buffer offset alignment), so every part can be bound on its own.
pub const PART_ALIGN: usize = 64;
/// Workgroup size of the fused elementwise kernels.
pub const ELEMENTWISE_WG: u32 = 128;
/// Workgroup size of the attention block: 8 invocations per head element (a 256-slot score
/// tile at head_dim 128), a power of two between 64 and 1024. Small heads get small workgroups:
/// a 1024-invocation workgroup for a 32-wide head made the fixtures' attention cost 62% of the
/// step on lavapipe, where every barrier switches between all of its subgroups.
pub fn attention_wg(head_dim: usize) -> u32 {
    (8 * head_dim).next_power_of_two().clamp(64, 1024) as u32
}
/// Most slots a split walks in one pass of the attention block's subgroup walk
/// (`AttnSpec::subgroup_walk`): 16 subgroups of four 8-lane octets on a 32-wide device, in a
/// workgroup of 512 invocations or more (an 8-wide one walks 16 a pass: the same results). A longer
/// chunk takes several passes, each waiting for its own loads, where attend()'s tiles take 128
/// or 256 slots at once: with the walk on every grid, q4_0 lost 8.3% at 2048 tokens and 12% at
/// 4000 on an H200 (docs/perf.md, session 40).
pub const SUBGROUP_WALK_MAX_CHUNK: usize = 64;

/// The first position the subgroup walk does not serve: with it on every one-pass grid (the
/// bands below 768) q4_0 gained 1.85% at 256 tokens and lost 2.1% at 2048 on an H200, so it
/// keeps to the bands that the 256-token measure runs (4 and 6 splits below 384; docs/perf.md,
/// session 40), and is level with attend() at 2048 tokens (+0.03%, session 41).
pub const SUBGROUP_WALK_BELOW: usize = 384;

/// Whether a grid of `splits` splits for the positions below `below` takes the subgroup walk:
/// below [`SUBGROUP_WALK_BELOW`], every chunk in one pass ([`SUBGROUP_WALK_MAX_CHUNK`]).
pub fn subgroup_walk_fits(below: usize, splits: usize) -> bool {
    below <= SUBGROUP_WALK_BELOW && below.div_ceil(splits.max(1)) <= SUBGROUP_WALK_MAX_CHUNK
}

/// Most splits per query head that the default grid takes ([`attention_splits`]) and that a band
/// may ask for (`--attention-splits` itself may ask for more: the kernel and its scratch follow).
pub const MAX_ATTENTION_SPLITS: usize = 32;
/// Slots of a full cache per split past two workgroups per compute unit
/// ([`attention_splits`]).
pub const ATTENTION_LONG_CHUNK: usize = 128;
/// Fewest slots a split of the attention block attends (unless the context is shorter): a
/// split costs a fixed prologue (norms, rope, a few barriers) and a share of the combine, so
/// slivers of a few slots cost more than they save. Raised to 64 for the walking bands (one
/// split below position 65, where the walk's pass covers 64 slots, so no gather) it lost 0.2%
/// on an H200, and 48 or 64 for q8_0's bands was level (docs/perf.md, session 42).
pub const ATTENTION_MIN_CHUNK: usize = 32;
/// Fewest bytes of f32 K and V per split at a full cache (half of it past 16 splits: see
/// [`attention_splits`]): a head whose whole cache is smaller is one workgroup's short walk,
/// and every split past the first is a workgroup launched for nothing at short positions (on
/// lavapipe an empty workgroup costs ~75 µs: the fixtures, heads of 16 and 32 over 512 slots,
/// stay unsplit).
pub const ATTENTION_MIN_SPLIT_BYTES: usize = 256 << 10;

/// Splits per query head of the attention block (flash-decoding): enough that `hq` heads x
/// splits workgroups are two per compute unit (`compute_units`: the device class's streaming
/// multiprocessors or compute units, [`super::cost::DeviceCost`]; split workgroups of
/// [`attention_split_wg`] fit two per SM), at most 16, and no more than the f32 K and V of a
/// full cache (`capacity` slots of `head_dim`) hold [`ATTENTION_MIN_SPLIT_BYTES`] each. Where
/// both allow 16 and more, one split per [`ATTENTION_LONG_CHUNK`] slots of a full cache, with
/// half those bytes each, up to four workgroups per compute unit over all heads and
/// [`MAX_ATTENTION_SPLITS`]: every other shape keeps the count it had before that was measured.
/// A compile-time choice from the shapes and the device class the schedule is made for; the
/// kernel adapts the chunk to the position (at short positions few splits work, the rest exit
/// at once, and the bands run smaller grids: [`super::bands`]). Qwen3-0.6B at 4096 slots on an
/// H100: 32, which past position 2048 beat 16 by ~5% per step (bf16 1004 -> 953 µs, q4_0 896
/// -> 854 at 2048-3072) while 16 stay faster below it (the bands' 16 below 2048: docs/perf.md,
/// session 28); 16 x 512 invocations beat 8 x 1024 and 16 x 256 over 256 and 1024 tokens
/// (session 7).
pub fn attention_splits(
    hq: usize,
    head_dim: usize,
    capacity: usize,
    compute_units: usize,
) -> usize {
    let hq = hq.max(1);
    let bytes = capacity * head_dim * 2 * 4;
    let two_per_unit = 2 * compute_units / hq;
    let splits = two_per_unit
        .clamp(1, 16)
        .min(bytes / ATTENTION_MIN_SPLIT_BYTES)
        .max(1);
    if two_per_unit < 16 || splits < 16 {
        return splits;
    }
    (capacity / ATTENTION_LONG_CHUNK)
        .min(4 * compute_units / hq)
        .min(2 * bytes / ATTENTION_MIN_SPLIT_BYTES)
        .clamp(splits, MAX_ATTENTION_SPLITS)
}

/// Workgroup size of a split attention block: 4 invocations per head element (a 128-slot score
/// tile at head_dim 128), 64..1024. A split walks a chunk, not the whole context: half the
/// unsplit workgroup keeps its barriers cheaper and two of them resident per SM.
pub fn attention_split_wg(head_dim: usize) -> u32 {
    (4 * head_dim).next_power_of_two().clamp(64, 1024) as u32
}

/// State columns a part of the Gated DeltaNet step takes by default (`fused_gdn.glsl`): a
/// subgroup's width of one row, 128 bytes.
const GDN_PART_COLUMNS: usize = 32;
/// State rows each invocation of the step walks by default.
const GDN_ROWS: usize = 16;

/// The parts each key head's state columns (`r * dv`) are split over in the Gated DeltaNet
/// step: `want` (`FuseOptions::gdn_parts`; else `VKFUSE_GDN_PARTS`, read at compile time, the
/// A/B knob; else enough for parts of [`GDN_PART_COLUMNS`]) rounded down to a divisor of the
/// columns that leaves at most 1024 columns a part (one invocation each at least), else the
/// fewest parts above it that do.
pub fn gdn_parts(r: usize, dv: usize, want: Option<usize>) -> usize {
    let cols = (r * dv).max(1);
    let want = want
        .or_else(|| crate::kernels::knob("VKFUSE_GDN_PARTS").map(|p| p as usize))
        .unwrap_or(cols / GDN_PART_COLUMNS)
        .clamp(cols.div_ceil(1024), cols);
    let fits = |&p: &usize| cols.is_multiple_of(p) && cols / p <= 1024;
    (1..=want)
        .rev()
        .find(fits)
        .or_else(|| (want..=cols).find(fits))
        .unwrap_or(cols)
}

/// An rms-norm prologue.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NormSpec {
    pub eps: F32Attr,
    pub zero_centered: bool,
    /// The norm weight's dtype.
    pub dtype: DType,
    /// The weight is ones (folded into the matrices after it: `TraceOptions::fold_norms`), so
    /// the kernel reads none (`NW_ONES`).
    pub ones: bool,
}

/// An epilogue expression over the row's accumulators and extra inputs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Epi {
    /// The row's dot (stacked parts).
    Acc,
    /// Part K's dot for this row (zipped parts).
    Part(u8),
    /// The row's element of extra input K (element 0 when the input is a scalar).
    In(u8),
    Add(Box<Epi>, Box<Epi>),
    Mul(Box<Epi>, Box<Epi>),
    Div(Box<Epi>, Box<Epi>),
    Silu(Box<Epi>),
    Sigmoid(Box<Epi>),
    Exp(Box<Epi>),
    Neg(Box<Epi>),
    Softplus(Box<Epi>),
    /// A stacked kernel's epilogue per packed part: the rows of part K compute item K.
    Parts(Vec<Epi>),
}

impl Epi {
    /// The GLSL of the expression; `a` holds the accumulators, `INk(row)` the extra inputs.
    pub fn glsl(&self) -> String {
        self.glsl_with(&|k| format!("IN{k}(row)"))
    }

    /// [`Epi::glsl`] with extra input K read as `input(K)`.
    pub fn glsl_with(&self, input: &dyn Fn(u8) -> String) -> String {
        let g = |e: &Epi| e.glsl_with(input);
        match self {
            Epi::Acc => "a[0]".to_string(),
            Epi::Part(k) => format!("a[{k}]"),
            Epi::In(k) => input(*k),
            Epi::Add(x, y) => format!("({} + {})", g(x), g(y)),
            Epi::Mul(x, y) => format!("({} * {})", g(x), g(y)),
            Epi::Div(x, y) => format!("({} / {})", g(x), g(y)),
            Epi::Silu(x) => format!("silu({})", g(x)),
            // As unary.comp computes them (fused_epilogue.glsl).
            Epi::Sigmoid(x) => format!("fused_sigmoid({})", g(x)),
            Epi::Exp(x) => format!("exp({})", g(x)),
            Epi::Neg(x) => format!("(-{})", g(x)),
            Epi::Softplus(x) => format!("fused_softplus({})", g(x)),
            // Part K's rows end at the spec constant END<K> of fused_matvec.glsl (`row` is the
            // stacked weight row): a chain of selects, the last part unconditional.
            Epi::Parts(items) => {
                let mut items = items.iter().rev();
                let last = items.next().map_or_else(|| "a[0]".to_string(), g);
                let n = items.len();
                items.enumerate().fold(last, |rest, (i, e)| {
                    format!("((row) < END{} ? {} : {rest})", n - 1 - i, g(e))
                })
            }
        }
    }

    /// The number of parts of every per-part selection in the expression.
    pub fn part_counts(&self) -> Vec<usize> {
        match self {
            Epi::Acc | Epi::Part(_) | Epi::In(_) => vec![],
            Epi::Add(x, y) | Epi::Mul(x, y) | Epi::Div(x, y) => {
                let mut v = x.part_counts();
                v.extend(y.part_counts());
                v
            }
            Epi::Silu(x) | Epi::Sigmoid(x) | Epi::Exp(x) | Epi::Neg(x) | Epi::Softplus(x) => {
                x.part_counts()
            }
            Epi::Parts(items) => {
                let mut v = vec![items.len()];
                v.extend(items.iter().flat_map(Epi::part_counts));
                v
            }
        }
    }

    /// Whether the expression is the bare accumulator.
    pub fn is_identity(&self) -> bool {
        matches!(self, Epi::Acc)
    }
}

impl fmt::Display for Epi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Epi::Acc => f.write_str("acc"),
            Epi::Part(k) => write!(f, "acc{k}"),
            Epi::In(k) => write!(f, "in{k}"),
            Epi::Add(x, y) => write!(f, "add({x}, {y})"),
            Epi::Mul(x, y) => write!(f, "mul({x}, {y})"),
            Epi::Div(x, y) => write!(f, "div({x}, {y})"),
            Epi::Silu(x) => write!(f, "silu({x})"),
            Epi::Sigmoid(x) => write!(f, "sigmoid({x})"),
            Epi::Exp(x) => write!(f, "exp({x})"),
            Epi::Neg(x) => write!(f, "neg({x})"),
            Epi::Softplus(x) => write!(f, "softplus({x})"),
            Epi::Parts(items) => {
                let items: Vec<String> = items.iter().map(Epi::to_string).collect();
                write!(f, "parts({})", items.join(", "))
            }
        }
    }
}

/// An extra per-row input of a matvec kernel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ExtraSpec {
    pub dtype: DType,
    /// A one-element input read for every row.
    pub scalar: bool,
}

/// A kernel of the matvec family.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MatvecSpec {
    /// The weights' dtype (every part alike).
    pub dtype: DType,
    /// The input length.
    pub cols: usize,
    /// Rows of each packed weight, in order.
    pub part_rows: Vec<usize>,
    /// Parts combined row by row (all of one height) rather than stacked.
    pub zipped: bool,
    pub norm: Option<NormSpec>,
    pub extras: Vec<ExtraSpec>,
    pub epi: Epi,
    /// Also the step's tail (one part, the logits): the argmax of the rows folded into the
    /// token state as a 64-bit key by every workgroup, and the position advanced
    /// (`matvec_step.glsl`, 64-bit atomics). Three bindings more: the token state (the key),
    /// position state, position.
    pub step: bool,
    /// x is the output of a kernel that can publish it as handoff words (the attention block,
    /// the linear-attention step or a matvec), so that replay may hand it over: with no norm and
    /// the residual as its one extra input, such a matvec is made wide ([`is_wide`]).
    pub x_published: bool,
}

impl MatvecSpec {
    /// Output rows the kernel computes (without the stacked layout's padding).
    pub fn rows(&self) -> usize {
        if self.zipped {
            self.part_rows[0]
        } else {
            self.part_rows.iter().sum()
        }
    }

    /// Element offset of each part in the stacked output (aligned), and the output's length.
    pub fn layout(&self) -> (Vec<usize>, usize) {
        if self.zipped {
            return (vec![0], self.part_rows[0]);
        }
        let mut offsets = vec![];
        let mut end: usize = 0;
        for (k, &r) in self.part_rows.iter().enumerate() {
            let at = if k == 0 {
                0
            } else {
                end.div_ceil(PART_ALIGN) * PART_ALIGN
            };
            offsets.push(at);
            end = at + r;
        }
        (offsets, end)
    }

    /// Weight rows dotted per output row: every part when zipped, one when stacked.
    pub fn dots_per_row(&self) -> usize {
        if self.zipped {
            self.part_rows.len()
        } else {
            1
        }
    }

    /// A one-line description: `norm1p bf16 3 parts stacked: add(in0, acc)`.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        if let Some(n) = &self.norm {
            s += match (n.zero_centered, n.ones) {
                (true, _) => "norm1p ",
                (false, true) => "norm (weight folded) ",
                (false, false) => "norm ",
            };
        }
        let parts = self.part_rows.len();
        let rows: Vec<String> = self.part_rows.iter().map(usize::to_string).collect();
        let _ = write!(s, "{} [{}]x{}", self.dtype, rows.join("+"), self.cols);
        if parts > 1 {
            s += if self.zipped { " zipped" } else { " stacked" };
        }
        let _ = write!(s, ": {}", self.epi);
        if self.step {
            s += " -> argmax->token,position+1";
        }
        s
    }
}

/// Two matvecs chained in one kernel (`fused_chain.glsl`): the inner matvec-family kernel's
/// per-row results (norm prologue, zipped parts, epilogue over its own dots) feed the outer
/// matrix, split over the inner rows, its partial sums added into the output with float
/// atomics: SwiGLU's gate/up then down in one dependency level.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ChainSpec {
    /// The inner kernel (no extra inputs).
    pub inner: MatvecSpec,
    /// The outer weights' dtype; the outer matrix is `[out_rows, inner.rows()]`, stored
    /// transposed, `[inner.rows(), out_rows]` (the block formats by whole blocks, the same
    /// weights: `import::layout::transpose`): each workgroup's share is then whole rows where
    /// the checkpoint's layout gave it a few bytes of every row (docs/perf.md, session 10).
    pub outer_dtype: DType,
    pub out_rows: usize,
    /// An extra input added to every output row (the residual), when the outer epilogue is
    /// `acc + in0`.
    pub add_in: Option<ExtraSpec>,
}

impl ChainSpec {
    /// What the inner rows must be a multiple of (the rule asks): the kernel's block of act rows
    /// (32; the block formats' quantisation block).
    pub const BLOCK: usize = 32;

    /// `norm bf16 [3072+3072]x1024 zipped: mul(silu(acc0), acc1) -> bf16 [1024]x3072
    /// transposed: add(in0, acc)`.
    pub fn describe(&self) -> String {
        format!(
            "{} -> {} [{}]x{} transposed: {}",
            self.inner.describe(),
            self.outer_dtype,
            self.out_rows,
            self.inner.rows(),
            if self.add_in.is_some() {
                "add(in0, acc)"
            } else {
                "acc"
            }
        )
    }
}

/// An elementwise kernel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ElementwiseSpec {
    /// Output elements.
    pub n: usize,
    pub inputs: Vec<ExtraSpec>,
    pub epi: Epi,
}

/// The attention block.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AttnSpec {
    pub hq: usize,
    pub hkv: usize,
    pub head_dim: usize,
    pub capacity: usize,
    pub scale: F32Attr,
    /// The q and k norms (same eps and centring; weights of these dtypes).
    pub qk_norm: Option<(NormSpec, DType)>,
    pub theta: F32Attr,
    pub rotary_dim: usize,
    /// Workgroups per query head, each over a chunk of the context (1: no split, no scratch).
    pub splits: usize,
    /// Fewest slots a split attends.
    pub min_chunk: usize,
    /// Workgroup size (a power of two, at least `head_dim`): [`attention_wg`] unless tuned.
    pub workgroup: u32,
    /// The caches' element type: F32, or F16 (`--kv-cache f16`; kv_cache.glsl).
    pub kv_dtype: DType,
    /// Where handoffs are on, the highest working split waits for the others' partials in
    /// device memory instead of the last to arrive combining them (fused_attention.glsl's
    /// `polled()`): faster at short positions with the bands' grids, slower on the block's
    /// own at long ones (docs/perf.md, session 22).
    pub polled_combine: bool,
    /// The rope's angles and the first K/V tile's loads settled before the wait for the
    /// q/k/v words (fused_attention.glsl's `EARLY`): faster beside the block formats' f16
    /// dots, slower beside bf16's kernels (docs/perf.md, session 39).
    pub early_tile: bool,
    /// Each subgroup walks its slots with its own online softmax, the subgroups' partials
    /// folded once at the end (attend_subgroups.glsl), instead of the workgroup's phases
    /// meeting at barriers on every tile.
    pub subgroup_walk: bool,
    /// Qwen3-Next's output gate: q is read from rows `[q_h | gate_h]` of `2 * head_dim`, and
    /// the output is multiplied by `sigmoid(gate_h)` (fused_attention.glsl's `GATED`).
    pub gated: bool,
}

impl AttnSpec {
    /// Bytes of the partials' scratch (m, l, `o[head_dim]` per head and split); 0 without splits.
    pub fn partial_bytes(&self) -> u64 {
        if self.splits > 1 {
            (self.hq * self.splits * (self.head_dim + 2) * 4) as u64
        } else {
            0
        }
    }

    /// Bytes of the per-head arrival counters; 0 without splits. A block with bands binds the
    /// polled partials' words after them too ([`super::program::UKernel::arrival`]).
    pub fn counter_bytes(&self) -> u64 {
        if self.splits > 1 {
            (self.hq * 4) as u64
        } else {
            0
        }
    }
}

/// The Gated DeltaNet step.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GdnSpec {
    /// Key heads, value heads per key head, key and value head dims, conv kernel size - 1.
    pub hk: usize,
    pub r: usize,
    pub dk: usize,
    pub dv: usize,
    pub km1: usize,
    /// Workgroups per key head, each taking `r * dv / parts` of its state columns
    /// ([`gdn_parts`]); above 1 they count their arrivals (`KernelKind::arrival`).
    pub parts: usize,
    pub layout: crate::fuse::lang::GdnLayout,
    pub conv_dtype: DType,
    pub norm_dtype: DType,
    /// The gates' expressions over their inputs (`inK`), and the inputs' dtypes.
    pub g: Epi,
    pub g_inputs: Vec<DType>,
    pub beta: Epi,
    pub beta_inputs: Vec<DType>,
}

impl GdnSpec {
    pub fn describe(&self) -> String {
        let parts = match self.parts {
            1 => String::new(),
            n => format!(" in {n} parts"),
        };
        format!(
            "{} key heads x {} value heads of {}x{}{parts}, conv {}, g = {}, beta = {}",
            self.hk,
            self.r,
            self.dk,
            self.dv,
            self.km1 + 1,
            self.g,
            self.beta
        )
    }

    /// Invocations of a workgroup: each of the part's columns walked by `dsplit` of them, a
    /// divisor of `dk`, about [`GDN_ROWS`] rows each (`VKFUSE_GDN_ROWS` the knob), at most 1024
    /// in all.
    pub fn workgroup_size(&self) -> u32 {
        let cols = (self.r * self.dv / self.parts.max(1)).max(1);
        let rows = crate::kernels::knob("VKFUSE_GDN_ROWS").map_or(GDN_ROWS, |r| r as usize);
        let mut dsplit = (self.dk / rows.max(1)).clamp(1, (1024 / cols).max(1));
        while !self.dk.is_multiple_of(dsplit) {
            dsplit -= 1;
        }
        u(cols * dsplit)
    }
}

/// The MoE router: softmax, top-k, renormalised weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RouteSpec {
    /// Experts.
    pub n: usize,
    /// Chosen per token.
    pub k: usize,
}

/// Bytes of shared memory a kernel that picks the experts may spend on it (`route_pick.glsl`:
/// each logit's key, the tournament's 16 lists of K candidates, the picks): Vulkan's least
/// `maxComputeSharedMemorySize`, so that a router of any size the rules take builds on every
/// device; 512 experts, top 10, take 3.4 KB.
pub const ROUTE_SHARED_MAX: usize = 16384;

/// `route_pick.glsl`'s `ROUTE_GROUPS`: the tournament's lists, K candidates each.
const ROUTE_GROUPS: usize = 16;

impl RouteSpec {
    /// The shared memory `route_pick.glsl` declares for `n` logits and the top `k`: a key per
    /// logit, the lists' keys and indices, the picks and their weights, the max.
    pub fn shared_bytes(n: usize, k: usize) -> usize {
        4 * n + 4 * (2 * ROUTE_GROUPS + 2) * k + 4
    }

    /// Whether a router of `n` logits choosing `k` fits [`ROUTE_SHARED_MAX`].
    pub fn fits(n: usize, k: usize) -> bool {
        Self::shared_bytes(n, k) <= ROUTE_SHARED_MAX
    }

    /// Where the indices start in the output (f32 elements): after the weights, at a part
    /// boundary so they can be bound on their own.
    pub fn ids_offset(&self) -> usize {
        self.k.div_ceil(PART_ALIGN).max(1) * PART_ALIGN
    }
}

/// A fused kernel over the chosen experts' stacked weights (SwiGLU, or down weighted and summed).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ExpertSpec {
    pub dtype: DType,
    /// Experts, output rows, input length, experts chosen.
    pub e: usize,
    pub o: usize,
    pub i: usize,
    pub k: usize,
    /// Where the chosen experts come from.
    pub routing: Routing,
    /// The weighted sum's epilogue over its row (`acc`) and `extras` (`Epi::Acc` and none for
    /// the SwiGLU).
    pub epi: Epi,
    pub extras: Vec<ExtraSpec>,
}

/// How an expert kernel learns which experts (and, summing, their weights) a token chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Routing {
    /// It reads the router kernel's indices (and weights).
    Read,
    /// Each workgroup routes for itself from the router's `n` logits (`route_pick.glsl`).
    Own { n: usize },
}

/// The tail kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TailSpec {
    /// The argmax of n logits into the token state.
    Argmax { n: usize },
    /// The position advanced in its state.
    Advance,
    /// Both.
    Step { n: usize },
}

/// A generated kernel, ready for `SpirvCache::get_source`.
#[derive(Clone, Debug, PartialEq)]
pub struct Generated {
    pub label: String,
    pub source: String,
    pub spec_constants: Vec<u32>,
    pub workgroups: [u32; 3],
    pub bindings: usize,
}

fn u(n: usize) -> u32 {
    u32::try_from(n).expect("kernels index values of fewer than 2^32 elements")
}

fn dtype_code(d: DType) -> &'static str {
    match d {
        DType::F32 => "F32",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        DType::I32 => "I32",
        DType::Q8_0 => "Q8_0",
        DType::Q4_0 => "Q4_0",
    }
}

fn workgroups(n: usize) -> [u32; 3] {
    let n = n.max(1);
    if n <= MAX_WORKGROUPS_X {
        [u(n), 1, 1]
    } else {
        [u(MAX_WORKGROUPS_X), u(n.div_ceil(MAX_WORKGROUPS_X)), 1]
    }
}

pub(crate) const HEADER: &str = "#version 450\n#extension GL_GOOGLE_include_directive : require\n";

/// The matvec-family kernel of `spec`: a wide matvec where [`is_wide`], else the plain one.
pub fn matvec(spec: &MatvecSpec) -> Generated {
    wide_matvec(spec).unwrap_or_else(|| plain_matvec(spec))
}

/// fused_matvec.glsl's kernel of `spec`.
fn plain_matvec(spec: &MatvecSpec) -> Generated {
    let parts = spec.part_rows.len();
    assert!((1..=8).contains(&parts), "1..=8 packed parts");
    let per_row = spec.dots_per_row();
    let o = spec.rows();
    let (wg, rows) = crate::kernels::matvec_tuning(o, spec.dtype);
    let rows_per_wg = (rows as usize).min(8 / per_row).max(1);
    let vec4 = crate::kernels::vec4(spec.dtype, spec.cols) != 0;
    let (offsets, _) = spec.layout();
    let mut ends = vec![0u32; 8];
    let mut shifts = vec![0u32; 8];
    let mut end = 0;
    for k in 0..parts {
        if spec.zipped {
            break;
        }
        end += spec.part_rows[k];
        ends[k] = u(end);
        shifts[k] = u(offsets[k] - (end - spec.part_rows[k]));
    }
    let norm = spec.norm.as_ref();
    let mut spec_constants = vec![
        wg,
        u(o),
        u(spec.cols),
        u(rows_per_wg),
        u32::from(vec4),
        norm.map_or(0.0f32, |n| n.eps.0).to_bits(),
    ];
    spec_constants.extend(ends);
    spec_constants.extend(shifts);

    let mut s = String::from(HEADER);
    let _ = writeln!(
        s,
        "// Generated by vkfuse (fuse::codegen): {}",
        spec.describe()
    );
    matvec_defines(&mut s, spec);
    s += "#include \"common.glsl\"\n";
    let first_extra = 3 + usize::from(norm.is_some());
    declare_inputs(&mut s, &spec.extras, first_extra);
    // The extra inputs are loaded into `pre` before the dots (fused_matvec.glsl).
    preloaded_epilogue(&mut s, spec.extras.len(), &spec.epi);
    let step_binding = first_extra + spec.extras.len();
    if spec.step {
        let _ = writeln!(s, "#define STEP 1\n#define STEP_BINDING {step_binding}");
        // The argmax's atomics filtered by the key each workgroup read as it began, where it
        // measured faster: float weights, and q8_0 in its lm_head's workgroups of two
        // subgroups (q4_0 lost with it at one subgroup and at two, why is not known:
        // matvec_step.glsl's STEP_FILTER).
        if spec.dtype != DType::Q4_0 {
            s += "#define STEP_FILTER 1\n";
        }
    }
    s += "#include \"fused_matvec.glsl\"\n";
    Generated {
        label: format!("fused_matvec[{}]", spec.describe()),
        source: s,
        spec_constants,
        workgroups: workgroups(o.div_ceil(rows_per_wg)),
        bindings: step_binding + if spec.step { 3 } else { 0 },
    }
}

/// Rows per workgroup of a wide matvec ([`wide_matvec`]), 32 invocations each. On the H100 with
/// handoffs 32 and 16 rows measure alike and 8 lose 2-3%; without handoffs 32 rows (32
/// workgroups for a 1024-row o_proj) lose 5-8% to the plain matvec, 16 rows 1-6%
/// (docs/perf.md, session 16). With the rows in groups of subgroups (session 24) 8 rows in
/// groups of 2 lose 3.8-6.5%, 32 rows in groups of 2, 4 or 8 lose 0.9-4.1%.
const WIDE_ROWS: usize = 16;

/// [`WIDE_ROWS`], or `VKFUSE_WIDE_ROWS` (8, 16 or 32), its A/B knob read at compile time.
fn wide_rows() -> usize {
    crate::kernels::knob("VKFUSE_WIDE_ROWS")
        .map(|r| r as usize)
        .filter(|r| [8, 16, 32].contains(r))
        .unwrap_or(WIDE_ROWS)
}

/// Raw 16-byte weight loads an invocation may hold before its input is staged
/// (`fused_chain.glsl`'s PRE_STEPS times its dots per round). The wide matvec holds block
/// formats' steps as f16 pairs and a scale instead (PRE_HALVES: five registers a step where
/// q4_0's raw step takes two), and the chain q4_0's as two nibble words and a scale (PRE_SPLIT:
/// three), so raising this costs them more registers than the name says.
const PRELOAD_WORDS4: usize = 8;

/// Steps of 8 weights (of a row of `cols` of `dtype`) that each lane of a subgroup preloads for
/// `dg` dots at once: as many as [`PRELOAD_WORDS4`] allows, no more than a 32-lane subgroup
/// meets; none for f32 (its steps are two loads).
fn preload_steps(dtype: DType, cols: usize, dg: usize) -> usize {
    if dtype == DType::F32 {
        return 0;
    }
    (PRELOAD_WORDS4 / dg.max(1)).min((cols / 8).div_ceil(32))
}

/// Whether [`matvec`] makes `spec` a wide matvec (`wide_matvec`).
pub fn is_wide(spec: &MatvecSpec) -> bool {
    spec.x_published
        && spec.norm.is_none()
        && !spec.step
        && !spec.zipped
        && spec.part_rows.len() == 1
        && spec.extras.len() == 1
        && !spec.extras[0].scalar
        && spec.rows().is_multiple_of(wide_rows())
        && spec.cols.is_multiple_of(8)
}

/// A matvec with no norm and one extra input (the residual add: o_proj, or down where the MLP
/// is not chained) whose x a kernel publishes, as `fused_chain.glsl`'s inner matvec alone
/// (INNER_ONLY): [`WIDE_ROWS`] rows per workgroup of 32 invocations per row, in groups of
/// subgroups ([`dot_groups`]), its weights preloaded before x is staged, so that x can be
/// handed over to it (the attention block's output to o_proj: few workgroups read it, and they
/// wait with their weights already loaded). With the chain's preload, on the H100: +4% bf16,
/// +8% q8_0, +6% q4_0 with handoffs, −6% / −1% / −2% without (docs/perf.md, session 16).
fn wide_matvec(spec: &MatvecSpec) -> Option<Generated> {
    if !is_wide(spec) {
        return None;
    }
    let o = spec.rows();
    let rows = wide_rows();
    let wg = (32 * rows as u32).min(1024);
    let DotGroups { dg, ks } = dot_groups(rows, wg, spec.cols, "VKFUSE_WIDE_KS", 4);
    let pre = preload_steps(spec.dtype, spec.cols / ks, dg);
    let mut s = String::from(HEADER);
    let _ = writeln!(
        s,
        "// Generated by vkfuse (fuse::codegen): wide {}",
        spec.describe()
    );
    matvec_defines(&mut s, spec);
    let _ = writeln!(s, "#define INNER_ONLY 1");
    let _ = writeln!(s, "#define INNER_IN 1");
    let _ = writeln!(s, "#define PRE_STEPS {pre}");
    let _ = writeln!(s, "#define W2_DTYPE {}", dtype_code(DType::F32));
    let _ = writeln!(s, "#define W2_BINDING 1");
    let _ = writeln!(s, "#define ADD_IN 0");
    let _ = writeln!(s, "#define CH_J {o}u");
    let _ = writeln!(s, "#define CH_I {}u", spec.cols);
    let _ = writeln!(s, "#define CH_O 4u");
    let _ = writeln!(s, "#define CH_CB {rows}u");
    let _ = writeln!(s, "#define CH_DG {dg}u");
    let _ = writeln!(s, "#define CH_KS {ks}u");
    let _ = writeln!(s, "#define OUT_NG 1u");
    let _ = writeln!(s, "#define OUT_SPAN {wg}u");
    let _ = writeln!(s, "#define OUT_Q 1u");
    s += "#include \"common.glsl\"\n";
    declare_inputs(&mut s, &spec.extras, 3);
    let _ = writeln!(
        s,
        "#define EPILOGUE(row, a) {}",
        spec.epi.glsl_with(&|_| "pin".to_string())
    );
    s += "#include \"fused_chain.glsl\"\n";
    Some(Generated {
        label: format!("fused_matvec[wide {rows}: {}]", spec.describe()),
        source: s,
        // Constant 0 is chosen at load (`rows` of the device's subgroups): the kernel takes any
        // size.
        spec_constants: vec![wg, 0],
        workgroups: workgroups(o / rows),
        bindings: 3 + spec.extras.len(),
    })
}

/// The chained kernel's shape (`fused_chain.glsl`).
struct ChainShape {
    /// Inner rows (act rows) per workgroup.
    cb: usize,
    /// Invocations per workgroup.
    wg: u32,
    /// Groups of invocations splitting the block's act rows in the outer product.
    ng: usize,
}

/// The chained kernel's shape: 32 act rows per workgroup (96 workgroups for Qwen3-0.6B's
/// 3072) of 1024 invocations, each subgroup two of the 64 gate/up dots; float weights split the outer
/// product over 2 groups of 16 act rows. On the H100 that beat, for bf16, 16 rows of 512
/// invocations in 2 groups (-2.1%), 8, 12, 24, 48 or 64 rows and 256 or 512 invocations;
/// for q4_0 and q8_0, 512 invocations (-3%). More workgroups pay more in atomics than they
/// gain in balance over the SMs (docs/perf.md). Float weights took 4 groups until NVIDIA's
/// bounds checks went (session 55): without them the 4 groups' code takes all 64 registers a
/// 1024-invocation workgroup leaves and spills (bf16 −2.5% on an H200); 2 groups unchecked are
/// level with the 4 checked ones. `VKFUSE_CHAIN=cb,wg,ng` overrides them at
/// compile time (the A/B knob of those measurements; values that do not fit the shapes fall
/// back to the defaults, a group count to the largest that fits).
fn chain_shape(spec: &ChainSpec) -> ChainShape {
    let j = spec.inner.rows();
    let blocks = spec.outer_dtype.is_quantized();
    let knob: Vec<usize> = std::env::var("VKFUSE_CHAIN")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_default();
    let cb = match knob.first() {
        Some(&c) if !blocks && c > 0 && c % 4 == 0 && j.is_multiple_of(c) => c,
        _ => ChainSpec::BLOCK,
    };
    let wg = match knob.get(1) {
        Some(&w) if w.is_power_of_two() && (64..=1024).contains(&w) => w as u32,
        _ => 1024,
    };
    // Groups (float weights): a power of two dividing cb, every group's steps within the
    // workgroup, their partial sums within the staged input's array or 16 KiB.
    let steps = chain_outer_steps(spec);
    let fits = |ng: usize| {
        ng == 1
            || (cb.is_multiple_of(ng)
                && ng * steps <= wg as usize
                && ng * spec.out_rows <= spec.inner.cols.max(4096))
    };
    let mut ng = match knob.get(2) {
        _ if blocks => 1,
        Some(&n) if n.is_power_of_two() => n,
        _ => 2,
    };
    while !fits(ng) {
        ng /= 2;
    }
    ChainShape { cb, wg, ng }
}

/// What an invocation of the chained kernel's outer product takes at a time: output rows
/// (block formats, a whole block each) or steps of 4 of them (float weights).
fn chain_outer_steps(spec: &ChainSpec) -> usize {
    if spec.outer_dtype.is_quantized() {
        spec.out_rows
    } else {
        spec.out_rows / 4
    }
}

/// How the subgroups of a chained or wide kernel (`fused_chain.glsl`) take its `ndots` inner
/// dots of `cols` columns.
struct DotGroups {
    /// Dots a group takes at once (its loads in flight per step).
    dg: usize,
    /// Subgroups per group, each a `ks`-th of every row's steps.
    ks: usize,
}

/// The workgroup's `ndots` spread over its subgroups (counted at 32 invocations; any width
/// stays correct) in groups of `ks` subgroups (`knob`, the A/B knob read at compile time, else
/// `default_ks`: a power of two, at most a quarter of the subgroups, so that a workgroup of
/// 128-wide ones still holds a group, as the kernel needs; dividing the rows' steps; else
/// halved), `dg` at a time: at most 4 per subgroup's share and 8 in all, dividing `ndots`.
/// Each subgroup reads its share of the staged x once per `dg` dots. On the H100 the wide o_proj's 16 rows in groups
/// of 4 subgroups (4 rows each) beat one row per subgroup by +0.3% bf16, +3.4% q8_0, +1.8%
/// q4_0 (groups of 2: +0.5%, −0.2%, +0.4%); the chain's 64 dots in groups of 2 or 4 subgroups
/// lost 0.1-0.8% to 2 dots per subgroup (docs/perf.md, session 24).
fn dot_groups(ndots: usize, wg: u32, cols: usize, knob: &str, default_ks: usize) -> DotGroups {
    let subgroups = (wg as usize / 32).max(1);
    let mut ks = crate::kernels::knob(knob)
        .map(|k| k as usize)
        .filter(|k| k.is_power_of_two())
        .unwrap_or(default_ks);
    while ks > 1 && (4 * ks > subgroups || !(cols / 8).is_multiple_of(ks)) {
        ks /= 2;
    }
    let mut dg = (ndots * ks / subgroups).clamp(1, (4 * ks).min(8));
    while !ndots.is_multiple_of(dg) {
        dg -= 1;
    }
    DotGroups { dg, ks }
}

/// The chained kernel of `spec` (`fused_chain.glsl`); its output must be zero before it runs.
pub fn chain(spec: &ChainSpec) -> Generated {
    let inner = &spec.inner;
    let j = inner.rows();
    let norm = inner.norm.as_ref();
    let mut s = String::from(HEADER);
    let _ = writeln!(
        s,
        "// Generated by vkfuse (fuse::codegen): chain {}",
        spec.describe()
    );
    matvec_defines(&mut s, inner);
    let w2_binding = 3 + usize::from(norm.is_some());
    let _ = writeln!(s, "#define W2_DTYPE {}", dtype_code(spec.outer_dtype));
    let _ = writeln!(s, "#define W2_BINDING {w2_binding}");
    let _ = writeln!(s, "#define ADD_IN {}", u8::from(spec.add_in.is_some()));
    let _ = writeln!(s, "#define CH_J {}u", j);
    let _ = writeln!(s, "#define CH_I {}u", inner.cols);
    let _ = writeln!(s, "#define CH_O {}u", spec.out_rows);
    let ChainShape { cb, wg, ng } = chain_shape(spec);
    let steps = chain_outer_steps(spec);
    let span = if ng > 1 { steps } else { wg as usize };
    let DotGroups { dg, ks } = dot_groups(
        cb * inner.dots_per_row(),
        wg,
        inner.cols,
        "VKFUSE_CHAIN_KS",
        1,
    );
    let _ = writeln!(s, "#define CH_CB {cb}u");
    let _ = writeln!(s, "#define CH_DG {dg}u");
    let _ = writeln!(s, "#define CH_KS {ks}u");
    let _ = writeln!(s, "#define OUT_NG {ng}u");
    let _ = writeln!(s, "#define OUT_SPAN {span}u");
    let _ = writeln!(s, "#define OUT_Q {}u", steps.div_ceil(span).max(1));
    // gate/up preloaded before the staging (fused_chain.glsl).
    let _ = writeln!(
        s,
        "#define PRE_STEPS {}",
        preload_steps(inner.dtype, inner.cols / ks, dg)
    );
    s += "#include \"common.glsl\"\n";
    let extras: Vec<ExtraSpec> = spec.add_in.iter().cloned().collect();
    declare_inputs(&mut s, &extras, w2_binding + 1);
    let _ = writeln!(s, "#define EPILOGUE(row, a) {}", inner.epi.glsl());
    s += "#include \"fused_chain.glsl\"\n";
    Generated {
        label: format!("fused_chain[{}]", spec.describe()),
        source: s,
        spec_constants: vec![wg, norm.map_or(0.0f32, |n| n.eps.0).to_bits()],
        workgroups: workgroups(j / cb),
        bindings: w2_binding + 1 + extras.len(),
    }
}

/// A kernel writing `words[k]` zero words into binding k for every k: a chained kernel's output,
/// which it accumulates into, or several of them (`fuse::zeros`: a level's zero kernels in one
/// dispatch). Invocation i clears word i of every binding long enough.
pub fn zero(words: &[usize]) -> Generated {
    let mut s = String::from(HEADER);
    s += "// Generated by vkfuse (fuse::codegen): zero\n#include \"common.glsl\"\n";
    for k in 0..words.len() {
        let _ = writeln!(
            s,
            "layout(set = 0, binding = {k}, std430) writeonly buffer Y{k} {{ uint y{k}[]; }};"
        );
    }
    s += "void main() {\n    uint i = global_id();\n";
    for (k, w) in words.iter().enumerate() {
        let _ = writeln!(s, "    if (i < {w}u) {{\n        y{k}[i] = 0u;\n    }}");
    }
    s += "}\n";
    let most = words.iter().copied().max().unwrap_or(1);
    let list: Vec<String> = words.iter().map(|w| w.to_string()).collect();
    Generated {
        label: format!("zero[{}]", list.join(",")),
        source: s,
        spec_constants: vec![256],
        workgroups: workgroups(most.div_ceil(256)),
        bindings: words.len(),
    }
}

/// The defines a matvec body reads (fused_matvec.glsl): dtypes, prologue, parts.
fn matvec_defines(s: &mut String, spec: &MatvecSpec) {
    let norm = spec.norm.as_ref();
    let _ = writeln!(s, "#define W_DTYPE {}", dtype_code(spec.dtype));
    let _ = writeln!(s, "#define NORM {}", u8::from(norm.is_some()));
    let _ = writeln!(
        s,
        "#define NW_DTYPE {}",
        dtype_code(norm.map_or(DType::F32, |n| n.dtype))
    );
    let _ = writeln!(
        s,
        "#define NORM_ZC {}",
        u8::from(norm.is_some_and(|n| n.zero_centered))
    );
    let _ = writeln!(
        s,
        "#define NW_ONES {}",
        u8::from(norm.is_some_and(|n| n.ones && !n.zero_centered))
    );
    let _ = writeln!(s, "#define PARTS {}u", spec.part_rows.len());
    let _ = writeln!(s, "#define ZIPPED {}", u8::from(spec.zipped));
}

/// The names [`matvec_defines`] and a member's own lines define, undefined after a member.
const MATVEC_DEFINES: &[&str] = &[
    "W_DTYPE", "NORM", "NW_DTYPE", "NORM_ZC", "NW_ONES", "PARTS", "ZIPPED",
];

/// fused_matvec.glsl's specialization constants by constant_id (0 is the workgroup size) that
/// persistent_matvec.glsl reads too, folded into its source.
const MATVEC_CONSTANTS: [(usize, &str); 19] = [
    (1, "O"),
    (2, "I"),
    (5, "EPS"),
    (6, "END0"),
    (7, "END1"),
    (8, "END2"),
    (9, "END3"),
    (10, "END4"),
    (11, "END5"),
    (12, "END6"),
    (13, "END7"),
    (14, "SHIFT0"),
    (15, "SHIFT1"),
    (16, "SHIFT2"),
    (17, "SHIFT3"),
    (18, "SHIFT4"),
    (19, "SHIFT5"),
    (20, "SHIFT6"),
    (21, "SHIFT7"),
];

/// persistent_matvec.glsl's and matvec_rows.glsl's file-scope names, renamed per level of a
/// persistent region.
const PERSISTENT_NAMES: &[&str] = &[
    "MvY",
    "MvW4",
    "MvX",
    "NW",
    "mv_y",
    "mv_w4",
    "mv_x",
    "nw",
    "nw_at",
    "out_index",
    "PER_ROW",
    "N8",
    "ROW_CHUNKS",
    "mv_rows",
    "mv_sw",
    "mv_pass_rows",
    "mv_chunk",
    "mv_j",
    "mv_load",
];

/// The most 16-byte chunks one output row of a persistent level may have (all its parts):
/// a pass of persistent_matvec.glsl holds at least one row.
pub const PERSISTENT_ROW_CHUNKS: usize = 512;

/// Whether persistent_matvec.glsl computes `spec`: 16-bit weights, rows of whole 16-byte
/// chunks, an input that fits the staging buffer (`max_cols` floats), output rows of at most
/// [`PERSISTENT_ROW_CHUNKS`] chunks. (Block formats would also need the fused kernels' dot
/// defines, `FuseOptions::f16_dots`: regions are compiled apart from `Lowering`.)
pub fn persistent_ok(spec: &MatvecSpec, max_cols: usize) -> bool {
    !spec.step
        && matches!(spec.dtype, DType::F16 | DType::BF16)
        && spec.cols.is_multiple_of(8)
        && spec.cols <= max_cols
        && spec.dots_per_row() * spec.cols / 8 <= PERSISTENT_ROW_CHUNKS
}

/// Level `m` of a persistent region: the matvec `spec` (whose own kernel is `gen`: its
/// constants are folded in) as persistent_matvec.glsl's `mv_main_<m>()`, bindings from
/// `binding`; every name it defines is undefined at its end.
pub fn persistent_member(spec: &MatvecSpec, gen: &Generated, m: usize, binding: usize) -> String {
    // A wide matvec's own kernel has other constants: those of its plain kernel.
    let plain;
    let gen = if is_wide(spec) {
        plain = plain_matvec(spec);
        &plain
    } else {
        gen
    };
    let mut s = String::new();
    let _ = writeln!(s, "// level {m}: {}", spec.describe());
    matvec_defines(&mut s, spec);
    let mut defined: Vec<String> = MATVEC_DEFINES.iter().map(|d| d.to_string()).collect();
    for (id, name) in MATVEC_CONSTANTS {
        let v = gen.spec_constants[id];
        let value = if name == "EPS" {
            format!("uintBitsToFloat({v:#x}u)")
        } else {
            format!("{v}u")
        };
        let _ = writeln!(s, "#define {name} {value}");
        defined.push(name.to_string());
    }
    let _ = writeln!(s, "#define MV_BINDING {binding}");
    let _ = writeln!(s, "#define MV_MAIN mv_main_{m}");
    let _ = writeln!(s, "#define MV_PREFETCH mv_prefetch_{m}");
    defined.extend(["MV_BINDING", "MV_MAIN", "MV_PREFETCH"].map(String::from));
    for name in PERSISTENT_NAMES {
        let _ = writeln!(s, "#define {name} {name}_{m}");
        defined.push(name.to_string());
    }
    let first_extra = binding + 3 + usize::from(spec.norm.is_some());
    declare_inputs_as(
        &mut s,
        &spec.extras,
        first_extra,
        &format!("{m}_"),
        "coherent ",
    );
    defined.extend((0..spec.extras.len()).map(|k| format!("IN{k}")));
    let _ = writeln!(s, "#define EPILOGUE(row, a) {}", spec.epi.glsl());
    defined.push("EPILOGUE".into());
    s += "#include \"persistent_matvec.glsl\"\n";
    for d in defined {
        let _ = writeln!(s, "#undef {d}");
    }
    s
}

/// Bindings `first..` holding `inputs`, read by `IN<k>(row)`.
fn declare_inputs(s: &mut String, inputs: &[ExtraSpec], first: usize) {
    declare_inputs_as(s, inputs, first, "", "");
}

/// `N_IN`, `PRELOAD_INS(row, pre)` (each of the `extras` inputs' elements loaded into `pre`) and
/// `EPILOGUE(row, a, pre)` (`epi` over the accumulators and `pre`): a kernel loads its extra
/// inputs before its dots, so that the epilogue waits on no memory (fused_matvec.glsl).
fn preloaded_epilogue(s: &mut String, extras: usize, epi: &Epi) {
    let _ = writeln!(s, "#define N_IN {}", extras.max(1));
    let loads: String = (0..extras)
        .map(|k| format!(" pre[{k}] = IN{k}(row);"))
        .collect();
    let _ = writeln!(s, "#define PRELOAD_INS(row, pre){loads}");
    let _ = writeln!(
        s,
        "#define EPILOGUE(row, a, pre) {}",
        epi.glsl_with(&|k| format!("pre[{k}]"))
    );
}

/// [`declare_inputs`] with blocks named `E<tag><k>` / `e<tag><k>` and a qualifier.
fn declare_inputs_as(
    s: &mut String,
    inputs: &[ExtraSpec],
    first: usize,
    tag: &str,
    qualifier: &str,
) {
    for (k, e) in inputs.iter().enumerate() {
        let _ = writeln!(
            s,
            "layout(set = 0, binding = {}, std430) {qualifier}readonly buffer E{tag}{k} {{ uint e{tag}{k}[]; }};",
            first + k
        );
        let index = if e.scalar { "0u" } else { "(row)" };
        let _ = writeln!(
            s,
            "#define IN{k}(row) LOAD({}, e{tag}{k}, {index})",
            dtype_code(e.dtype)
        );
    }
}

/// The elementwise kernel of `spec`.
pub fn elementwise(spec: &ElementwiseSpec) -> Generated {
    let mut s = String::from(HEADER);
    let _ = writeln!(
        s,
        "// Generated by vkfuse (fuse::codegen): elementwise {}",
        spec.epi
    );
    s += "#include \"common.glsl\"\n";
    declare_inputs(&mut s, &spec.inputs, 1);
    let _ = writeln!(s, "#define EW(row) {}", spec.epi.glsl());
    s += "#include \"fused_elementwise.glsl\"\n";
    Generated {
        label: format!("fused_elementwise[{}]", spec.epi),
        source: s,
        spec_constants: vec![ELEMENTWISE_WG, u(spec.n)],
        workgroups: workgroups(spec.n.div_ceil(ELEMENTWISE_WG as usize)),
        bindings: 1 + spec.inputs.len(),
    }
}

/// The attention block of `spec`.
pub fn attention(spec: &AttnSpec) -> Generated {
    let inv_freq = crate::kernels::rope_inv_freq(spec.theta.0, spec.rotary_dim);
    let (norm, qk) = match &spec.qk_norm {
        Some((n, k)) => (Some(n), Some((n.dtype, *k))),
        None => (None, None),
    };
    let mut s = String::from(HEADER);
    let _ = writeln!(
        s,
        "// Generated by vkfuse (fuse::codegen): attention block, {} q heads per kv head, rope {} of {}{}",
        spec.hq / spec.hkv,
        spec.rotary_dim,
        spec.head_dim,
        if norm.is_some() { ", q/k norm" } else { "" }
    );
    let _ = writeln!(s, "#define QK_NORM {}", u8::from(norm.is_some()));
    let (qd, kd) = qk.unwrap_or((DType::F32, DType::F32));
    let _ = writeln!(s, "#define QN_DTYPE {}", dtype_code(qd));
    let _ = writeln!(s, "#define KN_DTYPE {}", dtype_code(kd));
    let _ = writeln!(
        s,
        "#define NORM_ZC {}",
        u8::from(norm.is_some_and(|n| n.zero_centered))
    );
    let _ = writeln!(s, "#define ROT {}u", spec.rotary_dim);
    let splits = spec.splits.max(1);
    let _ = writeln!(s, "#define SPLITS {splits}");
    let _ = writeln!(s, "#define MIN_CHUNK {}u", spec.min_chunk.max(1));
    let _ = writeln!(s, "#define KV_DTYPE {}", dtype_code(spec.kv_dtype));
    let _ = writeln!(
        s,
        "#define POLLED_COMBINE {}",
        u8::from(spec.polled_combine)
    );
    let _ = writeln!(s, "#define EARLY_TILE {}", u8::from(spec.early_tile));
    let _ = writeln!(s, "#define ATTN_SG {}", u8::from(spec.subgroup_walk));
    // Only where gated: the other blocks' sources stay as they were.
    if spec.gated {
        s += "#define GATED 1\n";
    }
    // The first tile's K and V loaded before the norms and rope (whole 16-byte chunks per lane).
    let _ = writeln!(
        s,
        "#define PREFETCH {}",
        u8::from(spec.head_dim.is_multiple_of(16))
    );
    // The scratch and the counters follow the other bindings.
    let mut bindings = if norm.is_some() { 9 } else { 7 };
    if splits > 1 {
        let _ = writeln!(s, "#define PART_BINDING {bindings}");
        let _ = writeln!(s, "#define COUNT_BINDING {}", bindings + 1);
        bindings += 2;
    }
    s += "#include \"common.glsl\"\n";
    // inv_freq exactly as the rope kernel's spec constants carry it (bit patterns).
    let table: Vec<String> = inv_freq
        .iter()
        .map(|f| format!("uintBitsToFloat(0x{:08x}u)", f.to_bits()))
        .collect();
    let _ = writeln!(
        s,
        "float inv_freq(uint i) {{\n    const float table[{}] = float[]({});\n    return table[i];\n}}",
        table.len(),
        table.join(", ")
    );
    s += "#include \"fused_attention.glsl\"\n";
    let spec_constants = vec![
        spec.workgroup,
        u(spec.hq),
        u(spec.hkv),
        u(spec.capacity),
        u(spec.head_dim),
        spec.scale.0.to_bits(),
        norm.map_or(0.0f32, |n| n.eps.0).to_bits(),
    ];
    Generated {
        label: format!(
            "fused_attention[hq={},hkv={},d={},rot={}{}{}{}{}{},splits={splits}]",
            spec.hq,
            spec.hkv,
            spec.head_dim,
            spec.rotary_dim,
            if norm.is_some() { ",qk_norm" } else { "" },
            if spec.kv_dtype == DType::F16 {
                ",kv=f16"
            } else {
                ""
            },
            // The paths the compiler asked for (the walk falls back to attend() on a device
            // whose subgroups do not fit it), for `vkfuse kernels` and `inspect` readers.
            if spec.early_tile { ",early" } else { "" },
            if spec.subgroup_walk { ",walk" } else { "" },
            if spec.gated { ",gated" } else { "" },
        ),
        source: s,
        spec_constants,
        workgroups: workgroups(spec.hq * splits),
        bindings,
    }
}

/// The Gated DeltaNet step of `spec`: the gates' generated expressions, their inputs' index
/// maps, around `fused_gdn.glsl`.
pub fn gdn(spec: &GdnSpec) -> Generated {
    use crate::fuse::lang::GateIndex;
    let l = &spec.layout;
    let mut s = String::from(HEADER);
    let _ = writeln!(
        s,
        "// Generated by vkfuse (fuse::codegen): Gated DeltaNet step, {}",
        spec.describe()
    );
    let _ = writeln!(s, "#define CW_DTYPE {}", dtype_code(spec.conv_dtype));
    let _ = writeln!(s, "#define NW_DTYPE {}", dtype_code(spec.norm_dtype));
    let _ = writeln!(s, "#define GDN_PARTS {}", spec.parts);
    // Handoffs: the step reads x (binding 3) as words where replay hands the projection over,
    // and with it the gate inputs sliced from the projection (column maps: Qwen3-Next's a and
    // b), which the plan requires (anything else of the level reading the projection keeps
    // the barrier). The role has three slots: x's and two gate inputs'; with more such inputs
    // the step reads nothing as words.
    let dtypes: Vec<DType> = spec
        .g_inputs
        .iter()
        .chain(&spec.beta_inputs)
        .copied()
        .collect();
    // (A role names bindings below 16: a gate input past them is read from its binding.)
    let mut word_gates: Vec<usize> = (0..dtypes.len())
        .filter(|&k| {
            6 + k < 16
                && dtypes[k] == DType::F32
                && matches!(l.gate_inputs.get(k), Some(GateIndex::Columns { .. }))
        })
        .collect();
    let mut role = 1u32 << 31;
    if word_gates.len() <= 2 {
        role |= 1 << 3;
        for &k in &word_gates {
            role |= 1 << (6 + k);
        }
    } else {
        word_gates.clear();
    }
    let _ = writeln!(s, "#define HANDOFF_ROLE 0x{role:08x}u");
    s += "#include \"common.glsl\"\n#include \"fused_epilogue.glsl\"\n#include \"handoff.glsl\"\n";
    let mut binding = 6;
    let mut maps = l.gate_inputs.iter();
    for (name, epi, inputs) in [
        ("g", &spec.g, &spec.g_inputs),
        ("beta", &spec.beta, &spec.beta_inputs),
    ] {
        for (k, dt) in inputs.iter().enumerate() {
            let _ = writeln!(
                s,
                "layout(set = 0, binding = {binding}, std430) readonly buffer {name}{k}_b {{ uint {name}{k}[]; }};"
            );
            let index = match maps.next() {
                Some(GateIndex::Columns { width, start, n }) => {
                    format!("(((row) / {n}u) * {width}u + {start}u + (row) % {n}u)")
                }
                _ => "(row)".to_string(),
            };
            let load = format!("LOAD({}, {name}{k}, {index})", dtype_code(*dt));
            // Gate input `binding - 6`: slot 1 + its place among the word inputs (binding 3's
            // x is slot 0).
            match word_gates.iter().position(|&w| w + 6 == binding) {
                Some(p) => {
                    let _ = writeln!(
                        s,
                        "#define IN{k}(row) (handoff_reading() ? handoff_load({}u, {index}) : {load})",
                        p + 1
                    );
                }
                _ => {
                    let _ = writeln!(s, "#define IN{k}(row) {load}");
                }
            }
            binding += 1;
        }
        let _ = writeln!(
            s,
            "float gate_{name}(uint row) {{\n    return {};\n}}",
            epi.glsl()
        );
        for k in 0..inputs.len() {
            let _ = writeln!(s, "#undef IN{k}");
        }
    }
    if spec.parts > 1 {
        // The arrival counters, after the kernel's other bindings (`KernelKind::arrival`).
        let _ = writeln!(s, "#define COUNT_BINDING {binding}");
        binding += 1;
    }
    s += "#include \"fused_gdn.glsl\"\n";
    let spec_constants = vec![
        spec.workgroup_size(),
        u(spec.hk),
        u(spec.r),
        u(spec.dk),
        u(spec.dv),
        u(spec.km1),
        u(l.width),
        u(l.q),
        u(l.k),
        u(l.v),
        u(l.z),
        l.l2_eps.0.to_bits(),
        l.scale.0.to_bits(),
        l.norm_eps.0.to_bits(),
    ];
    Generated {
        label: format!(
            "fused_gdn[hk={},r={},dk={},dv={},parts={},g={},beta={}]",
            spec.hk, spec.r, spec.dk, spec.dv, spec.parts, spec.g, spec.beta
        ),
        source: s,
        spec_constants,
        workgroups: workgroups(spec.hk * spec.parts),
        bindings: binding,
    }
}

/// The router kernel of `spec`.
pub fn route(spec: &RouteSpec) -> Generated {
    let mut s = String::from(HEADER);
    let _ = writeln!(
        s,
        "// Generated by vkfuse (fuse::codegen): router, top {} of {} renormalised",
        spec.k, spec.n
    );
    s += "#include \"common.glsl\"\n#include \"fused_route.glsl\"\n";
    // One subgroup ranks the logits where it can; past that (Qwen3-Next's 512) the workgroup's
    // subgroups pick in a tournament, 32 logits each on a 32-wide device (route_pick.glsl). A
    // multiple of 64, so that no subgroup of a 64-wide device is partly filled.
    let wg = u(spec.n.next_multiple_of(64).clamp(64, 512));
    Generated {
        label: format!("fused_route[n={},k={}]", spec.n, spec.k),
        source: s,
        spec_constants: vec![wg, u(spec.n), u(spec.k), u(spec.ids_offset())],
        workgroups: [1, 1, 1],
        bindings: 2,
    }
}

/// The weighted expert sum of `spec` (the weights are a binding of their own unless the kernel
/// routes for itself).
pub fn expert_sum(spec: &ExpertSpec) -> Generated {
    let bindings = match spec.routing {
        Routing::Read => 5,
        Routing::Own { .. } => 4,
    };
    // Up to 8 experts (one pass of `expert_dots.glsl`): a row per workgroup, its K dots in one
    // exchange. More (Qwen3-Next-80B's 10): 4 rows per workgroup, each expert's input row read
    // once for them all and not once per row (`rows_main`; 2048 one-row workgroups read 40 MB
    // of input rows from L2 a level): on an H200 its widths in 4 layers, q4_0, +1.9%, and 8
    // rows −8.4% (docs/perf.md, session 50). `VKFUSE_EXPERT_SUM_ROWS` (1..=8, read at compile
    // time) is that A/B knob.
    let rows = crate::kernels::knob("VKFUSE_EXPERT_SUM_ROWS")
        .filter(|r| (1..=8).contains(r))
        .unwrap_or(if spec.k > 8 { 4 } else { 1 });
    let grid = (rows, 1);
    // Several rows a workgroup: 4 times the invocations of the other expert kernels, in groups
    // that each span a row's steps and take every groups-th expert (`rows_main`): 4 times the
    // warps, each with a quarter of the loads in flight. On an H200 Qwen3-Next-80B's widths in 4
    // layers, q4_0, ran +4.9% against the one group of session 50's kernel (its rows of 512: 64
    // invocations and 64 steps; docs/perf.md, session 51). At most 256 invocations, so that the
    // exchange's array (reduce.glsl's red_dots, 32 bytes an invocation) stays within 8 KiB beside
    // what a kernel that routes for itself declares (`ROUTE_SHARED_MAX`).
    // `VKFUSE_EXPERT_SUM_GROUPS` (1, 2 or 4, read at compile time) is that A/B knob.
    let wg = if rows > 1 {
        let groups = crate::kernels::knob("VKFUSE_EXPERT_SUM_GROUPS")
            .filter(|g| [1, 2, 4].contains(g))
            .unwrap_or(4);
        (expert_wg(spec) * groups).min(256)
    } else {
        expert_wg(spec)
    };
    expert_kernel(
        spec,
        "fused_expert_sum",
        "weighted and summed",
        grid,
        bindings,
        wg,
    )
}

/// The expert SwiGLU of `spec` (gate and up packed into one binding).
pub fn expert_glu(spec: &ExpertSpec) -> Generated {
    // 4 rows per workgroup: the gate's and the up's rows are one pass of 8 dots, `MAX_DOTS`.
    // On an H200 (qwen3-next-small, experts of [512 x 1024]) 4 rows took bf16 +3.7% and q4_0
    // +4.3% over the matvecs' 2, and 1 row lost 4.1% (docs/perf.md, session 46);
    // `VKFUSE_EXPERT_GLU_ROWS` (1..=4), read at compile time, is that A/B knob.
    let rows = crate::kernels::knob("VKFUSE_EXPERT_GLU_ROWS")
        .filter(|r| (1..=4).contains(r))
        .unwrap_or(4);
    let grid = (rows, spec.k);
    expert_kernel(
        spec,
        "fused_expert_glu",
        "silu(gate) * up",
        grid,
        4,
        expert_wg(spec),
    )
}

/// Invocations of an expert kernel's workgroup: one 16-byte step of each row per invocation
/// (`expert_dots.glsl` strides the row so), in 32..=128.
fn expert_wg(spec: &ExpertSpec) -> u32 {
    let per_step = match (crate::kernels::vec4(spec.dtype, spec.i), spec.dtype) {
        (0, _) => 1,
        (_, DType::F32) => 4,
        _ => 8,
    };
    // Halving it (two steps per invocation) lost 1.8-2.2% on an H200, doubling it 17%.
    u((spec.i / per_step).next_power_of_two().clamp(32, 128))
}

/// `anchor` over `groups_per_block` workgroups per block of `rows` rows (`grid`), with
/// `bindings` of its own and the epilogue's extra inputs after them.
fn expert_kernel(
    spec: &ExpertSpec,
    anchor: &str,
    what: &str,
    (rows, groups_per_block): (u32, usize),
    bindings: usize,
    wg: u32,
) -> Generated {
    let mut s = String::from(HEADER);
    let _ = writeln!(
        s,
        "// Generated by vkfuse (fuse::codegen): {} experts of [{}x{}], {what}",
        spec.k, spec.o, spec.i
    );
    let _ = writeln!(s, "#define DTYPE_1 {}", dtype_code(spec.dtype));
    if anchor == "fused_expert_sum" && rows > 1 {
        // Several rows a workgroup (`rows_main`); one row keeps the code it had without it.
        s += "#define SUM_ROWS 1\n";
    }
    let mut spec_constants = vec![
        wg,
        u(spec.o),
        u(spec.i),
        rows,
        crate::kernels::vec4(spec.dtype, spec.i),
        u(spec.e),
        u(spec.k),
    ];
    let mut routed = String::new();
    if let Routing::Own { n } = spec.routing {
        s += "#define ROUTED 1\n";
        spec_constants.push(u(n));
        routed = format!(",routed from {n}");
    }
    s += "#include \"common.glsl\"\n";
    if !spec.epi.is_identity() {
        // The extra inputs follow the kernel's own bindings.
        declare_inputs(&mut s, &spec.extras, bindings);
        // Loaded into `pre` before the routing and the dots, as the matvecs do.
        preloaded_epilogue(&mut s, spec.extras.len(), &spec.epi);
        routed += &format!(",{}", spec.epi);
    }
    let _ = writeln!(s, "#include \"{anchor}.glsl\"");
    Generated {
        label: format!(
            "{anchor}[{},e={},o={},i={},k={}{routed}]",
            dtype_code(spec.dtype),
            spec.e,
            spec.o,
            spec.i,
            spec.k
        ),
        source: s,
        spec_constants,
        workgroups: workgroups(groups_per_block * spec.o.div_ceil(rows as usize)),
        bindings: bindings + spec.extras.len(),
    }
}

/// The tail kernel of `spec`.
/// Workgroups of the tail's argmax: one up to 16384 logits; past that one per 4096 logits, at
/// most 64, the last to arrive combining their bests (a single workgroup walking 151936
/// logits took 25 µs on the H100, latency-bound).
pub fn tail_groups(spec: &TailSpec) -> usize {
    match *spec {
        TailSpec::Argmax { n } | TailSpec::Step { n } if n > 16384 => n.div_ceil(4096).min(64),
        _ => 1,
    }
}

pub fn tail(spec: &TailSpec) -> Generated {
    let (token, advance, n) = match *spec {
        TailSpec::Argmax { n } => (true, false, n),
        TailSpec::Advance => (false, true, 1),
        TailSpec::Step { n } => (true, true, n),
    };
    let groups = tail_groups(spec);
    let wg = if groups > 1 {
        256
    } else if token {
        u(n.div_ceil(4).next_power_of_two().clamp(32, 1024))
    } else {
        1
    };
    let base = 2 * usize::from(token) + 2 * usize::from(advance);
    let mut s = String::from(HEADER);
    let _ = writeln!(s, "// Generated by vkfuse (fuse::codegen): tail {spec:?}");
    let _ = writeln!(s, "#define WRITE_TOKEN {}", u8::from(token));
    let _ = writeln!(s, "#define ADVANCE {}", u8::from(advance));
    let _ = writeln!(s, "#define GROUPS {groups}");
    if groups > 1 {
        let _ = writeln!(s, "#define PART_BINDING {base}");
        let _ = writeln!(s, "#define COUNT_BINDING {}", base + 1);
    }
    s += "#include \"common.glsl\"\n#include \"fused_argmax.glsl\"\n";
    let label = match spec {
        TailSpec::Argmax { .. } => "fused_tail[argmax->token]",
        TailSpec::Advance => "fused_tail[position+1]",
        TailSpec::Step { .. } => "fused_tail[argmax->token,position+1]",
    };
    Generated {
        label: label.to_string(),
        source: s,
        spec_constants: vec![wg, u(n)],
        workgroups: [u(groups), 1, 1],
        bindings: base + if groups > 1 { 2 } else { 0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_splits_follow_the_units_the_cache_and_its_length() {
        // Qwen3-0.6B's 16 heads of 128 on an H100's 132 units: a split per 128 slots of a full
        // cache where that is more than two per unit (32 at 4096, the most)...
        assert_eq!(attention_splits(16, 128, 4096, 132), 32);
        assert_eq!(attention_splits(16, 128, 8192, 132), MAX_ATTENTION_SPLITS);
        // ... else two per unit, but no more than 256 KiB of f32 K and V per split.
        assert_eq!(attention_splits(16, 128, 2048, 132), 8);
        assert_eq!(attention_splits(16, 128, 1024, 132), 4);
        assert_eq!(attention_splits(16, 64, 8192, 132), 32);
        // 32 heads: two per unit is 8, and it stays 8.
        assert_eq!(attention_splits(32, 128, 4096, 132), 8);
        // The fixtures' small heads stay one workgroup per head (or as few as before) on any
        // number of units, lavapipe's few included: the bytes per split bound them.
        for units in [1, 2, 4, 8, 16, 132] {
            assert_eq!(attention_splits(4, 32, 512, units), 1, "{units} units");
            assert_eq!(attention_splits(6, 16, 2048, units), 1, "{units} units");
        }
        assert_eq!(attention_splits(6, 16, 4096, 132), 2);
        // Few units: two per unit, however long the cache.
        assert_eq!(attention_splits(16, 128, 4096, 8), 1);
        assert_eq!(attention_splits(16, 128, 4096, 64), 8);
    }
}
