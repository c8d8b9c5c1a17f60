//! Storage buffers through gpu-allocator, and the staging upload/readback helpers.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ash::vk;
use gpu_allocator::vulkan::{Allocation, AllocationCreateDesc, AllocationScheme};
use gpu_allocator::{AllocationError, MemoryLocation};

use super::command::Stages;
use super::device::{lock, Device, DeviceShared};
use crate::error::{vk_err, Error, Result};

/// Staging transfers go in pieces of at most this many bytes, so uploading a 1 GiB model does
/// not need a second 1 GiB of host-visible memory.
const STAGING_CHUNK: u64 = 64 << 20;

/// How long one staging copy may take before [`Error::Timeout`]; generous, as lavapipe copies
/// at a few GB/s on a busy CPU.
const STAGING_TIMEOUT: Duration = Duration::from_secs(120);

/// Where a buffer lives and what the host can do with it. Every kind can be a storage buffer and
/// a copy source and destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferKind {
    /// Device-local memory, not visible to the host: weights, activations, KV cache. Filled with
    /// [`Device::upload`], read with [`Device::readback`].
    DeviceLocal,
    /// Host-visible, host-coherent, persistently mapped; meant for the host to write and the GPU
    /// to read (device-local too where the device offers it, as on unified memory or ReBAR).
    Upload,
    /// Host-visible, host-coherent (cached where offered), persistently mapped; meant for the GPU
    /// to write and the host to read.
    Readback,
}

impl BufferKind {
    fn location(self) -> MemoryLocation {
        match self {
            BufferKind::DeviceLocal => MemoryLocation::GpuOnly,
            BufferKind::Upload => MemoryLocation::CpuToGpu,
            BufferKind::Readback => MemoryLocation::GpuToCpu,
        }
    }

    /// Whether the host can read and write it directly.
    pub fn is_mapped(self) -> bool {
        !matches!(self, BufferKind::DeviceLocal)
    }
}

/// A buffer and its memory. Not `Clone`: `&mut Buffer` is the host's exclusive right to write
/// its mapped memory. Command buffers and descriptor sets that use it keep the Vulkan object
/// alive, so dropping the `Buffer` early is safe.
pub struct Buffer {
    pub(crate) inner: Arc<BufferInner>,
}

pub(crate) struct BufferInner {
    pub(crate) raw: vk::Buffer,
    pub(crate) size: u64,
    kind: BufferKind,
    label: String,
    /// `None` only inside `Drop`.
    allocation: Option<Allocation>,
    pub(crate) shared: Arc<DeviceShared>,
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("label", &self.inner.label)
            .field("size", &self.inner.size)
            .field("kind", &self.inner.kind)
            .finish()
    }
}

impl Device {
    /// A buffer of `size` bytes (> 0). Out of memory is [`Error::OutOfMemory`].
    pub fn create_buffer(&self, size: u64, kind: BufferKind) -> Result<Buffer> {
        let label = match kind {
            BufferKind::DeviceLocal => "device-local buffer",
            BufferKind::Upload => "upload buffer",
            BufferKind::Readback => "readback buffer",
        };
        self.create_buffer_labeled(label, size, kind)
    }

