//! The schedule file (`*.vkf`): a [`Schedule`] and its weight bytes in one versioned,
//! checksummed, memory-mappable file. `docs/schedule-format.md` is the byte-by-byte spec.
//!
//! ```text
//! 0        header      64 bytes: magic, version, section offsets and lengths, checksums
//! 64       metadata    the schedule minus weight bytes (length-prefixed little-endian)
//!          zero padding to a multiple of 4096
//! W        weights     each distinct tensor once, at an offset that is a multiple of 4096
//! W+len    trailer     16 bytes: the weights checksum, end magic
//! ```
//!
//! The writer streams the weights tensor by tensor (never the model twice in memory) and needs
//! only [`Write`]. The reader maps the file, checks every length and offset against the file
//! size before allocating anything that depends on them, verifies both checksums (CRC-32, the
//! zlib one), decodes, validates, and hands out the weights as zero-copy slices of the map.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::{
    Alternative, BufferDecl, BufferId, BufferRole, Dispatch, Io, KernelDecl, KernelId, ModelMeta,
    Persistent, Schedule, ScheduleError, Slice, TokenEncoding, WeightUpload,
};
use crate::session::{Progress, TensorBytes};

/// The first 8 bytes of every schedule file, in every version.
pub const MAGIC: [u8; 8] = *b"VKFUSE\0\n";
/// The last 8 bytes of every schedule file (every version so far).
pub const END_MAGIC: [u8; 8] = *b"VKFEND\0\n";
/// The format version this build writes, and the newest it reads.
pub const FORMAT_VERSION: u32 = 9;
/// Every tensor (and the weights section itself) starts at a multiple of this many bytes.
pub const WEIGHT_ALIGN: u64 = 4096;

const HEADER_LEN: u64 = 64;
const TRAILER_LEN: u64 = 16;
/// Bytes of the header the header checksum covers (all but the checksum itself).
const HEADER_CRC_SPAN: usize = 60;

/// A part of a schedule file, as errors name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    /// The fixed 64-byte header.
    Header,
    /// The encoded schedule.
    Metadata,
    /// The tensors' bytes.
    Weights,
    /// The 16 bytes after the weights.
    Trailer,
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Section::Header => "header",
            Section::Metadata => "metadata section",
            Section::Weights => "weights section",
            Section::Trailer => "trailer",
        })
    }
}

/// Why a schedule file could not be read or written. Reader errors name the file.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleFileError {
    /// The file could not be opened, mapped or written.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error (in the message, so not also a `source()`: callers
        /// printing the chain would repeat it).
        error: io::Error,
    },
    /// The path is a directory.
    #[error(
        "{}: is a directory, not a schedule file (compile-model MODEL_DIR -o FILE writes one)",
        path.display()
    )]
    IsADirectory {
        /// The path.
        path: PathBuf,
    },
    /// Reading: the path is a device, fifo or socket (opening a fifo would wait for a writer).
    #[error(
        "{}: not a regular file (a device, fifo or socket), not a schedule file \
         (compile-model MODEL_DIR -o FILE writes one)",
        path.display()
    )]
    SpecialFile {
        /// The path.
        path: PathBuf,
    },
    /// Writing: the folder the path names does not exist.
    #[error("{}: the folder {} does not exist", path.display(), folder.display())]
    NoFolder {
        /// The path.
        path: PathBuf,
        /// Its folder.
        folder: PathBuf,
    },
    /// Writing: something other than a file is at the path (a device such as /dev/null, a
    /// fifo, a directory), which the write's final rename would replace.
    #[error(
        "{}: exists and is not a regular file (a device, fifo or directory): the output is \
         written beside the path and renamed over it, which would replace it; give a file path",
        path.display()
    )]
    NotAFile {
        /// The path.
        path: PathBuf,
    },
    /// The first bytes are not [`MAGIC`].
    #[error("{}: not a vkfuse schedule file (it does not start with the vkfuse magic bytes)", path.display())]
    BadMagic {
        /// The file.
        path: PathBuf,
    },
    /// The file is of a format version this build does not read.
    #[error("{}: {}", path.display(), version_message(*found, *supported, *header_intact))]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version in the file.
        found: u32,
        /// The version this build reads.
        supported: u32,
        /// Whether the header's checksum, where this version keeps it, matches: when it does
        /// not, the version field itself may be what is damaged.
        header_intact: bool,
    },
    /// The file ends before a section does.
    #[error(
        "{}: truncated in the {section}: it needs {expected} bytes, the file has {actual}",
        path.display()
    )]
    Truncated {
        /// The file.
        path: PathBuf,
        /// The section that does not fit.
        section: Section,
        /// The file size the section needs.
        expected: u64,
        /// The file's size.
        actual: u64,
    },
    /// A section's bytes do not match their stored checksum.
    #[error(
        "{}: checksum mismatch in the {section} (stored {stored:#010x}, computed {computed:#010x}): \
         the file is corrupt; recompile the model",
        path.display()
    )]
    ChecksumMismatch {
        /// The file.
        path: PathBuf,
        /// The section.
        section: Section,
        /// The checksum the file stores.
        stored: u32,
        /// The checksum of the bytes.
        computed: u32,
    },
    /// The checksums match but the contents do not follow the format (a writer bug or a
    /// crafted file).
    #[error("{}: malformed {section} at byte {offset}: {message}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// The section.
        section: Section,
        /// The byte of the file where decoding stopped.
        offset: u64,
        /// What is wrong.
        message: String,
    },
    /// The file decodes, but the schedule does not validate.
    #[error("{}: {error}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What [`Schedule::validate`] found (in the message, so not also a `source()`:
        /// callers printing the chain would repeat it).
        error: ScheduleError,
    },
    /// Writing to a stream failed ([`Schedule::write_file`] reports [`Self::Io`] instead).
    #[error("cannot write the schedule file: {0}")]
    Write(io::Error),
    /// The schedule cannot be written: it does not validate, or a table does not fit the
    /// format (in the message, not also a `source()`, as [`Self::Invalid`]'s).
    #[error("cannot write the schedule: {0}")]
    Unwritable(ScheduleError),
    /// A weight's bytes are missing or of the wrong size (writer).
    #[error("weight `{tensor}`: {message}")]
    Weight {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        message: String,
    },
}

