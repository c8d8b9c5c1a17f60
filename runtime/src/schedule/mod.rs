//! The schedule: everything the runtime needs to run a compiled decode step, and nothing that
//! needs a compiler. The compiler builds it (in memory, or written to a file); the runtime
//! validates it before touching the device, then creates every object once.

mod dump;
mod file;
mod pages;
mod persistent;
mod validate;

pub use dump::{dump, Regions};
pub use file::{
    check_output, crc32, missing_folder, write_whole, FileLayout, FileWeights, ScheduleFile,
    ScheduleFileError, Section, TensorEntry, Verify, END_MAGIC, FORMAT_VERSION, MAGIC,
    WEIGHT_ALIGN,
};
pub use pages::{PieceTooLarge, PAGE_ALIGN};
pub use validate::ScheduleError;

use std::fmt;

macro_rules! id {
    ($(#[$m:meta])* $name:ident, $prefix:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u32);
        impl $name {
            /// The index into the schedule's table.
            pub fn index(self) -> usize {
                self.0 as usize
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

id!(
    /// A buffer of the schedule (`b0`).
    BufferId, "b"
);
id!(
    /// A kernel (one pipeline) of the schedule (`k0`).
    KernelId, "k"
);

/// What a buffer holds, which decides its memory and its initial contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferRole {
    /// Model weights, uploaded once at load.
    Weights,
    /// Intermediate values of one step; no contents carried between steps.
    Arena,
    /// Persistent state (KV caches, conv and recurrent state), zero at the start of a sequence.
    State,
    /// Host-visible: token, position, logits; zero at the start of a sequence.
    Io,
}

impl BufferRole {
    /// The role's name in text dumps.
    pub fn name(self) -> &'static str {
        match self {
            BufferRole::Weights => "weights",
            BufferRole::Arena => "arena",
            BufferRole::State => "state",
            BufferRole::Io => "io",
        }
    }
}

/// A buffer to create at load.
#[derive(Clone, Debug, PartialEq)]
pub struct BufferDecl {
    /// A name for dumps and debuggers.
    pub label: String,
    /// Bytes.
    pub size: u64,
    /// What it holds.
    pub role: BufferRole,
}

/// A byte range of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slice {
    /// The buffer.
    pub buffer: BufferId,
    /// Bytes from the buffer's start (aligned to the device's storage-buffer offset alignment
    /// where the slice is bound).
    pub offset: u64,
    /// Bytes.
    pub size: u64,
}

impl Slice {
    /// Whether the two share a byte of one buffer.
    pub fn overlaps(&self, other: &Slice) -> bool {
        self.buffer == other.buffer
            && self.offset < other.offset + other.size
            && other.offset < self.offset + self.size
    }
}

/// One tensor's bytes to copy into a weights buffer at load.
#[derive(Clone, Debug, PartialEq)]
pub struct WeightUpload {
    /// The tensor's name in the model.
    pub tensor: String,
    /// Where its bytes go (the size is the tensor's byte size).
    pub dst: Slice,
}

/// A compute pipeline: SPIR-V, its interface, and its specialization constants.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelDecl {
    /// The kernel's name and variant, for dumps.
    pub label: String,
    /// SPIR-V words.
    pub spirv: Vec<u32>,
    /// Storage-buffer bindings in set 0.
    pub bindings: u32,
    /// Bytes of push constants the kernel declares.
    pub push_constant_bytes: u32,
    /// `constant_id i = spec_constants[i]` (f32 as bits).
    pub spec_constants: Vec<u32>,
    /// `Some(n)`: the workgroup size (constant 0) is chosen at load from the device, `n` of its
    /// subgroups ([`KernelDecl::workgroup_size`]); `spec_constants[0]` is the size for the
    /// device class the schedule was compiled for. `None`: constant 0 as compiled (kernels whose
    /// grid or shape depends on it).
    pub subgroups: Option<u32>,
}

/// Most distinct bounds of alternative grids ([`Schedule::bands`]): replay records each of its
/// recordings once per band.
pub const MAX_BANDS: usize = 16;

/// Most subgroups a load-time workgroup may span ([`KernelDecl::subgroups`]).
pub const MAX_WORKGROUP_SUBGROUPS: u32 = 32;

impl KernelDecl {
    /// The workgroup size (specialization constant 0) on a device with `subgroup_size`-wide
    /// subgroups and at most `max_invocations` per workgroup: `subgroups` subgroups where the
    /// kernel says so (the same subgroups per workgroup, and so the same loads in flight per
    /// invocation group, on 8-, 32- and 64-wide devices), else the compiled size.
    pub fn workgroup_size(&self, subgroup_size: u32, max_invocations: u32) -> Option<u32> {
        let compiled = self.spec_constants.first().copied();
        match self.subgroups {
            Some(n) if subgroup_size.is_power_of_two() => {
                // Power-of-two counts of power-of-two subgroups; never past the device.
                let cap = max_invocations.max(1);
                let cap = 1u32 << (31 - cap.leading_zeros());
                Some(n.saturating_mul(subgroup_size).clamp(1, cap))
            }
            _ => compiled,
        }
    }

    /// Its specialization constants on the device `info` describes: the compiled ones, the
    /// workgroup size ([`Self::workgroup_size`]) chosen for that device.
    pub fn specialization(&self, info: &crate::AdapterInfo) -> crate::SpecConstants {
        let mut spec = crate::SpecConstants::new();
        for (i, v) in self.spec_constants.iter().enumerate() {
            spec = spec.u32(i as u32, *v);
        }
        // Chosen here where the kernel leaves it open, else the compiled one again.
        if let Some(wg) = self.workgroup_size(info.subgroup_size, info.max_workgroup_invocations) {
            spec = spec.u32(0, wg);
        }
        spec
    }

    /// Whether the SPIR-V declares float atomic add (`AtomicFloat32AddEXT`), which the device
    /// must offer as `shaderBufferFloat32AtomicAdd`.
    pub fn adds_floats_atomically(&self) -> bool {
        const ATOMIC_FLOAT32_ADD: u32 = 6033;
        self.declares_capability(ATOMIC_FLOAT32_ADD)
    }

    /// Whether the SPIR-V declares 64-bit integer atomics (`Int64Atomics`), which the device
    /// must offer as `shaderBufferInt64Atomics` (and `shaderInt64`).
    pub fn uses_int64_atomics(&self) -> bool {
        const INT64_ATOMICS: u32 = 12;
        self.declares_capability(INT64_ATOMICS)
    }

    /// Whether the SPIR-V declares subgroup shuffles (`GroupNonUniformShuffle`), which the
    /// device must offer in compute.
    pub fn uses_subgroup_shuffle(&self) -> bool {
        const GROUP_NON_UNIFORM_SHUFFLE: u32 = 65;
        self.declares_capability(GROUP_NON_UNIFORM_SHUFFLE)
    }

    /// Whether the SPIR-V declares f16 arithmetic (`Float16`), which the device must offer as
    /// `shaderFloat16` (the f16 dots' kernels, `compile-model --dots f16`; 16-bit storage alone
    /// does not need it).
    pub fn uses_float16_arithmetic(&self) -> bool {
        const FLOAT16: u32 = 9;
        self.declares_capability(FLOAT16)
    }

    /// Whether the SPIR-V declares packed integer dot products (`DotProduct`), which the
    /// device must offer as `shaderIntegerDotProduct` (the chained MLP's int8 dots,
    /// `compile-model --dots int8`).
    pub fn uses_integer_dot_product(&self) -> bool {
        const DOT_PRODUCT: u32 = 6019;
        self.declares_capability(DOT_PRODUCT)
    }

    /// Whether an `OpCapability` of the SPIR-V names `capability`.
    fn declares_capability(&self, capability: u32) -> bool {
        crate::vulkan::spirv::declares_capability(&self.spirv, capability)
    }

    /// Whether the kernel is wrapped for the timeline probe (`compile-model --timeline`): its
    /// SPIR-V declares the timeline's specialization constants (`session::timeline`).
    pub fn records_timeline(&self) -> bool {
        crate::vulkan::spirv::spec_constant_default(
            &self.spirv,
            crate::session::timeline::TIMELINE_SPEC_ID,
        )
        .is_some()
    }

    /// Whether its SPIR-V reads the SM it runs on (the timeline probe's `--timeline-sm`:
    /// capability `ShaderSMBuiltinsNV`).
    pub fn records_sms(&self) -> bool {
        const SHADER_SM_BUILTINS_NV: u32 = 5373;
        self.declares_capability(SHADER_SM_BUILTINS_NV)
    }

    /// The handoff role the SPIR-V declares (`kernels/glsl/handoff.glsl`), if any.
    pub fn handoff_role(&self) -> Option<crate::HandoffRole> {
        crate::HandoffRole::of_spirv(&self.spirv)
    }

    /// Whether the SPIR-V declares that its accesses need no order against any other
    /// dispatch's (an L2 prefetch: it discards what it reads and writes only a sink nothing
    /// reads): the default of specialization constant [`crate::session::handoff::UNORDERED_SPEC_ID`].
    pub fn unordered(&self) -> bool {
        crate::vulkan::spirv::spec_constant_default(
            &self.spirv,
            crate::session::handoff::UNORDERED_SPEC_ID,
        )
        .is_some_and(|v| v != 0)
    }

    /// The set-0 bindings the SPIR-V may write, as a bit mask (bit b: binding b).
    pub fn written_bindings(&self) -> u64 {
        crate::vulkan::spirv::written_bindings(&self.spirv)
    }
}

/// One dispatch of the step.
#[derive(Clone, Debug, PartialEq)]
pub struct Dispatch {
    /// The pipeline.
    pub kernel: KernelId,
    /// Binding i of set 0.
    pub bindings: Vec<Slice>,
    /// Push-constant bytes.
    pub push_constants: Vec<u8>,
    /// Workgroup counts.
    pub workgroups: [u32; 3],
    /// A short description of what it computes (the op or fused ops), for dumps and profiles.
    pub label: String,
    /// Other grids for steps at short positions, by ascending [`Alternative::below`]; empty for
    /// almost every dispatch ([`Dispatch::grid_at`]).
    pub alternatives: Vec<Alternative>,
    /// The traced program's ops it computes (their indices in the trace, `#N` in dumps), in
    /// program order; empty for work the trace has no op for (zeroing, prefetch, persistent
    /// regions). A fused schedule and the unfused one of the same trace name the same ops, so
    /// a fused kernel can be timed against the plain kernels it replaces (`vkfuse bench
    /// --profile`).
    pub ops: Vec<u32>,
}

/// Another kernel and workgroup count for one dispatch, for the steps whose position is below
/// `below` (and not below the previous alternative's). It binds the same buffers, takes the
/// same push constants and computes the same values (up to f32 rounding), only over another
/// grid: the attention block with fewer splits or smaller workgroups, which is faster while the
/// context is short and slower once it is long (docs/perf.md, session 19). So it is correct at
/// every position, and the host, which knows each step's position, may choose by it: replay
/// records one step per band of positions ([`Schedule::bands`]) and submits the one for the
/// position.
#[derive(Clone, Debug, PartialEq)]
pub struct Alternative {
    /// The first position it is not for.
    pub below: u32,
    /// The pipeline (the same bindings, push constants and handoff role as the dispatch's).
    pub kernel: KernelId,
    /// Workgroup counts.
    pub workgroups: [u32; 3],
}

impl Dispatch {
    /// The kernel and workgroup counts of the step at `position`: the first alternative whose
    /// `below` is past it, else the dispatch's own.
    pub fn grid_at(&self, position: u32) -> (KernelId, [u32; 3]) {
        match self.grid_index_at(position) {
            0 => (self.kernel, self.workgroups),
            i => (
                self.alternatives[i - 1].kernel,
                self.alternatives[i - 1].workgroups,
            ),
        }
    }

    /// Which grid [`Self::grid_at`] runs at `position`: 0 for the dispatch's own, 1 + i for
    /// alternative i.
    pub fn grid_index_at(&self, position: u32) -> usize {
        self.alternatives
            .iter()
            .position(|a| position < a.below)
            .map_or(0, |i| i + 1)
    }
}

/// A persistent region: ONE dispatch that can stand for the consecutive levels `levels`. Its
/// workgroups stay resident, stride over each level's work, and wait for each other on a grid
/// barrier in device memory between levels (kernels/glsl/persistent.glsl) instead of a pipeline
/// barrier. That is only sound where every workgroup is resident at once, which the runtime
/// decides from the device's limits at load ([`Schedule::with_persistent`]); elsewhere the
/// levels run as they are, so a region changes nothing unless the runtime applies it.
#[derive(Clone, Debug, PartialEq)]
pub struct Persistent {
    /// The levels it stands for (indices into [`Schedule::levels`]; two or more).
    pub levels: std::ops::Range<u32>,
    /// The dispatch: binding 0 is the grid barrier's 8 bytes (zero between dispatches; the
    /// barrier leaves them zero), then the bindings of the levels' dispatches in order.
    /// `workgroups[0]` is the most workgroups it can use (the widest level's); the runtime
    /// dispatches at most that many.
    pub dispatch: Dispatch,
}

/// Model facts the runtime and its users need.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelMeta {
    /// Architecture name (e.g. `Qwen3ForCausalLM`).
    pub architecture: String,
    /// Vocabulary size (the logits' length).
    pub vocab_size: u32,
    /// KV capacity in positions: the longest sequence the schedule can run.
    pub max_context: u32,
    /// End-of-sequence ids.
    pub eos_token_ids: Vec<u32>,
    /// The model's `tokenizer.json` (Hugging Face `tokenizers` format), verbatim, when the
    /// model directory had one: text in and out without the model directory.
    pub tokenizer: Option<String>,
}

