//! Command buffers, the recorder, submission with fences, and waiting.
//!
//! Each [`CommandBuffer`] owns its own command pool: recording needs the pool externally
//! synchronised, and a pool per buffer makes a `&mut CommandBuffer` enough; re-recording resets
//! the pool, the cheapest reset Vulkan offers. A command buffer keeps every object it uses alive
//! until it is re-recorded or dropped, and dropping one that is still executing waits for it.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ash::vk;

use super::buffer::{check_range, Buffer};
use super::descriptor::{DescriptorSet, SetInner};
use super::device::{lock, Device, DeviceShared};
use super::pipeline::{Pipeline, PipelineInner};
use super::query::TimestampPool;
use crate::error::{vk_err, Error, Result};

/// Pipeline stages on either side of a barrier. Combine with `|`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stages(u8);

impl Stages {
    /// Compute shaders (storage-buffer reads and writes).
    pub const COMPUTE: Stages = Stages(1);
    /// Copies and fills.
    pub const TRANSFER: Stages = Stages(2);
    /// The host reading or writing mapped memory.
    pub const HOST: Stages = Stages(4);

    fn has(self, other: Stages) -> bool {
        self.0 & other.0 != 0
    }

    /// Stage mask, and the accesses whose writes must be made available (`write`) or visible.
    fn to_vk(self, write: bool) -> (vk::PipelineStageFlags, vk::AccessFlags) {
        let mut stages = vk::PipelineStageFlags::empty();
        let mut access = vk::AccessFlags::empty();
        if self.has(Stages::COMPUTE) {
            stages |= vk::PipelineStageFlags::COMPUTE_SHADER;
            access |= if write {
                vk::AccessFlags::SHADER_WRITE
            } else {
                vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE
            };
        }
        if self.has(Stages::TRANSFER) {
            stages |= vk::PipelineStageFlags::TRANSFER;
            access |= if write {
                vk::AccessFlags::TRANSFER_WRITE
            } else {
                vk::AccessFlags::TRANSFER_READ | vk::AccessFlags::TRANSFER_WRITE
            };
        }
        if self.has(Stages::HOST) {
            stages |= vk::PipelineStageFlags::HOST;
            access |= if write {
                vk::AccessFlags::HOST_WRITE
            } else {
                vk::AccessFlags::HOST_READ | vk::AccessFlags::HOST_WRITE
            };
        }
        (stages, access)
    }
}

impl std::ops::BitOr for Stages {
    type Output = Stages;
    fn bitor(self, rhs: Stages) -> Stages {
        Stages(self.0 | rhs.0)
    }
}

/// A fence shared by the command buffers of one submission (and the descriptor sets they use).
pub(crate) struct Fence {
    raw: vk::Fence,
    /// Set once the fence is seen signalled, so later checks cost an atomic load.
    signaled: AtomicBool,
    shared: Arc<DeviceShared>,
}

fn timeout_ns(timeout: Duration) -> u64 {
    u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX)
}

impl Fence {
    /// Whether the submission finished; `DeviceLost` if the device was lost.
    pub(crate) fn is_signaled(&self) -> Result<bool> {
        if self.signaled.load(Ordering::Acquire) {
            return Ok(true);
        }
        // SAFETY: the fence is live (owned by self); querying needs no external sync.
        let done = unsafe { self.shared.raw.get_fence_status(self.raw) }
            .map_err(vk_err("vkGetFenceStatus"))?;
        if done {
            self.signaled.store(true, Ordering::Release);
        }
        Ok(done)
    }

    fn wait(&self, timeout: Duration) -> Result<()> {
        if self.signaled.load(Ordering::Acquire) {
            return Ok(());
        }
        // SAFETY: as above; waiting needs no external sync.
        match unsafe {
            self.shared
                .raw
                .wait_for_fences(&[self.raw], true, timeout_ns(timeout))
        } {
            Ok(()) => {
                self.signaled.store(true, Ordering::Release);
                Ok(())
            }
            Err(vk::Result::TIMEOUT) => Err(Error::Timeout { waited: timeout }),
            Err(r) => Err(Error::vk("vkWaitForFences", r)),
        }
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        // A fence still in use must not be reset or destroyed: wait for it. Only a lost device
        // makes this fail, and then nothing is executing any more.
        let done = self.wait(Duration::MAX).is_ok();
        self.shared.release_fence(self.raw, done);
    }
}