    /// As [`Device::create_buffer`], with a label used in errors (`"weights of layer 3"`).
    pub fn create_buffer_labeled(
        &self,
        label: &str,
        size: u64,
        kind: BufferKind,
    ) -> Result<Buffer> {
        if size == 0 {
            return Err(Error::InvalidArgument(format!(
                "{label}: a buffer cannot be empty"
            )));
        }
        let shared = &self.shared;
        // Checked here rather than left to the driver: past these limits creation is invalid
        // usage (a validation error), not a clean out-of-memory.
        let mut limit = shared
            .info
            .max_memory_allocation_size
            .min(shared.info.max_buffer_size);
        if kind == BufferKind::DeviceLocal {
            limit = limit.min(shared.info.device_local_bytes);
        }
        if size > limit {
            return Err(Error::OutOfMemory {
                requested: size,
                what: format!(
                    "{label} (larger than one allocation or buffer may be here: {limit} bytes)"
                ),
            });
        }
        let mut usage = vk::BufferUsageFlags::STORAGE_BUFFER
            | vk::BufferUsageFlags::TRANSFER_SRC
            | vk::BufferUsageFlags::TRANSFER_DST;
        if shared.enabled.buffer_device_address {
            usage |= vk::BufferUsageFlags::SHADER_DEVICE_ADDRESS;
        }
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: the device is live and `info` is a valid create info.
        let raw =
            unsafe { shared.raw.create_buffer(&info, None) }.map_err(|r| {
                match Error::vk("vkCreateBuffer", r) {
                    Error::OutOfMemory { .. } => Error::OutOfMemory {
                        requested: size,
                        what: label.to_string(),
                    },
                    e => e,
                }
            })?;
        // SAFETY: `raw` was just created on this device.
        let requirements = unsafe { shared.raw.get_buffer_memory_requirements(raw) };
        let allocation = lock(&shared.allocator).allocate(&AllocationCreateDesc {
            name: label,
            requirements,
            location: kind.location(),
            linear: true,
            allocation_scheme: AllocationScheme::GpuAllocatorManaged,
        });
        let allocation = match allocation {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: the buffer is unused and destroyed once.
                unsafe { shared.raw.destroy_buffer(raw, None) };
                return Err(match e {
                    AllocationError::OutOfMemory => Error::OutOfMemory {
                        requested: requirements.size,
                        what: label.to_string(),
                    },
                    e => Error::Allocator(format!("{label}: {e}")),
                });
            }
        };
        // SAFETY: the memory handle stays valid while the allocation lives (it moves into
        // `inner` just below).
        let (memory, offset) = (unsafe { allocation.memory() }, allocation.offset());
        let inner = BufferInner {
            raw,
            size,
            kind,
            label: label.to_string(),
            allocation: Some(allocation),
            shared: Arc::clone(shared),
        };
        // SAFETY: the allocation satisfies `requirements` of this buffer and is bound once;
        // on failure `inner`'s Drop destroys the buffer and frees the memory.
        unsafe { shared.raw.bind_buffer_memory(raw, memory, offset) }
            .map_err(vk_err("vkBindBufferMemory"))?;
        if kind.is_mapped() && inner.mapped_ptr().is_none() {
            return Err(Error::Allocator(format!(
                "{label}: host-visible memory was not mapped"
            )));
        }
        Ok(Buffer {
            inner: Arc::new(inner),
        })
    }
}

impl BufferInner {
    fn mapped_ptr(&self) -> Option<*mut u8> {
        self.allocation
            .as_ref()
            .and_then(|a| a.mapped_ptr())
            .map(|p| p.as_ptr().cast::<u8>())
    }
}

impl Drop for BufferInner {
    fn drop(&mut self) {
        // SAFETY: every command buffer and descriptor set using this buffer holds this Arc, so
        // none is pending; destroyed once.
        unsafe { self.shared.raw.destroy_buffer(self.raw, None) };
        if let Some(a) = self.allocation.take() {
            // A failed free only leaks inside the allocator's own block; nothing to report to.
            let _ = lock(&self.shared.allocator).free(a);
        }
    }
}

/// `offset..offset + len` inside `0..size`, or an error naming `what`.
pub(crate) fn check_range(what: &str, size: u64, offset: u64, len: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::InvalidArgument(format!(
            "{what}: bytes {offset}..{offset}+{len} are outside the buffer's {size} bytes"
        ))),
    }
}

impl Buffer {
    /// Size in bytes, as asked for.
    pub fn size(&self) -> u64 {
        self.inner.size
    }

    /// Where it lives.
    pub fn kind(&self) -> BufferKind {
        self.inner.kind
    }

    /// The label given at creation.
    pub fn label(&self) -> &str {
        &self.inner.label
    }

    /// Whether the host can read and write it directly.
    pub fn is_mapped(&self) -> bool {
        self.inner.kind.is_mapped()
    }

    /// The Vulkan handle.
    pub fn raw(&self) -> vk::Buffer {
        self.inner.raw
    }

    /// Where shaders reach it by address (`GL_EXT_buffer_reference`), on a device with
    /// `bufferDeviceAddress` enabled; `None` elsewhere.
    pub fn device_address(&self) -> Option<u64> {
        if !self.inner.shared.enabled.buffer_device_address {
            return None;
        }
        let info = vk::BufferDeviceAddressInfo::default().buffer(self.inner.raw);
        // SAFETY: the buffer is live and was created with SHADER_DEVICE_ADDRESS usage, its
        // memory allocated with the device-address flag (both where the feature is enabled).
        Some(unsafe { self.inner.shared.raw.get_buffer_device_address(&info) })
    }