/// How the token state holds the token (`Io::token`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TokenEncoding {
    /// i32: the token id.
    #[default]
    Index,
    /// u64 (8 bytes, 8-aligned): the argmax's key, `(order key of the logit << 32) | !token`,
    /// which the workgroups of the matvec that computes the logits each fold their rows into
    /// with one 64-bit atomicMax, with no arrival counted (kernels/glsl/matvec_step.glsl). The
    /// token is the complement of the low word (the first 4 bytes); the host writes a token as
    /// `(!token, 0)`, a key below every logit's.
    Key,
}

impl TokenEncoding {
    /// Bytes of the token state.
    pub fn bytes(self) -> u64 {
        match self {
            TokenEncoding::Index => 4,
            TokenEncoding::Key => 8,
        }
    }

    /// The token whose state's first 4 bytes are `word`.
    pub fn decode(self, word: u32) -> u32 {
        match self {
            TokenEncoding::Index => word,
            TokenEncoding::Key => !word,
        }
    }

    /// The token state's words for `token` written by the host: the first [`Self::bytes`] / 4
    /// of these.
    pub fn encode(self, token: u32) -> [u32; 2] {
        match self {
            TokenEncoding::Index => [token, 0],
            TokenEncoding::Key => [!token, 0],
        }
    }
}