/// An object a command buffer uses (buffer, pipeline, query pool), kept alive as long as the
/// command buffer may execute. Never read: holding it is the point.
type Keep = Arc<dyn std::any::Any + Send + Sync>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing recorded (new, or a recording was abandoned).
    Initial,
    /// Recorded and ready to submit (again).
    Executable,
}

/// A primary command buffer with its own pool. Record with [`CommandBuffer::begin`]; submit with
/// [`Device::submit`] as many times as wanted (one submission at a time).
pub struct CommandBuffer {
    raw: vk::CommandBuffer,
    pool: vk::CommandPool,
    state: State,
    keep: Vec<Keep>,
    /// Descriptor sets bound, with their update generation when first bound; deduplicated at
    /// `finish`. At submit the generations are checked (an update after recording invalidates
    /// a command buffer) and the sets get the submission's fence.
    sets: Vec<(Arc<SetInner>, u64)>,
    /// The fence of the submission in flight (or last finished), if any.
    fence: Option<Arc<Fence>>,
    dispatches: u64,
    barriers: u64,
    shared: Arc<DeviceShared>,
}

impl fmt::Debug for CommandBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommandBuffer")
            .field("state", &self.state)
            .field("dispatches", &self.dispatches)
            .field("barriers", &self.barriers)
            .field("pending", &self.fence.is_some())
            .finish()
    }
}

impl Device {
    /// A command buffer (and its pool) on the compute queue's family.
    pub fn create_command_buffer(&self) -> Result<CommandBuffer> {
        let shared = &self.shared;
        let info = vk::CommandPoolCreateInfo::default().queue_family_index(shared.queue_family);
        // SAFETY: the device is live.
        let pool = unsafe { shared.raw.create_command_pool(&info, None) }
            .map_err(vk_err("vkCreateCommandPool"))?;
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the pool was just created and is used by this thread only.
        let raw = match unsafe { shared.raw.allocate_command_buffers(&alloc) } {
            Ok(b) if !b.is_empty() => b[0],
            other => {
                // SAFETY: the pool has no buffer in use; destroyed once.
                unsafe { shared.raw.destroy_command_pool(pool, None) };
                let r = other.err().unwrap_or(vk::Result::ERROR_UNKNOWN);
                return Err(Error::vk("vkAllocateCommandBuffers", r));
            }
        };
        Ok(CommandBuffer {
            raw,
            pool,
            state: State::Initial,
            keep: Vec::new(),
            sets: Vec::new(),
            fence: None,
            dispatches: 0,
            barriers: 0,
            shared: Arc::clone(shared),
        })
    }

    /// Submits one command buffer with a fence; returns without waiting (see
    /// [`CommandBuffer::wait`]). Counts one submit plus the buffer's dispatches and barriers
    /// (what the GPU executes, whether recorded now or long ago).
    pub fn submit(&self, cmd: &mut CommandBuffer) -> Result<()> {
        self.submit_batch(&mut [cmd])
    }

