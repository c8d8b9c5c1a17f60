//! Descriptor pools, sets, and the storage-buffer writes into them (each one counted: the
//! eager baseline pays one per binding per dispatch, replay pays none per token).

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ash::vk;

use super::buffer::{check_range, Buffer, BufferInner};
use super::command::Fence;
use super::device::{lock, Device, DeviceShared};
use super::pipeline::{Pipeline, SetLayout};
use crate::error::{vk_err, Error, Result};

/// A descriptor pool for storage-buffer sets. Sets are not freed one by one: their slots return
/// when the pool and every set from it are dropped.
pub struct DescriptorPool {
    inner: Arc<PoolInner>,
}

pub(crate) struct PoolInner {
    /// Allocation from a pool needs the pool externally synchronised.
    state: Mutex<PoolState>,
    max_sets: u32,
    max_storage_buffers: u32,
    shared: Arc<DeviceShared>,
}

/// Counted here because some drivers (lavapipe) never report a full pool: without the count,
/// the same program would fail on one driver and silently over-allocate on another.
struct PoolState {
    raw: vk::DescriptorPool,
    sets: u32,
    storage_buffers: u32,
}

impl fmt::Debug for DescriptorPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DescriptorPool")
            .field("max_sets", &self.inner.max_sets)
            .finish_non_exhaustive()
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        let raw = lock(&self.state).raw;
        // SAFETY: every set from the pool holds this Arc, so none is left; destroyed once.
        unsafe { self.shared.raw.destroy_descriptor_pool(raw, None) };
    }
}

/// A descriptor set of storage buffers, allocated for a pipeline's layout (and usable with any
/// pipeline whose set has the same number of bindings).
pub struct DescriptorSet {
    pub(crate) inner: Arc<SetInner>,
}

pub(crate) struct SetInner {
    pub(crate) raw: vk::DescriptorSet,
    pub(crate) layout: Arc<SetLayout>,
    /// The buffers written into it (kept alive while a command buffer may use them) and the
    /// fence of the last submission that used the set.
    pub(crate) state: Mutex<SetState>,
    _pool: Arc<PoolInner>,
}

#[derive(Default)]
pub(crate) struct SetState {
    buffers: Vec<Option<Arc<BufferInner>>>,
    pub(crate) last_fence: Option<Arc<Fence>>,
    /// Bumped by every update: a command buffer that bound an older generation is invalid.
    pub(crate) generation: u64,
}

impl fmt::Debug for DescriptorSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DescriptorSet")
            .field("n_bindings", &self.inner.layout.n_bindings)
            .finish_non_exhaustive()
    }
}

impl DescriptorSet {
    /// Its number of storage-buffer bindings.
    pub fn n_bindings(&self) -> u32 {
        self.inner.layout.n_bindings
    }

    /// The Vulkan handle.
    pub fn raw(&self) -> vk::DescriptorSet {
        self.inner.raw
    }
}

/// One storage-buffer binding to write: `buffer[offset .. offset + range]` at `binding`.
#[derive(Clone, Copy, Debug)]
pub struct BufferBinding<'a> {
    /// The binding number in set 0.
    pub binding: u32,
    /// The buffer.
    pub buffer: &'a Buffer,
    /// Start, a multiple of `minStorageBufferOffsetAlignment`.
    pub offset: u64,
    /// Length in bytes, at most `maxStorageBufferRange`.
    pub range: u64,
}

impl<'a> BufferBinding<'a> {
    /// The whole buffer at `binding`.
    pub fn whole(binding: u32, buffer: &'a Buffer) -> Self {
        Self {
            binding,
            buffer,
            offset: 0,
            range: buffer.size(),
        }
    }
}

impl Device {
    /// A pool for `max_sets` sets holding `max_storage_buffers` storage buffers in all.
    pub fn create_descriptor_pool(
        &self,
        max_sets: u32,
        max_storage_buffers: u32,
    ) -> Result<DescriptorPool> {
        let sizes = [vk::DescriptorPoolSize::default()
            .ty(vk::DescriptorType::STORAGE_BUFFER)
            .descriptor_count(max_storage_buffers.max(1))];
        // Vulkan wants non-zero counts; the pool's own counts still refuse past the asked ones.
        let info = vk::DescriptorPoolCreateInfo::default()
            .max_sets(max_sets.max(1))
            .pool_sizes(&sizes);
        // SAFETY: the device is live; `sizes` outlives the call.
        let raw = unsafe { self.shared.raw.create_descriptor_pool(&info, None) }
            .map_err(vk_err("vkCreateDescriptorPool"))?;
        Ok(DescriptorPool {
            inner: Arc::new(PoolInner {
                state: Mutex::new(PoolState {
                    raw,
                    sets: 0,
                    storage_buffers: 0,
                }),
                max_sets,
                max_storage_buffers,
                shared: Arc::clone(&self.shared),
            }),
        })
    }