/// The host-visible values of a step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Io {
    /// The step's input token (written by the host or by the previous step), as `token_encoding`
    /// says.
    pub token: Slice,
    /// How `token` holds it.
    pub token_encoding: TokenEncoding,
    /// `i32[1]`: the step's position, advanced on the device.
    pub position: Slice,
    /// `f32[vocab]`: the step's logits.
    pub logits: Slice,
}

/// A compiled decode step.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    /// Model facts.
    pub meta: ModelMeta,
    /// Buffers, by [`BufferId`].
    pub buffers: Vec<BufferDecl>,
    /// Weight bytes to upload at load.
    pub weights: Vec<WeightUpload>,
    /// Pipelines, by [`KernelId`].
    pub kernels: Vec<KernelDecl>,
    /// The step's dispatches in order.
    pub dispatches: Vec<Dispatch>,
    /// Index ranges of `dispatches` that may run without a barrier between them (a dependency
    /// level each); a barrier separates consecutive levels. Unfused schedules have one
    /// dispatch per level.
    pub levels: Vec<std::ops::Range<u32>>,
    /// Where the host reads and writes.
    pub io: Io,
    /// Persistent regions the runtime may apply, in level order, disjoint.
    pub persistent: Vec<Persistent>,
}

impl Schedule {
    /// The buffer a slice lives in.
    pub fn buffer(&self, id: BufferId) -> &BufferDecl {
        &self.buffers[id.index()]
    }