fn version_message(found: u32, supported: u32, header_intact: bool) -> String {
    let what = if found > supported {
        format!(
            "schedule format version {found} is newer than this vkfuse reads (version \
             {supported}); upgrade vkfuse or recompile the model with this version"
        )
    } else {
        format!(
            "schedule format version {found} is not supported (this vkfuse reads version \
             {supported}); recompile the model"
        )
    };
    if header_intact {
        what
    } else {
        // The version is still checked first (a newer version may keep its checksum
        // elsewhere), but a field of random bytes is far likelier than a future format.
        format!(
            "the file is damaged: its header checksum does not match, so the version it names \
             may be a damaged byte too; if it is not, {what}"
        )
    }
}

/// How much of the file [`ScheduleFile::open_with`] checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verify {
    /// Every check, the weights checksum included (reads every weight byte once).
    All,
    /// Everything but the weights checksum: for tools that show the schedule and never upload
    /// the weights (`vkfuse inspect`).
    SkipWeightsChecksum,
}

/// One tensor's bytes in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorEntry {
    /// The tensor's name, as [`WeightUpload::tensor`] names it.
    pub name: String,
    /// The first byte in the file (a multiple of [`WEIGHT_ALIGN`]).
    pub offset: u64,
    /// Bytes.
    pub len: u64,
}

/// Where the sections of an opened file lie, for dumps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileLayout {
    /// The format version.
    pub version: u32,
    /// The file's size in bytes.
    pub file_len: u64,
    /// The metadata section's bytes.
    pub metadata: (u64, u64),
    /// The metadata section's CRC-32.
    pub metadata_crc: u32,
    /// The weights section's bytes (offset, length).
    pub weights: (u64, u64),
    /// The weights section's CRC-32.
    pub weights_crc: u32,
}

/// The weight bytes of an opened schedule file: zero-copy slices of the memory map.
pub struct FileWeights {
    path: PathBuf,
    map: Mmap,
    tensors: Vec<TensorEntry>,
    index: HashMap<String, usize>,
}

impl FileWeights {
    /// The tensors in file order.
    pub fn tensors(&self) -> &[TensorEntry] {
        &self.tensors
    }

    /// The sum of the tensors' sizes (padding excluded).
    pub fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.len).sum()
    }
}

impl TensorBytes for FileWeights {
    fn tensor_bytes(&self, tensor: &str) -> Result<Cow<'_, [u8]>, String> {
        let t = self
            .index
            .get(tensor)
            .map(|&i| &self.tensors[i])
            .ok_or_else(|| format!("no tensor of that name in {}", self.path.display()))?;
        // In range: open checked every entry against the file size.
        Ok(Cow::Borrowed(
            &self.map[t.offset as usize..(t.offset + t.len) as usize],
        ))
    }
}

impl fmt::Debug for FileWeights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileWeights")
            .field("path", &self.path)
            .field("tensors", &self.tensors.len())
            .field("bytes", &self.total_bytes())
            .finish()
    }
}

/// An opened, verified and validated schedule file.
///
/// ```no_run
/// # use vkfuse_runtime::schedule::ScheduleFile;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let file = ScheduleFile::open("qwen3.vkf")?;
/// println!("{file}"); // the `vkfuse inspect` dump
/// let (schedule, weights) = file.into_parts();
/// // Loaded::new(device, schedule, &weights)
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ScheduleFile {
    schedule: Schedule,
    weights: FileWeights,
    layout: FileLayout,
    /// What opening it checked (the dump says whether the weights' checksum was).
    verified: Verify,
}

impl ScheduleFile {
    /// Maps, verifies (both checksums), decodes and validates the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<ScheduleFile, ScheduleFileError> {
        Self::open_with(path, Verify::All)
    }

    /// [`Self::open`], checking as much as `verify` asks.
    pub fn open_with(
        path: impl AsRef<Path>,
        verify: Verify,
    ) -> Result<ScheduleFile, ScheduleFileError> {
        let path = path.as_ref();
        let io_err = |error| ScheduleFileError::Io {
            path: path.to_path_buf(),
            error,
        };
        // Before opening: opening a fifo for reading waits for a writer.
        let kind = std::fs::metadata(path).map_err(io_err)?;
        if !kind.is_file() && !kind.is_dir() {
            return Err(ScheduleFileError::SpecialFile {
                path: path.to_path_buf(),
            });
        }
        let file = File::open(path).map_err(io_err)?;
        let metadata = file.metadata().map_err(io_err)?;
        if metadata.is_dir() {
            return Err(ScheduleFileError::IsADirectory {
                path: path.to_path_buf(),
            });
        }
        let len = metadata.len();
        if len == 0 {
            return Err(ScheduleFileError::Truncated {
                path: path.to_path_buf(),
                section: Section::Header,
                expected: HEADER_LEN,
                actual: 0,
            });
        }
        // SAFETY: the map is read-only and private to this process; a schedule file must not be
        // modified while it is open (the same contract as every mmap-based loader). Every access
        // below is bounds-checked against the map's length.
        let map = unsafe { Mmap::map(&file) }.map_err(io_err)?;
        let (schedule, tensors, layout) = parse(path, &map, verify)?;
        let index = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(ScheduleFile {
            schedule,
            weights: FileWeights {
                path: path.to_path_buf(),
                map,
                tensors,
                index,
            },
            layout,
            verified: verify,
        })
    }

    /// The schedule, validated.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The weights, for [`crate::session::Loaded::new`].
    pub fn weights(&self) -> &FileWeights {
        &self.weights
    }

    /// Where the sections lie.
    pub fn layout(&self) -> FileLayout {
        self.layout
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.weights.path
    }

    /// The schedule and the weights, apart: `Loaded::new(device, schedule, &weights)`.
    pub fn into_parts(self) -> (Schedule, FileWeights) {
        (self.schedule, self.weights)
    }
}

