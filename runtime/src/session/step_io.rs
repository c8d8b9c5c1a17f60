//! Replay's work between two chained steps in one compute dispatch: the handoff words set empty
//! for the next step and the step's token (and logits, when asked for) copied into the host's
//! ring. `vkCmdFillBuffer` and `vkCmdCopyBuffer` did it before; on an H100 those transfers held
//! the queue ~6 µs per token between two steps, and recorded after the next step's first level
//! instead they held it there (docs/perf.md, session 25).
//!
//! The kernel is the runtime's own, so its SPIR-V is committed here (`step_io.spv`, compiled
//! from `kernels/glsl/step_io.comp`; `compiler/tests/step_io.rs` checks that the two agree,
//! and `VKFUSE_BLESS=1` there rewrites it): the runtime has no compiler.

use super::SessionError;
use crate::{
    spirv_from_bytes, Buffer, BufferBinding, CommandRecorder, DescriptorPool, DescriptorSet,
    Device, Pipeline, SpecConstants, HANDOFF_EMPTY,
};

/// `kernels/glsl/step_io.comp` compiled.
const SPIRV: &[u8] = include_bytes!("step_io.spv");

/// Workgroups of a dispatch (of 64 invocations): the kernel loops over the words it is given,
/// so any number does; enough to spread a vocabulary's logits over the device.
const WORKGROUPS: u32 = 1024;

/// The kernel's push constants (`step_io.comp`'s `StepIo`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct Push {
    fill_words: u32,
    fill_value: u32,
    src0: u32,
    dst0: u32,
    len0: u32,
    src1: u32,
    dst1: u32,
    len1: u32,
}

/// One run of words copied from the I/O buffer to a ring: source and destination as byte
/// offsets (the I/O buffer's from its start, the ring's from its start), and the length in
/// bytes; all multiples of 4.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Run {
    pub src: u64,
    pub dst: u64,
    pub bytes: u64,
}

/// The pipeline and a set per ring.
pub(crate) struct StepIo {
    pipeline: Pipeline,
    _pool: DescriptorPool,
    /// By ring, in the order given to [`StepIo::new`].
    sets: Vec<DescriptorSet>,
    /// The I/O buffer's bound range starts here (bytes).
    src_base: u64,
    /// Handoff words to fill with [`HANDOFF_EMPTY`].
    fill_words: u32,
}

impl StepIo {
    /// The kernel for `io` (the I/O buffer, of which bytes `io_range` are read), the handoff
    /// words `words` (the buffer and how many of its words to fill; None: nothing filled) and
    /// `rings`.
    pub(crate) fn new(
        device: &Device,
        io: &Buffer,
        io_range: std::ops::Range<u64>,
        words: Option<(&Buffer, u32)>,
        rings: &[&Buffer],
    ) -> Result<StepIo, SessionError> {
        let pipeline = device.create_pipeline(
            &spirv_from_bytes(SPIRV)?,
            &SpecConstants::new(),
            3,
            std::mem::size_of::<Push>() as u32,
        )?;
        let align = device.storage_offset_alignment().max(1);
        let src_base = io_range.start / align * align;
        let pool = device.create_descriptor_pool(rings.len() as u32, 3 * rings.len() as u32)?;
        let mut sets = Vec::with_capacity(rings.len());
        for ring in rings {
            let set = pool.allocate(&pipeline)?;
            // Without words to fill the binding still needs a buffer: the ring, never written
            // through it (no word is filled).
            let (wbuf, _) = words.unwrap_or((ring, 0));
            device.write_descriptors(
                &set,
                &[
                    whole(wbuf, 0),
                    BufferBinding {
                        binding: 1,
                        buffer: io,
                        offset: src_base,
                        range: io_range.end - src_base,
                    },
                    whole(ring, 2),
                ],
            )?;
            sets.push(set);
        }
        Ok(StepIo {
            pipeline,
            _pool: pool,
            sets,
            src_base,
            fill_words: words.map_or(0, |(_, n)| n),
        })
    }

    /// Records the dispatch: the words filled (when `fill`), and `token` and `logits` (where
    /// given) copied to ring `ring`.
    pub(crate) fn record(
        &self,
        rec: &mut CommandRecorder<'_>,
        ring: usize,
        fill: bool,
        token: Run,
        logits: Option<Run>,
    ) -> Result<(), SessionError> {
        let word = |bytes: u64| (bytes / 4) as u32;
        // Without logits the second run copies no words.
        let logits = logits.unwrap_or(Run { bytes: 0, ..token });
        let push = Push {
            fill_words: if fill { self.fill_words } else { 0 },
            fill_value: HANDOFF_EMPTY,
            src0: word(token.src - self.src_base),
            dst0: word(token.dst),
            len0: word(token.bytes),
            src1: word(logits.src - self.src_base),
            dst1: word(logits.dst),
            len1: word(logits.bytes),
        };
        rec.bind_pipeline(&self.pipeline)?;
        rec.bind_descriptor_set(&self.sets[ring])?;
        rec.push_constants_pod(0, &push)?;
        rec.dispatch(WORKGROUPS, 1, 1)?;
        Ok(())
    }
}

/// All of `buffer` at `binding`.
fn whole(buffer: &Buffer, binding: u32) -> BufferBinding<'_> {
    BufferBinding {
        binding,
        buffer,
        offset: 0,
        range: buffer.size(),
    }
}