    /// Each dispatch's level (its index in [`Self::levels`]), by dispatch.
    pub fn dispatch_levels(&self) -> Vec<usize> {
        let mut level_of = vec![0; self.dispatches.len()];
        for (l, level) in self.levels.iter().enumerate() {
            for d in level.clone() {
                level_of[d as usize] = l;
            }
        }
        level_of
    }

    /// The bands of positions over which every dispatch keeps one grid: band `b` holds the
    /// positions below `bands()[b]` and not below `bands()[b - 1]`, and the last band (index
    /// `bands().len()`) every position from the last bound on. Empty without alternatives.
    pub fn bands(&self) -> Vec<u32> {
        let mut bounds: Vec<u32> = self
            .dispatches
            .iter()
            .flat_map(|d| d.alternatives.iter().map(|a| a.below))
            .collect();
        bounds.sort_unstable();
        bounds.dedup();
        bounds
    }

    /// The same step with every dispatch in a level of its own (a barrier before each), and no
    /// persistent regions (they stand for levels that no longer exist): what timing each
    /// kernel alone in the step needs ([`crate::session::Replay::profile_levels`] then gives a
    /// time per dispatch). Still correct: a barrier more orders nothing wrongly.
    pub fn one_dispatch_per_level(&self) -> Schedule {
        Schedule {
            levels: (0..self.dispatches.len() as u32)
                .map(|d| d..d + 1)
                .collect(),
            persistent: vec![],
            ..self.clone()
        }
    }