impl TensorBytes for ScheduleFile {
    fn tensor_bytes(&self, tensor: &str) -> Result<Cow<'_, [u8]>, String> {
        self.weights.tensor_bytes(tensor)
    }
}

impl fmt::Display for ScheduleFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = &self.layout;
        writeln!(
            f,
            "file {}: vkfuse schedule format {}, {} bytes",
            self.path().display(),
            l.version,
            l.file_len
        )?;
        writeln!(
            f,
            "  metadata @{} +{} crc32 {:#010x}",
            l.metadata.0, l.metadata.1, l.metadata_crc
        )?;
        writeln!(
            f,
            "  weights  @{} +{} crc32 {:#010x}{}, {} tensors",
            l.weights.0,
            l.weights.1,
            l.weights_crc,
            match self.verified {
                Verify::All => "",
                Verify::SkipWeightsChecksum => " (stored, not checked: loading checks it)",
            },
            self.weights.tensors.len()
        )?;
        writeln!(f)?;
        write!(f, "{}", self.schedule)?;
        writeln!(f)?;
        writeln!(f, "tensors in the file ({}):", self.weights.tensors.len())?;
        for t in &self.weights.tensors {
            writeln!(f, "  @{:<12} +{:<12} {}", t.offset, t.len, t.name)?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Writer

impl Schedule {
    /// Writes the schedule and its weights (from `weights`, streamed tensor by tensor) to
    /// `out`; returns the bytes written. The output is a function of the schedule and the
    /// weight bytes only: writing twice gives identical files. Wrap a file in a
    /// [`BufWriter`]; [`Self::write_file`] does.
    ///
    /// One tensor's bytes are held at a time: a source that makes them (a conversion to a
    /// block format) makes each as it is written, so converting a model larger than the memory
    /// writes it all the same.
    pub fn write_to<W: Write + ?Sized>(
        &self,
        out: &mut W,
        weights: &dyn TensorBytes,
    ) -> Result<u64, ScheduleFileError> {
        self.write_to_reporting(out, weights, &mut |_| {})
    }

    /// [`Self::write_to`], telling `progress` after each tensor how many of the weights' bytes
    /// are written (a large model's conversion and write take minutes).
    pub fn write_to_reporting<W: Write + ?Sized>(
        &self,
        out: &mut W,
        weights: &dyn TensorBytes,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<u64, ScheduleFileError> {
        self.validate().map_err(ScheduleFileError::Unwritable)?;
        let tensors = tensor_table(self)?;
        let weight_err = |t: &TensorEntry, message| ScheduleFileError::Weight {
            tensor: t.name.clone(),
            message,
        };
        // Every tensor is present and of its size before a byte is written.
        for t in &tensors {
            let len = weights.tensor_len(&t.name).map_err(|m| weight_err(t, m))?;
            if len != t.len {
                let message = format!("{len} bytes, the schedule expects {}", t.len);
                return Err(weight_err(t, message));
            }
        }
        // Offsets relative to the weights section: the metadata does not depend on where the
        // section starts.
        let mut cursor = 0u64;
        let mut relative = Vec::with_capacity(tensors.len());
        for t in &tensors {
            let offset = align_up(cursor);
            relative.push(offset);
            cursor = offset + t.len;
        }
        let weights_len = cursor;
        let metadata = encode(self, &tensors, &relative).map_err(ScheduleFileError::Unwritable)?;
        let meta_end = HEADER_LEN + metadata.len() as u64;
        let weights_offset = align_up(meta_end);
        let header = Header {
            version: FORMAT_VERSION,
            meta_offset: HEADER_LEN,
            meta_len: metadata.len() as u64,
            weights_offset,
            weights_len,
            meta_crc: crc32::checksum(&metadata),
        };

        let w = |r: io::Result<()>| r.map_err(ScheduleFileError::Write);
        w(out.write_all(&header.encode()))?;
        w(out.write_all(&metadata))?;
        w(out.write_all(&ZEROS[..(weights_offset - meta_end) as usize]))?;
        let mut crc = crc32::Crc32::new();
        let mut at = 0u64;
        let mut done = Progress {
            done: 0,
            total: tensors.iter().map(|t| t.len).sum(),
        };
        for (t, &offset) in tensors.iter().zip(&relative) {
            // The length the source told is the length it gives (the offsets depend on it).
            let bytes = weights
                .tensor_bytes_sized(&t.name, t.len)
                .map_err(|m| weight_err(t, m))?;
            let pad = &ZEROS[..(offset - at) as usize];
            crc.update(pad);
            w(out.write_all(pad))?;
            crc.update(&bytes);
            w(out.write_all(&bytes))?;
            at = offset + t.len;
            done.done += t.len;
            progress(done);
        }
        let mut trailer = [0u8; TRAILER_LEN as usize];
        trailer[0..4].copy_from_slice(&crc.finish().to_le_bytes());
        trailer[8..16].copy_from_slice(&END_MAGIC);
        w(out.write_all(&trailer))?;
        w(out.flush())?;
        Ok(weights_offset + weights_len + TRAILER_LEN)
    }

    /// [`Self::write_to`] a file at `path`, atomically: the bytes go to `PATH.PID-N.partial` (this
    /// process's id, its Nth write), which is renamed to `path` once complete (and removed on failure). A symlink at `path` is written
    /// through (the file it names is replaced, the link stays); anything else that is not a
    /// regular file is refused ([`ScheduleFileError::NotAFile`]): the rename would replace it.
    pub fn write_file(
        &self,
        path: impl AsRef<Path>,
        weights: &dyn TensorBytes,
    ) -> Result<u64, ScheduleFileError> {
        self.write_file_reporting(path, weights, &mut |_| {})
    }

    /// [`Self::write_file`], telling `progress` as [`Self::write_to_reporting`] does.
    pub fn write_file_reporting(
        &self,
        path: impl AsRef<Path>,
        weights: &dyn TensorBytes,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<u64, ScheduleFileError> {
        let given = path.as_ref();
        let target = output_target(given)?;
        let path = target.as_path();
        let partial = partial_of(path);
        let io_err = |p: &Path, error| ScheduleFileError::Io {
            path: p.to_path_buf(),
            error,
        };
        // Named by the path asked for: the partial file is ours, not the user's.
        let file = File::create(&partial).map_err(|e| io_err(given, e))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let result = self
            .write_to_reporting(&mut out, weights, progress)
            .and_then(|n| {
                out.into_inner()
                    .map_err(|e| e.into_error())
                    .and_then(|_file| std::fs::rename(&partial, path))
                    .map_err(ScheduleFileError::Write)?;
                Ok(n)
            });
        match result {
            Ok(n) => Ok(n),
            Err(e) => {
                let _ = std::fs::remove_file(&partial);
                Err(match e {
                    ScheduleFileError::Write(source) => io_err(given, source),
                    e => e,
                })
            }
        }
    }
}

/// Whether [`Schedule::write_file`] (or [`write_whole`]) could write `path`, asked before the
/// work that makes what goes there: its folder exists, [`output_target`]'s refusals, then the
/// file it writes first created and removed.
pub fn check_output(path: &Path) -> Result<(), ScheduleFileError> {
    if let Some(folder) = missing_folder(path) {
        return Err(ScheduleFileError::NoFolder {
            path: path.into(),
            folder: folder.into(),
        });
    }
    let partial = partial_of(&output_target(path)?);
    File::create(&partial).map_err(|error| ScheduleFileError::Io {
        path: path.into(),
        error,
    })?;
    let _ = std::fs::remove_file(&partial);
    Ok(())
}

/// The folder an output `path` names, where it does not exist (a bare file name's is the
/// working directory, which does).
pub fn missing_folder(path: &Path) -> Option<&Path> {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty() && !d.is_dir())
}

/// `bytes` written to `path` whole or not at all, by [`Schedule::write_file`]'s rules: through
/// a partial file renamed over the target (a full disk leaves the old file, not a short one),
/// links written through, anything but a regular file refused (a small file beside a schedule:
/// `vkfuse calibrate -o`'s costs).
pub fn write_whole(path: &Path, bytes: &[u8]) -> Result<(), ScheduleFileError> {
    let target = output_target(path)?;
    let partial = partial_of(&target);
    std::fs::write(&partial, bytes)
        .and_then(|()| std::fs::rename(&partial, &target))
        .map_err(|error| {
            let _ = std::fs::remove_file(&partial);
            ScheduleFileError::Io {
                path: path.to_path_buf(),
                error,
            }
        })
}

/// The file [`Schedule::write_file`] writes `target`'s bytes to before renaming it: named for
/// this process and this write, so that two writers of the same output at once (two compiles
/// with one `-o`) do not write into one partial file, which one of them then renamed over the
/// target, a mix of both, saying it wrote it.
fn partial_of(target: &Path) -> PathBuf {
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut partial = target.as_os_str().to_owned();
    partial.push(format!(".{}-{n}.partial", std::process::id()));
    PathBuf::from(partial)
}

/// Where [`Schedule::write_file`] writes for `path`: `path` where nothing is there (or a
/// dangling link, replaced by the file), the file a link names where it is one, and an error
/// where something other than a regular file is there.
fn output_target(path: &Path) -> Result<PathBuf, ScheduleFileError> {
    // metadata() follows links: a link to a device is refused as the device is.
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(std::fs::canonicalize(path).unwrap_or_else(|_| path.into())),
        Ok(_) => Err(ScheduleFileError::NotAFile { path: path.into() }),
        Err(_) => Ok(path.into()),
    }
}

static ZEROS: [u8; WEIGHT_ALIGN as usize] = [0; WEIGHT_ALIGN as usize];

fn align_up(x: u64) -> u64 {
    x.div_ceil(WEIGHT_ALIGN) * WEIGHT_ALIGN
}

/// Each distinct tensor once, in the order of its first upload, with its size.
fn tensor_table(s: &Schedule) -> Result<Vec<TensorEntry>, ScheduleFileError> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut out: Vec<TensorEntry> = Vec::new();
    for w in &s.weights {
        match seen.get(w.tensor.as_str()) {
            Some(&i) if out[i].len != w.dst.size => {
                return Err(ScheduleFileError::Unwritable(ScheduleError::Invalid(
                    format!(
                        "tensor `{}` is uploaded with {} bytes and with {}",
                        w.tensor, out[i].len, w.dst.size
                    ),
                )))
            }
            Some(_) => {}
            None => {
                seen.insert(&w.tensor, out.len());
                out.push(TensorEntry {
                    name: w.tensor.clone(),
                    offset: 0,
                    len: w.dst.size,
                });
            }
        }
    }
    Ok(out)
}