    fn mapped(&self, what: &str) -> Result<*mut u8> {
        // By kind, not by whether the memory happens to be mapped (lavapipe and unified-memory
        // GPUs map device-local memory too): the same program must behave the same everywhere.
        let ptr = if self.is_mapped() {
            self.inner.mapped_ptr()
        } else {
            None
        };
        ptr.ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{what}: buffer {:?} is device-local; use Device::upload/readback",
                self.inner.label
            ))
        })
    }

    /// Copies `data` into the mapped buffer at `offset`. The memory is host-coherent: the next
    /// submission sees the bytes. Writing while the GPU reads the same bytes gives the GPU
    /// unspecified values (never host memory unsafety).
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        let ptr = self.mapped("Buffer::write")?;
        check_range("Buffer::write", self.inner.size, offset, data.len() as u64)?;
        // SAFETY: the mapping covers `size` bytes and the range was checked; `&mut self` is the
        // only host access to the mapping; `data` cannot overlap device memory we own mutably.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), ptr.add(offset as usize), data.len())
        };
        Ok(())
    }

    /// Copies from the mapped buffer at `offset` into `out`. Call after the GPU work that wrote
    /// it has finished (and was followed by a barrier to [`Stages::HOST`]).
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let ptr = self.mapped("Buffer::read")?;
        check_range("Buffer::read", self.inner.size, offset, out.len() as u64)?;
        // SAFETY: the mapping covers the checked range; host writers need `&mut self`, which
        // cannot coexist with this `&self`.
        unsafe {
            std::ptr::copy_nonoverlapping(ptr.add(offset as usize), out.as_mut_ptr(), out.len())
        };
        Ok(())
    }

    /// [`Buffer::write`] of plain values (f32, u32, f16...).
    pub fn write_pod<T: bytemuck::Pod>(&mut self, offset: u64, values: &[T]) -> Result<()> {
        self.write(offset, bytemuck::cast_slice(values))
    }

    /// [`Buffer::read`] of `count` plain values.
    pub fn read_pod<T: bytemuck::Pod>(&self, offset: u64, count: usize) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); count];
        self.read(offset, bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }
}

impl Device {
    /// Writes `data` into `dst` at `offset`: directly when mapped, else through a host-visible
    /// staging buffer, a copy command and a fence (in pieces of 64 MiB), waiting for each. The
    /// copy ends with a transfer→compute barrier, so later submissions' shaders see the data.
    pub fn upload(&self, dst: &mut Buffer, offset: u64, data: &[u8]) -> Result<()> {
        check_range("Device::upload", dst.size(), offset, data.len() as u64)?;
        if dst.is_mapped() {
            return dst.write(offset, data);
        }
        if data.is_empty() {
            return Ok(());
        }
        let chunk = STAGING_CHUNK.min(data.len() as u64);
        let mut staging =
            self.create_buffer_labeled("staging upload", chunk, BufferKind::Upload)?;
        let mut cmd = self.create_command_buffer()?;
        for (i, piece) in data.chunks(chunk as usize).enumerate() {
            staging.write(0, piece)?;
            let mut rec = cmd.begin()?;
            let at = offset + i as u64 * chunk;
            rec.copy_buffer(&staging, 0, dst, at, piece.len() as u64)?;
            rec.barrier(Stages::TRANSFER, Stages::COMPUTE | Stages::TRANSFER);
            rec.finish()?;
            self.submit_and_wait(&mut cmd, STAGING_TIMEOUT)?;
        }
        Ok(())
    }

    /// Reads `out.len()` bytes of `src` at `offset`: directly when mapped, else through a staging
    /// buffer. Waits for the copy; the GPU work that wrote `src` must have been submitted (a
    /// compute/transfer→transfer barrier at the start of the copy makes its writes visible).
    pub fn readback(&self, src: &Buffer, offset: u64, out: &mut [u8]) -> Result<()> {
        check_range("Device::readback", src.size(), offset, out.len() as u64)?;
        if src.is_mapped() {
            return src.read(offset, out);
        }
        if out.is_empty() {
            return Ok(());
        }
        let chunk = STAGING_CHUNK.min(out.len() as u64);
        let staging =
            self.create_buffer_labeled("staging readback", chunk, BufferKind::Readback)?;
        let mut cmd = self.create_command_buffer()?;
        for (i, piece) in out.chunks_mut(chunk as usize).enumerate() {
            let mut rec = cmd.begin()?;
            let at = offset + i as u64 * chunk;
            rec.barrier(Stages::COMPUTE | Stages::TRANSFER, Stages::TRANSFER);
            rec.copy_buffer(src, at, &staging, 0, piece.len() as u64)?;
            rec.barrier(Stages::TRANSFER, Stages::HOST);
            rec.finish()?;
            self.submit_and_wait(&mut cmd, STAGING_TIMEOUT)?;
            staging.read(0, piece)?;
        }
        Ok(())
    }

    /// [`Device::upload`] of plain values.
    pub fn upload_pod<T: bytemuck::Pod>(
        &self,
        dst: &mut Buffer,
        offset: u64,
        values: &[T],
    ) -> Result<()> {
        self.upload(dst, offset, bytemuck::cast_slice(values))
    }

    /// [`Device::readback`] of `count` plain values.
    pub fn readback_pod<T: bytemuck::Pod>(
        &self,
        src: &Buffer,
        offset: u64,
        count: usize,
    ) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); count];
        self.readback(src, offset, bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }
}