    /// Writes storage-buffer bindings into `set` with one `vkUpdateDescriptorSets` call; each
    /// binding counts as one descriptor write. Fails with [`Error::InUse`] while a submission
    /// using the set is still running (updating it then is undefined behaviour). An update
    /// invalidates command buffers already recorded with the set: submitting one again fails
    /// until it is recorded again (bind sets that change per token from a ring instead).
    pub fn write_descriptors(
        &self,
        set: &DescriptorSet,
        bindings: &[BufferBinding<'_>],
    ) -> Result<()> {
        let start = Instant::now();
        let shared = &self.shared;
        let inner = &set.inner;
        let n = inner.layout.n_bindings;
        let align = shared.info.min_storage_buffer_offset_alignment.max(1);
        let max_range = u64::from(shared.info.max_storage_buffer_range);
        for b in bindings {
            if b.binding >= n {
                return Err(Error::InvalidArgument(format!(
                    "binding {} of a set with {n} bindings",
                    b.binding
                )));
            }
            if !Arc::ptr_eq(&b.buffer.inner.shared, shared) {
                return Err(Error::InvalidArgument("a buffer of another device".into()));
            }
            check_range("descriptor write", b.buffer.size(), b.offset, b.range)?;
            if b.offset % align != 0 {
                return Err(Error::InvalidArgument(format!(
                    "descriptor offset {} is not a multiple of minStorageBufferOffsetAlignment {align}",
                    b.offset
                )));
            }
            if b.range == 0 || b.range > max_range {
                return Err(Error::InvalidArgument(format!(
                    "descriptor range {} must be in 1..={max_range} (maxStorageBufferRange)",
                    b.range
                )));
            }
        }

        // The lock also serialises updates of this set, which Vulkan requires.
        let mut state = lock(&inner.state);
        if let Some(fence) = &state.last_fence {
            if !fence.is_signaled()? {
                return Err(Error::InUse("descriptor set"));
            }
            state.last_fence = None;
        }
        let infos: Vec<[vk::DescriptorBufferInfo; 1]> = bindings
            .iter()
            .map(|b| {
                [vk::DescriptorBufferInfo::default()
                    .buffer(b.buffer.inner.raw)
                    .offset(b.offset)
                    .range(b.range)]
            })
            .collect();
        let writes: Vec<vk::WriteDescriptorSet<'_>> = bindings
            .iter()
            .zip(&infos)
            .map(|(b, info)| {
                vk::WriteDescriptorSet::default()
                    .dst_set(inner.raw)
                    .dst_binding(b.binding)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .buffer_info(info)
            })
            .collect();
        // SAFETY: the set is not used by a pending submission (checked above) and its state lock
        // is held; the buffers are live and the ranges checked; the arrays outlive the call.
        unsafe { shared.raw.update_descriptor_sets(&writes, &[]) };
        if state.buffers.len() < n as usize {
            state.buffers.resize(n as usize, None);
        }
        for b in bindings {
            state.buffers[b.binding as usize] = Some(Arc::clone(&b.buffer.inner));
        }
        state.generation += 1;
        drop(state);

        shared.counters.add_descriptor_writes(bindings.len() as u64);
        if shared.recording_now.load(Ordering::Relaxed) == 0 {
            shared
                .counters
                .add_host_ns(start.elapsed().as_nanos() as u64);
        }
        Ok(())
    }
}

impl DescriptorPool {
    /// A set with the layout of `pipeline`'s set 0. A full pool is
    /// [`Error::OutOfMemory`] (what = "descriptor set").
    pub fn allocate(&self, pipeline: &Pipeline) -> Result<DescriptorSet> {
        self.allocate_with(pipeline, Arc::clone(&pipeline.inner.set_layout))
    }

    /// A set with the layout of `pipeline`'s set 1, its handoff words
    /// ([`crate::HandoffWords`]); an error for a pipeline without a handoff role.
    pub fn allocate_handoff(&self, pipeline: &Pipeline) -> Result<DescriptorSet> {
        let layout = pipeline.inner.handoff.as_ref().map(|(_, l)| Arc::clone(l));
        let layout = layout.ok_or_else(|| {
            Error::InvalidArgument(format!(
                "pipeline {:?} has no handoff role",
                pipeline.inner.label
            ))
        })?;
        self.allocate_with(pipeline, layout)
    }

    fn allocate_with(&self, pipeline: &Pipeline, layout: Arc<SetLayout>) -> Result<DescriptorSet> {
        if !Arc::ptr_eq(&pipeline.inner.shared, &self.inner.shared) {
            return Err(Error::InvalidArgument(
                "a pipeline of another device".into(),
            ));
        }
        let layouts = [layout.raw];
        let mut pool = lock(&self.inner.state);
        let full = || Error::OutOfMemory {
            requested: 0,
            what: format!(
                "descriptor set (the pool of {} sets and {} storage buffers is full)",
                self.inner.max_sets, self.inner.max_storage_buffers
            ),
        };
        let storage_buffers = pool.storage_buffers.saturating_add(layout.n_bindings);
        if pool.sets >= self.inner.max_sets || storage_buffers > self.inner.max_storage_buffers {
            return Err(full());
        }
        let info = vk::DescriptorSetAllocateInfo::default()
            .descriptor_pool(pool.raw)
            .set_layouts(&layouts);
        // SAFETY: the pool lock is held; the layout is live; the pool has room (counted above).
        let raw = match unsafe { self.inner.shared.raw.allocate_descriptor_sets(&info) } {
            Ok(sets) => sets.first().copied().ok_or(Error::Vulkan {
                call: "vkAllocateDescriptorSets",
                result: vk::Result::ERROR_UNKNOWN,
            })?,
            Err(vk::Result::ERROR_OUT_OF_POOL_MEMORY | vk::Result::ERROR_FRAGMENTED_POOL) => {
                return Err(full())
            }
            Err(r) => return Err(Error::vk("vkAllocateDescriptorSets", r)),
        };
        pool.sets += 1;
        pool.storage_buffers = storage_buffers;
        drop(pool);
        Ok(DescriptorSet {
            inner: Arc::new(SetInner {
                raw,
                layout,
                state: Mutex::new(SetState::default()),
                _pool: Arc::clone(&self.inner),
            }),
        })
    }
}