struct Header {
    version: u32,
    meta_offset: u64,
    meta_len: u64,
    weights_offset: u64,
    weights_len: u64,
    meta_crc: u32,
}

impl Header {
    fn encode(&self) -> [u8; HEADER_LEN as usize] {
        let mut h = [0u8; HEADER_LEN as usize];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..12].copy_from_slice(&self.version.to_le_bytes());
        // 12..16: flags, zero.
        h[16..24].copy_from_slice(&self.meta_offset.to_le_bytes());
        h[24..32].copy_from_slice(&self.meta_len.to_le_bytes());
        h[32..40].copy_from_slice(&self.weights_offset.to_le_bytes());
        h[40..48].copy_from_slice(&self.weights_len.to_le_bytes());
        h[48..52].copy_from_slice(&self.meta_crc.to_le_bytes());
        // 52..60: reserved, zero.
        let crc = crc32::checksum(&h[..HEADER_CRC_SPAN]);
        h[60..64].copy_from_slice(&crc.to_le_bytes());
        h
    }
}

// ---------------------------------------------------------------------------------------------
// Metadata encoding: see docs/schedule-format.md for the field order.

struct Encoder(Vec<u8>);

impl Encoder {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn count(&mut self, n: usize, what: &str) -> Result<(), ScheduleError> {
        let n = u32::try_from(n).map_err(|_| {
            ScheduleError::Invalid(format!("{what}: {n} entries do not fit the format's u32"))
        })?;
        self.u32(n);
        Ok(())
    }
    fn str(&mut self, s: &str, what: &str) -> Result<(), ScheduleError> {
        self.count(s.len(), what)?;
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
    fn u32s(&mut self, v: &[u32], what: &str) -> Result<(), ScheduleError> {
        self.count(v.len(), what)?;
        for &x in v {
            self.u32(x);
        }
        Ok(())
    }
    fn slice(&mut self, s: &Slice) {
        self.u32(s.buffer.0);
        self.u64(s.offset);
        self.u64(s.size);
    }
    fn dispatch(&mut self, d: &Dispatch) -> Result<(), ScheduleError> {
        self.str(&d.label, "dispatch label")?;
        self.u32(d.kernel.0);
        for g in d.workgroups {
            self.u32(g);
        }
        self.count(d.bindings.len(), "bindings")?;
        for b in &d.bindings {
            self.slice(b);
        }
        self.count(d.push_constants.len(), "push_constants")?;
        self.0.extend_from_slice(&d.push_constants);
        self.count(d.alternatives.len(), "alternatives")?;
        for a in &d.alternatives {
            self.u32(a.below);
            self.u32(a.kernel.0);
            for g in a.workgroups {
                self.u32(g);
            }
        }
        self.u32s(&d.ops, "dispatch ops")
    }
}

fn role_code(r: BufferRole) -> u8 {
    match r {
        BufferRole::Weights => 0,
        BufferRole::Arena => 1,
        BufferRole::State => 2,
        BufferRole::Io => 3,
    }
}

fn encode(
    s: &Schedule,
    tensors: &[TensorEntry],
    offsets: &[u64],
) -> Result<Vec<u8>, ScheduleError> {
    let mut e = Encoder(Vec::new());
    e.str(&s.meta.architecture, "architecture")?;
    e.u32(s.meta.vocab_size);
    e.u32(s.meta.max_context);
    e.u32s(&s.meta.eos_token_ids, "eos_token_ids")?;
    match &s.meta.tokenizer {
        None => e.u8(0),
        Some(json) => {
            e.u8(1);
            e.str(json, "tokenizer")?;
        }
    }

    e.count(s.buffers.len(), "buffers")?;
    for b in &s.buffers {
        e.str(&b.label, "buffer label")?;
        e.u64(b.size);
        e.u8(role_code(b.role));
    }

    e.count(s.kernels.len(), "kernels")?;
    for k in &s.kernels {
        e.str(&k.label, "kernel label")?;
        e.u32s(&k.spirv, "spirv")?;
        e.u32(k.bindings);
        e.u32(k.push_constant_bytes);
        e.u32s(&k.spec_constants, "spec_constants")?;
        e.u32(k.subgroups.unwrap_or(0));
    }

    e.count(s.dispatches.len(), "dispatches")?;
    for d in &s.dispatches {
        e.dispatch(d)?;
    }

    e.count(s.levels.len(), "levels")?;
    for l in &s.levels {
        e.u32(l.start);
        e.u32(l.end);
    }

    e.count(s.persistent.len(), "persistent regions")?;
    for r in &s.persistent {
        e.u32(r.levels.start);
        e.u32(r.levels.end);
        e.dispatch(&r.dispatch)?;
    }

    e.slice(&s.io.token);
    e.u8(match s.io.token_encoding {
        TokenEncoding::Index => 0,
        TokenEncoding::Key => 1,
    });
    e.slice(&s.io.position);
    e.slice(&s.io.logits);

    e.count(s.weights.len(), "weight uploads")?;
    for w in &s.weights {
        e.str(&w.tensor, "tensor name")?;
        e.slice(&w.dst);
    }

    e.count(tensors.len(), "tensors")?;
    for (t, &offset) in tensors.iter().zip(offsets) {
        e.str(&t.name, "tensor name")?;
        e.u64(offset);
        e.u64(t.len);
    }
    Ok(e.0)
}

// ---------------------------------------------------------------------------------------------
// Reader

/// Where decoding stopped (relative to the metadata section) and why.
struct DecodeError {
    at: usize,
    message: String,
}

struct Decoder<'a> {
    bytes: &'a [u8],
    pos: usize,
}