    /// Submits several command buffers in one `vkQueueSubmit` with one fence.
    pub fn submit_batch(&self, cmds: &mut [&mut CommandBuffer]) -> Result<()> {
        let shared = &self.shared;
        for cmd in cmds.iter_mut() {
            if !Arc::ptr_eq(&cmd.shared, shared) {
                return Err(Error::InvalidArgument(
                    "a command buffer of another device".into(),
                ));
            }
            if cmd.state != State::Executable {
                return Err(Error::InvalidArgument(
                    "submitting a command buffer with nothing recorded".into(),
                ));
            }
            cmd.retire()?;
        }
        let raws: Vec<vk::CommandBuffer> = cmds.iter().map(|c| c.raw).collect();
        let fence = Arc::new(Fence {
            raw: shared.acquire_fence()?,
            signaled: AtomicBool::new(false),
            shared: Arc::clone(shared),
        });
        // Mark the sets as used by this submission before it starts, so a concurrent
        // `write_descriptors` sees them in use; undone if the submission does not happen.
        let mut marked: Vec<(&Arc<SetInner>, Option<Arc<Fence>>)> = Vec::new();
        let mut stale = false;
        'mark: for cmd in cmds.iter() {
            for (set, generation) in &cmd.sets {
                let mut state = lock(&set.state);
                if state.generation != *generation {
                    stale = true;
                    break 'mark;
                }
                // One queue: the latest fence signals after every earlier submission, so it
                // alone tells when the set is free again.
                let previous = state.last_fence.replace(Arc::clone(&fence));
                marked.push((set, previous));
            }
        }
        let result = if stale {
            Err(Error::InvalidArgument(
                "a descriptor set was updated after it was recorded into this command buffer \
                 (which Vulkan makes invalid): record it again"
                    .into(),
            ))
        } else {
            let submit = [vk::SubmitInfo::default().command_buffers(&raws)];
            let start = Instant::now();
            let result = {
                let queue = lock(&shared.queue);
                // SAFETY: the queue lock is held; the buffers are executable (none of their sets
                // was updated since recording), not pending (retired above), and keep what they
                // use alive; the fence is unsignalled and unused.
                unsafe { shared.raw.queue_submit(*queue, &submit, fence.raw) }
            };
            shared
                .counters
                .add_submit(start.elapsed().as_nanos() as u64);
            result.map_err(vk_err("vkQueueSubmit"))
        };
        if let Err(e) = result {
            // In reverse: a set used by two buffers of the batch was marked twice.
            for (set, previous) in marked.into_iter().rev() {
                lock(&set.state).last_fence = previous;
            }
            // Never submitted: nothing to wait for; resetting an unsignalled fence is allowed.
            fence.signaled.store(true, Ordering::Release);
            return Err(e);
        }
        for cmd in cmds.iter_mut() {
            shared.counters.add_executed(cmd.dispatches, cmd.barriers);
            cmd.fence = Some(Arc::clone(&fence));
        }
        Ok(())
    }

    /// [`Device::submit`], then [`CommandBuffer::wait`] up to `timeout`. On
    /// [`Error::Timeout`] the work is still in flight: wait again, or drop the command buffer
    /// (which waits).
    pub fn submit_and_wait(&self, cmd: &mut CommandBuffer, timeout: Duration) -> Result<()> {
        self.submit(cmd)?;
        cmd.wait(timeout)
    }
}

impl CommandBuffer {
    /// Waits up to `timeout` for the last submission of this buffer; `Ok` at once if none is in
    /// flight. [`Error::Timeout`] leaves it in flight; [`Error::DeviceLost`] if the GPU died.
    pub fn wait(&mut self, timeout: Duration) -> Result<()> {
        if let Some(fence) = &self.fence {
            fence.wait(timeout)?;
            self.fence = None;
        }
        Ok(())
    }

    /// Whether a submission of this buffer is still executing.
    pub fn is_pending(&self) -> Result<bool> {
        match &self.fence {
            Some(f) => Ok(!f.is_signaled()?),
            None => Ok(false),
        }
    }

    /// Forgets a finished submission; [`Error::InUse`] if it still runs.
    fn retire(&mut self) -> Result<()> {
        if self.is_pending()? {
            return Err(Error::InUse("command buffer"));
        }
        self.fence = None;
        Ok(())
    }

    /// Dispatches recorded (and executed per submit).
    pub fn dispatches(&self) -> u64 {
        self.dispatches
    }

    /// Barriers recorded (and executed per submit).
    pub fn barriers(&self) -> u64 {
        self.barriers
    }

    /// The Vulkan handle.
    pub fn raw(&self) -> vk::CommandBuffer {
        self.raw
    }

    /// Starts recording, replacing what was recorded before. [`Error::InUse`] while a submission
    /// of it still runs.
    pub fn begin(&mut self) -> Result<CommandRecorder<'_>> {
        self.retire()?;
        let shared = Arc::clone(&self.shared);
        self.state = State::Initial;
        // SAFETY: no submission of the pool's only buffer is pending (retired above), and
        // `&mut self` makes this thread the pool's only user.
        unsafe {
            shared
                .raw
                .reset_command_pool(self.pool, vk::CommandPoolResetFlags::empty())
        }
        .map_err(vk_err("vkResetCommandPool"))?;
        self.keep.clear();
        self.sets.clear();
        self.dispatches = 0;
        self.barriers = 0;
        let info = vk::CommandBufferBeginInfo::default();
        // SAFETY: the buffer is in the initial state after the pool reset.
        unsafe { shared.raw.begin_command_buffer(self.raw, &info) }
            .map_err(vk_err("vkBeginCommandBuffer"))?;
        shared.recording_now.fetch_add(1, Ordering::Relaxed);
        Ok(CommandRecorder {
            cmd: self,
            start: Instant::now(),
            pipeline: None,
            handoff_bound: false,
            finished: false,
        })
    }
}