    /// The band ([`Self::bands`]) of `position`.
    pub fn band_of(bands: &[u32], position: u32) -> usize {
        bands.partition_point(|&b| b <= position)
    }

    /// A position of band `band` (its last), at which [`Dispatch::grid_at`] gives the band's
    /// grid.
    pub fn band_position(bands: &[u32], band: usize) -> u32 {
        bands.get(band).map_or(u32::MAX, |b| b - 1)
    }

    /// A kernel that adds floats atomically (so the device must offer
    /// `shaderBufferFloat32AtomicAdd`, and runs agree to f32 reassociation, not to the bit).
    pub fn float_atomic_kernel(&self) -> Option<&KernelDecl> {
        self.kernels.iter().find(|k| k.adds_floats_atomically())
    }

    /// A kernel with 64-bit integer atomics (so the device must offer them).
    pub fn int64_atomic_kernel(&self) -> Option<&KernelDecl> {
        self.kernels.iter().find(|k| k.uses_int64_atomics())
    }

    /// A kernel with subgroup shuffles (so the device must offer them in compute).
    pub fn shuffle_kernel(&self) -> Option<&KernelDecl> {
        self.kernels.iter().find(|k| k.uses_subgroup_shuffle())
    }

    /// A kernel with f16 arithmetic (so the device must offer `shaderFloat16`).
    pub fn float16_kernel(&self) -> Option<&KernelDecl> {
        self.kernels.iter().find(|k| k.uses_float16_arithmetic())
    }