type Decoded<T> = Result<T, DecodeError>;

impl<'a> Decoder<'a> {
    fn fail<T>(&self, message: String) -> Decoded<T> {
        Err(DecodeError {
            at: self.pos,
            message,
        })
    }
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }
    fn take(&mut self, n: usize, what: &str) -> Decoded<&'a [u8]> {
        if n > self.remaining() {
            return self.fail(format!(
                "{what} needs {n} bytes, {} remain",
                self.remaining()
            ));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self, what: &str) -> Decoded<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u32(&mut self, what: &str) -> Decoded<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &str) -> Decoded<u64> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    /// A count of entries each at least `min_size` encoded bytes: a count the remaining bytes
    /// cannot hold is refused before anything is allocated for it.
    fn count(&mut self, min_size: usize, what: &str) -> Decoded<usize> {
        let at = self.pos;
        let n = self.u32(what)? as usize;
        if n.saturating_mul(min_size) > self.remaining() {
            return Err(DecodeError {
                at,
                message: format!(
                    "{what}: {n} entries of at least {min_size} bytes do not fit in the {} bytes \
                     that remain",
                    self.remaining()
                ),
            });
        }
        Ok(n)
    }
    fn vec<T>(
        &mut self,
        min_size: usize,
        what: &str,
        mut item: impl FnMut(&mut Self) -> Decoded<T>,
    ) -> Decoded<Vec<T>> {
        let n = self.count(min_size, what)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(item(self)?);
        }
        Ok(v)
    }
    fn str(&mut self, what: &str) -> Decoded<String> {
        let n = self.count(1, what)?;
        let at = self.pos;
        let b = self.take(n, what)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(DecodeError {
                at: at + e.valid_up_to(),
                message: format!("{what} is not UTF-8"),
            }),
        }
    }
    fn u32s(&mut self, what: &str) -> Decoded<Vec<u32>> {
        self.vec(4, what, |d| d.u32(what))
    }
    fn slice(&mut self, what: &str) -> Decoded<Slice> {
        Ok(Slice {
            buffer: BufferId(self.u32(what)?),
            offset: self.u64(what)?,
            size: self.u64(what)?,
        })
    }
    fn dispatch(&mut self) -> Decoded<Dispatch> {
        let label = self.str("dispatch label")?;
        let kernel = KernelId(self.u32("dispatch kernel")?);
        let workgroups = [
            self.u32("workgroups")?,
            self.u32("workgroups")?,
            self.u32("workgroups")?,
        ];
        let bindings = self.vec(SLICE_SIZE, "bindings", |d| d.slice("binding"))?;
        let n = self.count(1, "push_constants")?;
        let push_constants = self.take(n, "push_constants")?.to_vec();
        let alternatives = self.vec(ALTERNATIVE_SIZE, "alternatives", |d| {
            Ok(Alternative {
                below: d.u32("alternative position")?,
                kernel: KernelId(d.u32("alternative kernel")?),
                workgroups: [
                    d.u32("alternative workgroups")?,
                    d.u32("alternative workgroups")?,
                    d.u32("alternative workgroups")?,
                ],
            })
        })?;
        let ops = self.u32s("dispatch ops")?;
        Ok(Dispatch {
            kernel,
            bindings,
            push_constants,
            workgroups,
            label,
            alternatives,
            ops,
        })
    }
}