impl Drop for CommandBuffer {
    fn drop(&mut self) {
        if let Some(fence) = self.fence.take() {
            // Freeing a pending command buffer is not allowed: wait (a lost device returns).
            let _ = fence.wait(Duration::MAX);
        }
        // SAFETY: nothing of the pool is pending any more; destroying the pool frees the buffer;
        // destroyed once. The objects in `keep` are released after this.
        unsafe { self.shared.raw.destroy_command_pool(self.pool, None) };
    }
}

/// Records into a [`CommandBuffer`]; [`CommandRecorder::finish`] ends the recording. Dropped
/// without `finish`, the recording is abandoned and the buffer cannot be submitted.
pub struct CommandRecorder<'a> {
    cmd: &'a mut CommandBuffer,
    start: Instant,
    pipeline: Option<Arc<PipelineInner>>,
    /// Whether handoff words were bound since the pipeline (with a handoff role) was.
    handoff_bound: bool,
    finished: bool,
}

impl fmt::Debug for CommandRecorder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommandRecorder")
            .field("cmd", &self.cmd)
            .finish()
    }
}

impl CommandRecorder<'_> {
    fn device(&self) -> &ash::Device {
        &self.cmd.shared.raw
    }

    fn same_device(&self, other: &Arc<DeviceShared>) -> Result<()> {
        if Arc::ptr_eq(&self.cmd.shared, other) {
            Ok(())
        } else {
            Err(Error::InvalidArgument("an object of another device".into()))
        }
    }

    fn bound(&self, what: &str) -> Result<&Arc<PipelineInner>> {
        self.pipeline
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument(format!("{what} before any bind_pipeline")))
    }

    /// Binds a compute pipeline.
    pub fn bind_pipeline(&mut self, pipeline: &Pipeline) -> Result<()> {
        self.same_device(&pipeline.inner.shared)?;
        // SAFETY: the buffer is recording; the pipeline is live and kept alive by `keep`.
        unsafe {
            self.device().cmd_bind_pipeline(
                self.cmd.raw,
                vk::PipelineBindPoint::COMPUTE,
                pipeline.inner.raw,
            )
        };
        self.cmd.keep.push(pipeline.inner.clone());
        self.pipeline = Some(Arc::clone(&pipeline.inner));
        self.handoff_bound = false;
        Ok(())
    }

    /// Whether the bound pipeline has a handoff role (words at set 1).
    pub(crate) fn bound_has_handoff(&self) -> Result<bool> {
        Ok(self.bound("handoff words")?.handoff.is_some())
    }

    /// Binds `set` (from [`DescriptorPool::allocate_handoff`]) as set 1 of the bound pipeline's
    /// layout.
    pub(crate) fn bind_handoff_set(&mut self, set: &DescriptorSet) -> Result<()> {
        let pipeline = self.bound("bind_handoff_set")?;
        if pipeline.handoff.is_none() || set.inner.layout.n_bindings != 1 {
            return Err(Error::InvalidArgument(format!(
                "handoff words for pipeline {:?}, which has no handoff role",
                pipeline.label
            )));
        }
        self.bind_set_at(1, set);
        self.handoff_bound = true;
        Ok(())
    }

    /// Binds `set` as set 0 of the bound pipeline's layout. It stays bound across later
    /// pipelines with the same number of bindings.
    pub fn bind_descriptor_set(&mut self, set: &DescriptorSet) -> Result<()> {
        let pipeline = self.bound("bind_descriptor_set")?;
        let (want, got) = (pipeline.set_layout.n_bindings, set.inner.layout.n_bindings);
        if want != got {
            return Err(Error::InvalidArgument(format!(
                "a set of {got} bindings for pipeline {:?} of {want}",
                pipeline.label
            )));
        }
        self.bind_set_at(0, set);
        Ok(())
    }

    /// Binds `set` as set `index` of the bound pipeline's layout, whose set `index` the caller
    /// checked to be laid out as `set` is (all storage buffers, the same count).
    fn bind_set_at(&mut self, index: u32, set: &DescriptorSet) {
        let layout = self
            .pipeline
            .as_ref()
            .expect("checked by the caller")
            .layout;
        // SAFETY: recording; set `index` of the layout is compatible with the set (checked by
        // the caller); the set is kept alive by `sets`, and the buffers written into it by the
        // set.
        unsafe {
            self.device().cmd_bind_descriptor_sets(
                self.cmd.raw,
                vk::PipelineBindPoint::COMPUTE,
                layout,
                index,
                &[set.inner.raw],
                &[],
            )
        };
        let generation = lock(&set.inner.state).generation;
        self.cmd.sets.push((Arc::clone(&set.inner), generation));
    }

    /// Sets push constants `offset..offset + bytes.len()` of the bound pipeline (multiples of 4,
    /// inside its push-constant range).
    pub fn push_constants(&mut self, offset: u32, bytes: &[u8]) -> Result<()> {
        let pipeline = self.bound("push_constants")?;
        let size = pipeline.push_constant_bytes;
        let end = u64::from(offset) + bytes.len() as u64;
        if offset % 4 != 0 || bytes.len() % 4 != 0 || end > u64::from(size) {
            return Err(Error::InvalidArgument(format!(
                "push constants {offset}..{end} (multiples of 4 inside the pipeline's {size} bytes)"
            )));
        }
        let layout = pipeline.layout;
        // SAFETY: recording; the range was checked against the layout's push-constant range.
        unsafe {
            self.device().cmd_push_constants(
                self.cmd.raw,
                layout,
                vk::ShaderStageFlags::COMPUTE,
                offset,
                bytes,
            )
        };
        Ok(())
    }

    /// [`CommandRecorder::push_constants`] of a plain value (a `#[repr(C)]` struct, or `[u32; N]`).
    pub fn push_constants_pod<T: bytemuck::Pod>(&mut self, offset: u32, value: &T) -> Result<()> {
        self.push_constants(offset, bytemuck::bytes_of(value))
    }

    /// Dispatches `x * y * z` workgroups of the bound pipeline.
    pub fn dispatch(&mut self, x: u32, y: u32, z: u32) -> Result<()> {
        let pipeline = self.bound("dispatch")?;
        if pipeline.handoff.is_some() && !self.handoff_bound {
            return Err(Error::InvalidArgument(format!(
                "pipeline {:?} has a handoff role: bind handoff words (HandoffWords::bind, with \
                 HandoffPush::NONE for none) after it and before its dispatch",
                pipeline.label
            )));
        }
        let max = self.cmd.shared.info.max_workgroup_count;
        if x > max[0] || y > max[1] || z > max[2] {
            return Err(Error::InvalidArgument(format!(
                "dispatch {x}x{y}x{z} exceeds maxComputeWorkGroupCount {max:?}"
            )));
        }
        // SAFETY: recording, a compute pipeline is bound; counts within the device's limits.
        unsafe { self.device().cmd_dispatch(self.cmd.raw, x, y, z) };
        self.cmd.dispatches += 1;
        Ok(())
    }

    /// A global memory barrier: writes of `from` stages become visible to reads and writes of
    /// `to` stages. (Buffer barriers cost the same on current GPUs, and a global one cannot miss
    /// a buffer.) Keep the stages this narrow: on the H100 a barrier that also names
    /// `DRAW_INDIRECT` (indirect-argument reads) costs ~2.6 µs more, the front end waiting too
    /// (docs/perf.md, session 8), so indirect arguments would need a barrier of their own.
    pub fn barrier(&mut self, from: Stages, to: Stages) {
        let (src_stage, src_access) = from.to_vk(true);
        let (dst_stage, dst_access) = to.to_vk(false);
        let barrier = [vk::MemoryBarrier::default()
            .src_access_mask(src_access)
            .dst_access_mask(dst_access)];
        // SAFETY: recording; the stages are all supported by a compute queue (HOST is allowed
        // as a destination for host reads after a fence wait).
        unsafe {
            self.device().cmd_pipeline_barrier(
                self.cmd.raw,
                src_stage,
                dst_stage,
                vk::DependencyFlags::empty(),
                &barrier,
                &[],
                &[],
            )
        };
        self.cmd.barriers += 1;
    }

    /// Compute → compute: the next dispatch reads what the previous ones wrote.
    pub fn compute_barrier(&mut self) {
        self.barrier(Stages::COMPUTE, Stages::COMPUTE);
    }

    /// Transfer → compute: shaders read what copies and fills wrote.
    pub fn transfer_to_compute_barrier(&mut self) {
        self.barrier(Stages::TRANSFER, Stages::COMPUTE);
    }

    /// Fills `size` bytes at `offset` with the 32-bit `value` (both multiples of 4).
    pub fn fill_buffer(
        &mut self,
        buffer: &Buffer,
        offset: u64,
        size: u64,
        value: u32,
    ) -> Result<()> {
        self.same_device(&buffer.inner.shared)?;
        check_range("fill_buffer", buffer.size(), offset, size)?;
        if offset % 4 != 0 || size % 4 != 0 || size == 0 {
            return Err(Error::InvalidArgument(format!(
                "fill_buffer offset {offset} and size {size} must be non-zero multiples of 4"
            )));
        }
        // SAFETY: recording; range checked; the buffer has TRANSFER_DST usage and is kept alive.
        unsafe {
            self.device()
                .cmd_fill_buffer(self.cmd.raw, buffer.inner.raw, offset, size, value)
        };
        self.cmd.keep.push(buffer.inner.clone());
        Ok(())
    }

    /// Copies `size` bytes from `src[src_offset..]` to `dst[dst_offset..]` (any sizes and
    /// offsets; regions of one buffer must not overlap).
    pub fn copy_buffer(
        &mut self,
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        size: u64,
    ) -> Result<()> {
        self.same_device(&src.inner.shared)?;
        self.same_device(&dst.inner.shared)?;
        check_range("copy_buffer source", src.size(), src_offset, size)?;
        check_range("copy_buffer destination", dst.size(), dst_offset, size)?;
        if size == 0 {
            return Err(Error::InvalidArgument("copy_buffer of 0 bytes".into()));
        }
        if Arc::ptr_eq(&src.inner, &dst.inner)
            && src_offset < dst_offset + size
            && dst_offset < src_offset + size
        {
            return Err(Error::InvalidArgument("copy_buffer regions overlap".into()));
        }
        let region = [vk::BufferCopy::default()
            .src_offset(src_offset)
            .dst_offset(dst_offset)
            .size(size)];
        // SAFETY: recording; ranges checked and disjoint; both buffers have transfer usage and
        // are kept alive.
        unsafe {
            self.device()
                .cmd_copy_buffer(self.cmd.raw, src.inner.raw, dst.inner.raw, &region)
        };
        self.cmd.keep.push(src.inner.clone());
        self.cmd.keep.push(dst.inner.clone());
        Ok(())
    }

    /// Resets every query of `pool`; needed before writing timestamps into it.
    pub fn reset_timestamps(&mut self, pool: &TimestampPool) -> Result<()> {
        self.same_device(&pool.inner.shared)?;
        // SAFETY: recording; the whole pool's range; kept alive.
        unsafe {
            self.device()
                .cmd_reset_query_pool(self.cmd.raw, pool.inner.raw, 0, pool.inner.count)
        };
        self.cmd.keep.push(pool.inner.clone());
        Ok(())
    }

    /// Writes a timestamp into query `index` once every earlier command has completed.
    pub fn write_timestamp(&mut self, pool: &TimestampPool, index: u32) -> Result<()> {
        self.same_device(&pool.inner.shared)?;
        if index >= pool.inner.count {
            return Err(Error::InvalidArgument(format!(
                "timestamp {index} of a pool of {}",
                pool.inner.count
            )));
        }
        // SAFETY: recording; index in range; the queue family supports timestamps (pools are
        // only created where it does); kept alive.
        unsafe {
            self.device().cmd_write_timestamp(
                self.cmd.raw,
                vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                pool.inner.raw,
                index,
            )
        };
        self.cmd.keep.push(pool.inner.clone());
        Ok(())
    }

    /// Ends the recording; the buffer can then be submitted any number of times. Counts one
    /// recording and the host time since `begin`.
    pub fn finish(mut self) -> Result<()> {
        self.finished = true;
        let shared = Arc::clone(&self.cmd.shared);
        shared.recording_now.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: the buffer is recording.
        let ended = unsafe { shared.raw.end_command_buffer(self.cmd.raw) };
        let host_ns = self.start.elapsed().as_nanos() as u64;
        ended.map_err(vk_err("vkEndCommandBuffer"))?;
        // Each set once, keeping its first-bound generation (a stable sort keeps bind order
        // among equals and `dedup_by` keeps the first).
        self.cmd
            .sets
            .sort_by_key(|(set, _)| Arc::as_ptr(set) as usize);
        self.cmd
            .sets
            .dedup_by(|later, first| Arc::ptr_eq(&later.0, &first.0));
        self.cmd.state = State::Executable;
        shared.counters.add_recording(host_ns);
        Ok(())
    }
}

impl Drop for CommandRecorder<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.cmd
                .shared
                .recording_now
                .fetch_sub(1, Ordering::Relaxed);
            // SAFETY: the buffer is recording; ending it leaves it executable, but `state` stays
            // `Initial`, so it is never submitted, and the next `begin` resets the pool.
            let _ = unsafe { self.cmd.shared.raw.end_command_buffer(self.cmd.raw) };
        }
    }
}
