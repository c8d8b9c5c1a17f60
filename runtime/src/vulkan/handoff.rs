//! Handoff words (`kernels/glsl/handoff.glsl`): a buffer of flagged words at set 1 through
//! which a kernel publishes its output and the next level's kernel reads it, so that replay
//! can record the two levels with no pipeline barrier between them. The words are
//! [`HANDOFF_EMPTY`] until published; whoever records handoffs fills them so before each step.
//!
//! A pipeline whose module declares a role needs words bound before each dispatch: handoff
//! words of a real plan, or any words with [`HandoffPush::NONE`] (then the kernel reads and
//! writes its bindings only).

use super::buffer::{Buffer, BufferKind};
use super::command::CommandRecorder;
use super::descriptor::{BufferBinding, DescriptorSet};
use super::device::Device;
use super::pipeline::Pipeline;
use crate::error::{Error, Result};

/// The specialization constant whose default declares a kernel's handoff role.
pub const HANDOFF_ROLE_SPEC_ID: u32 = 190;
/// Bytes of push constants of a kernel with a role: [`HandoffPush`].
pub const HANDOFF_PUSH_BYTES: u32 = 16;
/// A word not yet published (a NaN pattern no kernel publishes).
pub const HANDOFF_EMPTY: u32 = u32::MAX;

/// What a kernel can do with handoff words, as its module declares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandoffRole {
    /// The set-0 bindings it can read as handoff words, in slot order (at most 3).
    pub reads: Vec<u32>,
    /// Whether it can publish its binding 0.
    pub publishes: bool,
}

impl HandoffRole {
    /// The role SPIR-V `words` declare: the default of specialization constant
    /// [`HANDOFF_ROLE_SPEC_ID`], if the module has one.
    pub fn of_spirv(words: &[u32]) -> Option<HandoffRole> {
        super::spirv::spec_constant_default(words, HANDOFF_ROLE_SPEC_ID).map(Self::from_bits)
    }

    /// Bit b < 16: binding b is read; bit 31: binding 0 published (handoff.glsl).
    pub fn from_bits(bits: u32) -> HandoffRole {
        HandoffRole {
            reads: (0..16).filter(|b| bits & (1 << b) != 0).take(3).collect(),
            publishes: bits & (1 << 31) != 0,
        }
    }
}

/// One dispatch's handoff push constants: word indices, or [`HandoffPush::NONE_AT`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct HandoffPush {
    /// Where binding 0's element 0 is published.
    pub out_at: u32,
    /// Where element 0 of each read binding (slot order) is read from; all or none set.
    pub in_at: [u32; 3],
}

impl HandoffPush {
    /// "Not this one".
    pub const NONE_AT: u32 = u32::MAX;
    /// Neither publishes nor reads words.
    pub const NONE: HandoffPush = HandoffPush {
        out_at: Self::NONE_AT,
        in_at: [Self::NONE_AT; 3],
    };
}

/// A handoff-words buffer and the set 1 that binds it.
pub struct HandoffWords {
    buffer: Buffer,
    set: DescriptorSet,
    words: u32,
}

impl HandoffWords {
    /// `words` words (at least one), [`HANDOFF_EMPTY`], for pipelines with a handoff role
    /// (their set-1 layouts are all alike: `pipeline` may be any of them).
    pub fn new(device: &Device, pipeline: &Pipeline, words: u32) -> Result<HandoffWords> {
        let words = words.max(1);
        let mut buffer = device.create_buffer_labeled(
            "handoff words",
            4 * u64::from(words),
            BufferKind::DeviceLocal,
        )?;
        device.upload(&mut buffer, 0, &vec![0xffu8; 4 * words as usize])?;
        let pool = device.create_descriptor_pool(1, 1)?;
        let set = pool.allocate_handoff(pipeline)?;
        device.write_descriptors(&set, &[BufferBinding::whole(0, &buffer)])?;
        Ok(HandoffWords { buffer, set, words })
    }

    /// The buffer (fill it with [`HANDOFF_EMPTY`] before a step whose levels hand off; the set
    /// comes from a [`super::DescriptorPool::allocate_handoff`]).
    pub fn buffer(&self) -> &Buffer {
        &self.buffer
    }

    /// Binds the words at set 1 of the bound pipeline and pushes `push`, when the pipeline has a
    /// handoff role (bind set 0 first); nothing for one without.
    pub fn bind(&self, rec: &mut CommandRecorder<'_>, push: HandoffPush) -> Result<()> {
        if !rec.bound_has_handoff()? {
            return Ok(());
        }
        let past = |at: u32| at != HandoffPush::NONE_AT && at >= self.words;
        if past(push.out_at) || push.in_at.iter().any(|&a| past(a)) {
            return Err(Error::InvalidArgument(format!(
                "handoff push {push:?} past the {} words",
                self.words
            )));
        }
        rec.bind_handoff_set(&self.set)?;
        rec.push_constants_pod(0, &push)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_read_from_bits() {
        let r = HandoffRole::from_bits((1 << 1) | (1 << 2) | (1 << 3) | (1 << 31));
        assert_eq!(r.reads, vec![1, 2, 3]);
        assert!(r.publishes);
        let r = HandoffRole::from_bits(1 << 2);
        assert_eq!(r.reads, vec![2]);
        assert!(!r.publishes);
    }
}