const SLICE_SIZE: usize = 20;
/// The fewest bytes an encoded dispatch takes (label length, kernel, workgroups, counts).
const DISPATCH_MIN: usize = 4 + 4 + 12 + 4 + 4 + 4 + 4;
/// An encoded alternative grid: position, kernel, workgroups.
const ALTERNATIVE_SIZE: usize = 4 + 4 + 12;

/// A tensor-table record: name, offset in the weights section, size, and where it was read.
type TensorRecord = (String, u64, u64, usize);

fn decode(bytes: &[u8]) -> Decoded<(Schedule, Vec<TensorRecord>)> {
    let mut d = Decoder { bytes, pos: 0 };
    let meta = ModelMeta {
        architecture: d.str("architecture")?,
        vocab_size: d.u32("vocab_size")?,
        max_context: d.u32("max_context")?,
        eos_token_ids: d.u32s("eos_token_ids")?,
        tokenizer: match d.u8("tokenizer presence")? {
            0 => None,
            1 => Some(d.str("tokenizer")?),
            b => {
                d.pos -= 1;
                return d.fail(format!("tokenizer presence must be 0 or 1, not {b}"));
            }
        },
    };
    let buffers = d.vec(4 + 8 + 1, "buffers", |d| {
        let label = d.str("buffer label")?;
        let size = d.u64("buffer size")?;
        let role = match d.u8("buffer role")? {
            0 => BufferRole::Weights,
            1 => BufferRole::Arena,
            2 => BufferRole::State,
            3 => BufferRole::Io,
            r => {
                d.pos -= 1;
                return d.fail(format!("buffer `{label}`: unknown role {r}"));
            }
        };
        Ok(BufferDecl { label, size, role })
    })?;
    let kernels = d.vec(4 * 6, "kernels", |d| {
        Ok(KernelDecl {
            label: d.str("kernel label")?,
            spirv: d.u32s("spirv")?,
            bindings: d.u32("kernel bindings")?,
            push_constant_bytes: d.u32("push_constant_bytes")?,
            spec_constants: d.u32s("spec_constants")?,
            subgroups: match d.u32("kernel subgroups")? {
                0 => None,
                n => Some(n),
            },
        })
    })?;
    let dispatches = d.vec(DISPATCH_MIN, "dispatches", Decoder::dispatch)?;
    let levels = d.vec(8, "levels", |d| Ok(d.u32("level")?..d.u32("level")?))?;
    let persistent = d.vec(8 + DISPATCH_MIN, "persistent regions", |d| {
        let levels = d.u32("region level")?..d.u32("region level")?;
        Ok(Persistent {
            levels,
            dispatch: d.dispatch()?,
        })
    })?;
    let token = d.slice("io token")?;
    let token_encoding = match d.u8("io token encoding")? {
        0 => TokenEncoding::Index,
        1 => TokenEncoding::Key,
        e => {
            d.pos -= 1;
            return d.fail(format!("io token: unknown encoding {e}"));
        }
    };
    let io = Io {
        token,
        token_encoding,
        position: d.slice("io position")?,
        logits: d.slice("io logits")?,
    };
    let weights = d.vec(4 + SLICE_SIZE, "weight uploads", |d| {
        Ok(WeightUpload {
            tensor: d.str("tensor name")?,
            dst: d.slice("weight upload")?,
        })
    })?;
    let tensors = d.vec(4 + 8 + 8, "tensors", |d| {
        let at = d.pos;
        Ok((
            d.str("tensor name")?,
            d.u64("tensor offset")?,
            d.u64("tensor size")?,
            at,
        ))
    })?;
    if d.remaining() != 0 {
        return d.fail(format!("{} bytes after the last table", d.remaining()));
    }
    let schedule = Schedule {
        meta,
        buffers,
        weights,
        kernels,
        dispatches,
        levels,
        io,
        persistent,
    };
    Ok((schedule, tensors))
}

fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn read_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Every check and the decode, on the mapped bytes.
fn parse(
    path: &Path,
    file: &[u8],
    verify: Verify,
) -> Result<(Schedule, Vec<TensorEntry>, FileLayout), ScheduleFileError> {
    let p = || path.to_path_buf();
    let len = file.len() as u64;
    let malformed = |section, offset, message: String| ScheduleFileError::Malformed {
        path: p(),
        section,
        offset,
        message,
    };
    let truncated = |section, expected| ScheduleFileError::Truncated {
        path: p(),
        section,
        expected,
        actual: len,
    };

    // Header: magic first (a short file of something else is "not a schedule"), then the
    // version (a newer file may lay out the rest differently), then the rest.
    let head = &file[..file.len().min(MAGIC.len())];
    if head != &MAGIC[..head.len()] {
        return Err(ScheduleFileError::BadMagic { path: p() });
    }
    if len < 12 {
        return Err(truncated(Section::Header, HEADER_LEN));
    }
    let version = read_u32(file, 8);
    if version != FORMAT_VERSION {
        // Every version so far keeps the header checksum where this one does.
        let header_intact = len >= HEADER_LEN
            && read_u32(file, HEADER_CRC_SPAN) == crc32::checksum(&file[..HEADER_CRC_SPAN]);
        return Err(ScheduleFileError::UnsupportedVersion {
            path: p(),
            found: version,
            supported: FORMAT_VERSION,
            header_intact,
        });
    }
    if len < HEADER_LEN {
        return Err(truncated(Section::Header, HEADER_LEN));
    }
    let stored = read_u32(file, HEADER_CRC_SPAN);
    let computed = crc32::checksum(&file[..HEADER_CRC_SPAN]);
    if stored != computed {
        return Err(ScheduleFileError::ChecksumMismatch {
            path: p(),
            section: Section::Header,
            stored,
            computed,
        });
    }
    for (at, what) in [(12, "flags"), (52, "reserved"), (56, "reserved")] {
        if read_u32(file, at) != 0 {
            return Err(malformed(
                Section::Header,
                at as u64,
                format!("{what} must be zero"),
            ));
        }
    }
    let meta_offset = read_u64(file, 16);
    let meta_len = read_u64(file, 24);
    let weights_offset = read_u64(file, 32);
    let weights_len = read_u64(file, 40);
    let meta_crc = read_u32(file, 48);
    if meta_offset != HEADER_LEN {
        return Err(malformed(
            Section::Header,
            16,
            format!("the metadata must start at byte {HEADER_LEN}, not {meta_offset}"),
        ));
    }
    // Where the sum that overflows is stored (the metadata's offset is fixed: its length).
    let overflow = |at: u64, what: &str| {
        malformed(
            Section::Header,
            at,
            format!("{what} overflow a 64-bit offset"),
        )
    };
    let meta_end = meta_offset
        .checked_add(meta_len)
        .ok_or_else(|| overflow(24, "the metadata's offset and length"))?;
    if meta_end > len {
        return Err(truncated(Section::Metadata, meta_end));
    }
    if weights_offset % WEIGHT_ALIGN != 0 || weights_offset < meta_end {
        return Err(malformed(
            Section::Header,
            32,
            format!(
                "the weights section starts at byte {weights_offset}, which is not a multiple of \
                 {WEIGHT_ALIGN} at or after the metadata's end ({meta_end})"
            ),
        ));
    }
    let weights_end = weights_offset
        .checked_add(weights_len)
        .ok_or_else(|| overflow(32, "the weights section's offset and length (bytes 32, 40)"))?;
    let file_end = weights_end
        .checked_add(TRAILER_LEN)
        .ok_or_else(|| overflow(32, "the weights section's end and the trailer"))?;
    if weights_end > len {
        return Err(truncated(Section::Weights, weights_end));
    }
    if file_end > len {
        return Err(truncated(Section::Trailer, file_end));
    }
    if len > file_end {
        return Err(malformed(
            Section::Trailer,
            file_end,
            format!("{} unexpected bytes after the trailer", len - file_end),
        ));
    }
    // All offsets below are within the file, hence within usize.
    let (meta_end, weights_offset, weights_end) = (
        meta_end as usize,
        weights_offset as usize,
        weights_end as usize,
    );

    let metadata = &file[HEADER_LEN as usize..meta_end];
    let computed = crc32::checksum(metadata);
    if computed != meta_crc {
        return Err(ScheduleFileError::ChecksumMismatch {
            path: p(),
            section: Section::Metadata,
            stored: meta_crc,
            computed,
        });
    }
    // The padding to the weights is zeros (no checksum covers it: a byte there is damage).
    if let Some(i) = file[meta_end..weights_offset].iter().position(|&b| b != 0) {
        return Err(malformed(
            Section::Metadata,
            (meta_end + i) as u64,
            "the padding after the metadata must be zero bytes".into(),
        ));
    }
    let trailer = &file[weights_end..];
    if trailer[8..16] != END_MAGIC || read_u32(trailer, 4) != 0 {
        return Err(malformed(
            Section::Trailer,
            weights_end as u64,
            "the trailer is not a weights checksum, zero and the end magic".into(),
        ));
    }
    let weights_crc = read_u32(trailer, 0);

    let (schedule, table) = decode(metadata)
        .map_err(|e| malformed(Section::Metadata, HEADER_LEN + e.at as u64, e.message))?;

    // The tensor table: aligned, in order, inside the weights section, each name once, and
    // exactly what the uploads need.
    let bad_table = |at: usize, m: String| malformed(Section::Metadata, HEADER_LEN + at as u64, m);
    let tables_end = metadata.len();
    let mut tensors = Vec::with_capacity(table.len());
    let mut index: HashMap<&str, u64> = HashMap::with_capacity(table.len());
    let mut at = 0u64;
    for (name, offset, size, record) in &table {
        let end = offset.checked_add(*size);
        if offset % WEIGHT_ALIGN != 0 || *offset < at || end.is_none_or(|e| e > weights_len) {
            return Err(bad_table(
                *record,
                format!(
                "tensor `{name}` at +{offset} of {size} bytes is not aligned to {WEIGHT_ALIGN}, \
                 overlaps the one before it, or lies outside the weights section of \
                 {weights_len} bytes"
            ),
            ));
        }
        at = offset + size;
        if index.insert(name, *size).is_some() {
            return Err(bad_table(
                *record,
                format!("tensor `{name}` is listed twice"),
            ));
        }
        tensors.push(TensorEntry {
            name: name.clone(),
            offset: weights_offset as u64 + offset,
            len: *size,
        });
    }
    for w in &schedule.weights {
        match index.get(w.tensor.as_str()) {
            None => {
                return Err(bad_table(
                    tables_end,
                    format!("weight upload `{}` names no tensor in the file", w.tensor),
                ))
            }
            Some(&size) if size != w.dst.size => {
                return Err(bad_table(
                    tables_end,
                    format!(
                        "weight upload `{}` needs {} bytes, the file holds {size}",
                        w.tensor, w.dst.size
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    schedule
        .validate()
        .map_err(|error| ScheduleFileError::Invalid { path: p(), error })?;
    // Last, as the only check that reads every weight byte.
    if verify == Verify::All {
        let computed = crc32::checksum(&file[weights_offset..weights_end]);
        if computed != weights_crc {
            return Err(ScheduleFileError::ChecksumMismatch {
                path: p(),
                section: Section::Weights,
                stored: weights_crc,
                computed,
            });
        }
    }

    let layout = FileLayout {
        version,
        file_len: len,
        metadata: (HEADER_LEN, meta_len),
        metadata_crc: meta_crc,
        weights: (weights_offset as u64, weights_len),
        weights_crc,
    };
    Ok((schedule, tensors, layout))
}

/// CRC-32 as zlib computes it (reflected polynomial 0xEDB88320, initial and final xor
/// 0xFFFFFFFF), sixteen bytes at a time ("slicing-by-16").
pub mod crc32 {
    const SLICES: usize = 16;
    static TABLES: [[u32; 256]; SLICES] = tables();

    const fn tables() -> [[u32; 256]; SLICES] {
        let mut t = [[0u32; 256]; SLICES];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            t[0][i] = c;
            i += 1;
        }
        let mut i = 0;
        while i < 256 {
            let mut s = 1;
            while s < SLICES {
                let prev = t[s - 1][i];
                t[s][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
                s += 1;
            }
            i += 1;
        }
        t
    }

    /// A running CRC-32.
    #[derive(Clone, Debug)]
    pub struct Crc32(u32);

    impl Default for Crc32 {
        fn default() -> Self {
            Self::new()
        }
    }

    impl Crc32 {
        /// The CRC of no bytes.
        pub fn new() -> Crc32 {
            Crc32(!0)
        }

        /// Adds `bytes`.
        pub fn update(&mut self, bytes: &[u8]) {
            let t = &TABLES;
            let mut c = self.0;
            let mut chunks = bytes.chunks_exact(SLICES);
            for b in &mut chunks {
                let first = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) ^ c;
                let mut x = t[15][(first & 0xff) as usize]
                    ^ t[14][((first >> 8) & 0xff) as usize]
                    ^ t[13][((first >> 16) & 0xff) as usize]
                    ^ t[12][(first >> 24) as usize];
                let mut k = 4;
                while k < SLICES {
                    x ^= t[SLICES - 1 - k][b[k] as usize];
                    k += 1;
                }
                c = x;
            }
            for &b in chunks.remainder() {
                c = t[0][((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
            }
            self.0 = c;
        }

        /// The CRC of the bytes so far.
        pub fn finish(&self) -> u32 {
            !self.0
        }
    }

    /// The CRC-32 of `bytes`.
    pub fn checksum(bytes: &[u8]) -> u32 {
        let mut c = Crc32::new();
        c.update(bytes);
        c.finish()
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn should_match_the_standard_check_value() {
            assert_eq!(checksum(b"123456789"), 0xCBF4_3926);
            assert_eq!(checksum(b""), 0);
        }

        #[test]
        fn should_not_depend_on_how_the_bytes_are_split() {
            let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
            let mut c = Crc32::new();
            for part in data.chunks(13) {
                c.update(part);
            }
            assert_eq!(c.finish(), checksum(&data));
            let mut slow = !0u32;
            for &b in &data {
                slow ^= b as u32;
                for _ in 0..8 {
                    slow = if slow & 1 != 0 {
                        0xEDB8_8320 ^ (slow >> 1)
                    } else {
                        slow >> 1
                    };
                }
            }
            assert_eq!(!slow, checksum(&data));
        }
    }
}