    /// A kernel with packed integer dot products (so the device must offer
    /// `shaderIntegerDotProduct`).
    pub fn integer_dot_kernel(&self) -> Option<&KernelDecl> {
        self.kernels.iter().find(|k| k.uses_integer_dot_product())
    }
}

#[cfg(test)]
impl ModelMeta {
    /// The metadata of a schedule made up in a unit test.
    pub(crate) fn for_tests() -> ModelMeta {
        ModelMeta {
            architecture: "test".into(),
            vocab_size: 1,
            max_context: 1,
            eos_token_ids: vec![],
            tokenizer: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn should_run_each_position_on_its_bands_grid() {
        let alt = |below, k| Alternative {
            below,
            kernel: KernelId(k),
            workgroups: [k, 1, 1],
        };
        let d = Dispatch {
            kernel: KernelId(9),
            bindings: vec![],
            push_constants: vec![],
            workgroups: [9, 1, 1],
            label: "attention".into(),
            alternatives: vec![alt(128, 1), alt(512, 2)],
            ops: vec![],
        };
        assert_eq!(d.grid_at(0), (KernelId(1), [1, 1, 1]));
        assert_eq!(d.grid_at(127), (KernelId(1), [1, 1, 1]));
        assert_eq!(d.grid_at(128), (KernelId(2), [2, 1, 1]));
        assert_eq!(d.grid_at(511), (KernelId(2), [2, 1, 1]));
        assert_eq!(d.grid_at(512), (KernelId(9), [9, 1, 1]));
        // Bands over every dispatch's bounds (here another at 256): each band's position gives
        // the grid of every position of the band.
        let mut other = d.clone();
        other.alternatives = vec![alt(256, 3)];
        let bands = [128, 256, 512];
        for p in [0, 100, 127, 128, 255, 256, 300, 511, 512, 4000] {
            let band = Schedule::band_of(&bands, p);
            let at = Schedule::band_position(&bands, band);
            assert_eq!(d.grid_at(at), d.grid_at(p), "{p}");
            assert_eq!(other.grid_at(at), other.grid_at(p), "{p}");
        }
        assert_eq!(Schedule::band_of(&bands, 127), 0);
        assert_eq!(Schedule::band_of(&bands, 128), 1);
        assert_eq!(Schedule::band_of(&bands, 4000), 3);
        assert_eq!(Schedule::band_position(&bands, 3), u32::MAX);
    }

    fn kernel(subgroups: Option<u32>, spec: &[u32]) -> KernelDecl {
        KernelDecl {
            label: "k".into(),
            spirv: vec![],
            bindings: 1,
            push_constant_bytes: 0,
            spec_constants: spec.to_vec(),
            subgroups,
        }
    }

    #[test]
    fn should_size_an_open_workgroup_in_the_devices_subgroups() {
        let k = kernel(Some(4), &[128, 7]);
        // NVIDIA (the class it was compiled for), lavapipe, AMD's wave64.
        assert_eq!(k.workgroup_size(32, 1024), Some(128));
        assert_eq!(k.workgroup_size(8, 1024), Some(32));
        assert_eq!(k.workgroup_size(64, 1024), Some(256));
        // Never past the device's limit, kept a power of two.
        assert_eq!(k.workgroup_size(64, 128), Some(128));
        assert_eq!(k.workgroup_size(64, 200), Some(128));
        // A subgroup width that is no power of two: the compiled size.
        assert_eq!(k.workgroup_size(48, 1024), Some(128));
        // A fixed workgroup stays as compiled; none at all stays none.
        assert_eq!(kernel(None, &[1024]).workgroup_size(8, 1024), Some(1024));
        assert_eq!(kernel(None, &[]).workgroup_size(8, 1024), None);
        assert_eq!(kernel(Some(1), &[32]).workgroup_size(8, 1024), Some(8));
    }
}
