//! The checkpoint's tensors: safetensors files memory-mapped, their headers parsed by the
//! `safetensors` crate, and one sorted index from tensor name to dtype, shape, file and bytes.
//!
//! Which files: `model.safetensors`; else `model.safetensors.index.json`, whose `weight_map`
//! names the shard of each tensor; else every `*.safetensors` file in the directory.
//!
//! Tensors stored as F32, F16 or BF16 are readable. Others (I64, F8, ...) are indexed too, so
//! that [`TensorStore::contains`] tells the truth, but asking for them ([`TensorStore::expect`],
//! [`TensorStore::bytes`], [`TensorStore::to_f32`]) is an [`ImportError::UnsupportedDtype`]:
//! a checkpoint may carry tensors the model never reads.

use std::collections::BTreeMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::Metadata;
use safetensors::{Dtype, SafeTensorError, SafeTensors};
use serde_json::Value;

use super::error::ImportError;
use super::fields::show;
use super::layout::{self, Derived};
use crate::ir::DType;

type R<T> = Result<T, ImportError>;

/// A tensor's description. `file` is the safetensors file that stores it.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub file: PathBuf,
}

impl TensorInfo {
    /// The number of elements (1 for a scalar).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// One memory-mapped safetensors file.
struct Shard {
    path: PathBuf,
    map: Mmap,
}

/// What the index knows of one tensor.
struct Entry {
    shard: usize,
    /// Byte range inside the shard's map.
    data: Range<usize>,
    kind: EntryKind,
}

enum EntryKind {
    Readable(TensorInfo),
    /// A dtype vkfuse does not read, as the safetensors header names it.
    Unreadable {
        dtype: String,
        numel: usize,
    },
}

/// All tensors of a checkpoint, indexed by name, their bytes borrowed from the memory maps.
pub struct TensorStore {
    /// The checkpoint's entry point, named in [`ImportError::MissingTensor`]: model.safetensors,
    /// the index, or the directory.
    source: PathBuf,
    shards: Vec<Shard>,
    index: BTreeMap<String, Entry>,
    /// Matrices with a norm weight folded into their columns ([`layout::folded`]), made on
    /// first use by [`Self::bytes`] (the CPU reference's weights): a cell per matrix, which is
    /// folded with one norm weight (named in its cell). A schedule's writer and uploads read
    /// them through [`Self::made_bytes`] instead, which keeps nothing.
    folded: Derived<(String, Result<Vec<u8>, String>)>,
    /// Norm weights' ones ([`layout::ones`]), made on first use.
    ones: Derived<Vec<u8>>,
}

impl std::fmt::Debug for TensorStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorStore")
            .field("source", &self.source)
            .field("files", &self.shards.len())
            .field("tensors", &self.index.len())
            .finish()
    }
}

/// Maps `path` read-only.
fn map_file(path: &Path) -> R<Mmap> {
    // A folder opens on Linux and then fails to map with "No such device".
    if path.is_dir() {
        let e = std::io::Error::other("it is a folder, not a safetensors file");
        return Err(ImportError::io(path)(e));
    }
    let file = File::open(path).map_err(ImportError::io(path))?;
    // SAFETY: the map is read-only and lives inside the TensorStore. Mapping a file is unsafe
    // only because another process could modify or truncate it while mapped; vkfuse never
    // writes a checkpoint, and a model directory must not be rewritten while it is being
    // compiled (the same contract as the `safetensors` Python loader's mmap).
    unsafe { Mmap::map(&file) }.map_err(ImportError::io(path))
}

/// The `safetensors` crate's limit on a header's length (its `MAX_HEADER_SIZE`, private).
const MAX_HEADER_LEN: u64 = 100_000_000;

/// Why `read_metadata` refused `bytes`: a file shorter than its header declares is reported as
/// truncated (the crate's "invalid header length" and "incomplete metadata" do not say so);
/// anything else in the crate's words.
fn bad_safetensors(file: &Path, bytes: &[u8], error: SafeTensorError) -> ImportError {
    let actual = bytes.len() as u64;
    let truncated = |expected, at_least| ImportError::TruncatedSafetensors {
        file: file.to_path_buf(),
        expected,
        actual,
        at_least,
    };
    let mut header = None;
    if let Some(&n) = bytes.first_chunk::<8>() {
        let header_len = u64::from_le_bytes(n);
        let header_end = header_len.saturating_add(8);
        // Past the crate's own header limit the length is garbage, not a cut file.
        if header_end > actual && header_len <= MAX_HEADER_LEN {
            return truncated(header_end, true);
        }
        header = usize::try_from(header_end)
            .ok()
            .and_then(|end| bytes.get(8..end));
        // A header that parses but whose offsets pass the end is read as a cut file too.
        let data_end = header
            .and_then(|h| serde_json::from_slice::<Metadata>(h).ok())
            .and_then(|m| m.tensors().values().map(|t| t.data_offsets.1).max())
            .map(|end| header_end.saturating_add(end as u64));
        if let Some(expected) = data_end.filter(|&end| end > actual) {
            return truncated(expected, false);
        }
    }
    ImportError::BadSafetensors {
        file: file.to_path_buf(),
        message: match header.and_then(bad_entry) {
            Some(why) => format!("{why} ({error})"),
            None => error.to_string(),
        },
    }
}

/// What is wrong with a safetensors `header` (JSON) that the crate refused, naming the tensor:
/// the first entry, by name (so that the message does not depend on the header's hash order),
/// that does not parse (an unknown dtype, a missing field) or whose offsets are reversed or
/// span other than its shape's bytes; else the first place, in data order, where the entries
/// leave a gap or overlap. The crate's own refusal names no tensor for the first kind and only
/// "invalid offset" for the second (and its `Metadata` does not parse such a header, so each
/// entry is read on its own).
fn bad_entry(header: &[u8]) -> Option<String> {
    let json: BTreeMap<String, serde_json::Value> = serde_json::from_slice(header).ok()?;
    let mut spans = vec![];
    for (name, entry) in json {
        // The header's free-form string map, no tensor.
        if name == "__metadata__" {
            continue;
        }
        let t: safetensors::tensor::TensorInfo = match serde_json::from_value(entry) {
            Ok(t) => t,
            Err(e) => return Some(format!("tensor \"{name}\": {e}")),
        };
        let (begin, end) = t.data_offsets;
        if end < begin {
            return Some(format!(
                "tensor \"{name}\": data_offsets [{begin}, {end}] are reversed"
            ));
        }
        let bits = t
            .shape
            .iter()
            .try_fold(t.dtype.bitsize(), |acc, &d| acc.checked_mul(d));
        if let Some(bits) = bits.filter(|b| b % 8 == 0 && b / 8 != end - begin) {
            return Some(format!(
                "tensor \"{name}\": shape {:?} of {} is {} bytes, but its data_offsets \
                 [{begin}, {end}] span {}",
                t.shape,
                t.dtype,
                bits / 8,
                end - begin
            ));
        }
        spans.push((begin, end, name));
    }
    // The entries must tile the data from byte 0, one after another.
    spans.sort();
    let mut at = 0;
    let mut previous: Option<&str> = None;
    for (begin, end, name) in &spans {
        if *begin != at {
            return Some(match previous {
                None => format!(
                    "tensor \"{name}\" starts at byte {begin} of the data, but the first \
                     tensor must start at 0"
                ),
                Some(p) if *begin > at => format!(
                    "tensor \"{name}\" starts at byte {begin} of the data, but \"{p}\" ends at \
                     {at}: {} bytes between them belong to no tensor",
                    begin - at
                ),
                Some(p) => format!(
                    "tensor \"{name}\" starts at byte {begin} of the data, inside \"{p}\", \
                     which ends at {at}"
                ),
            });
        }
        at = *end;
        previous = Some(name);
    }
    None
}

fn readable(dtype: Dtype) -> Option<DType> {
    match dtype {
        Dtype::F32 => Some(DType::F32),
        Dtype::F16 => Some(DType::F16),
        Dtype::BF16 => Some(DType::BF16),
        _ => None,
    }
}

impl TensorStore {
    /// Opens the safetensors files of the model directory `dir` (see the module doc).
    pub fn open(dir: &Path) -> R<TensorStore> {
        let single = dir.join("model.safetensors");
        if single.is_file() {
            return TensorStore::from_files(single.clone(), &[single]);
        }
        let index = dir.join("model.safetensors.index.json");
        if index.is_file() {
            return TensorStore::from_index(dir, &index);
        }
        let entries = std::fs::read_dir(dir).map_err(ImportError::io(dir))?;
        let mut files = Vec::new();
        // Weight files of formats vkfuse does not read, named in the error if nothing else is.
        let mut others = Vec::new();
        for entry in entries {
            let path = entry.map_err(ImportError::io(dir))?.path();
            match path.extension().and_then(|e| e.to_str()) {
                Some("safetensors") => files.push(path),
                Some("bin" | "pt" | "pth" | "ckpt" | "gguf") => {
                    if let Some(name) = path.file_name() {
                        others.push(name.to_string_lossy().into_owned());
                    }
                }
                _ => {}
            }
        }
        if files.is_empty() {
            others.sort();
            return Err(ImportError::NoWeights {
                dir: dir.to_path_buf(),
                others,
            });
        }
        files.sort();
        TensorStore::from_files(dir.to_path_buf(), &files)
    }

    /// Opens the shards named by an index, checking that each tensor is where it says.
    fn from_index(dir: &Path, index: &Path) -> R<TensorStore> {
        let text = std::fs::read_to_string(index).map_err(ImportError::io(index))?;
        let root: Value = serde_json::from_str(&text).map_err(|e| ImportError::json(index, &e))?;
        let bad = |message: String| ImportError::BadField {
            file: index.to_path_buf(),
            field: "weight_map".into(),
            message,
        };
        let Some(map) = root.get("weight_map") else {
            return Err(bad(
                "missing; expected an object from tensor name to shard file".into(),
            ));
        };
        let Some(map) = map.as_object() else {
            return Err(bad(format!(
                "expected an object from tensor name to shard file, found {}",
                show(map)
            )));
        };
        let mut wanted: BTreeMap<&str, &str> = BTreeMap::new();
        for (tensor, shard) in map {
            let Some(shard) = shard.as_str() else {
                return Err(bad(format!(
                    "\"{tensor}\": expected a shard file name, found {}",
                    show(shard)
                )));
            };
            wanted.insert(tensor, shard);
        }
        let mut shard_names: Vec<&str> = wanted.values().copied().collect();
        shard_names.sort_unstable();
        shard_names.dedup();
        let mut files = Vec::with_capacity(shard_names.len());
        for shard in shard_names {
            let path = dir.join(shard);
            if !path.is_file() {
                return Err(ImportError::MissingShard {
                    index: index.to_path_buf(),
                    shard: shard.to_string(),
                    path,
                });
            }
            files.push(path);
        }
        let store = TensorStore::from_files(index.to_path_buf(), &files)?;
        for (tensor, shard) in wanted {
            let path = dir.join(shard);
            let found = store.index.get(tensor).map(|e| &store.shards[e.shard].path);
            if found != Some(&path) {
                let actual = match found {
                    Some(p) => format!("it is in {}", p.display()),
                    None => "no shard has it".to_string(),
                };
                return Err(ImportError::Inconsistent {
                    file: index.to_path_buf(),
                    message: format!(
                        "weight_map puts tensor \"{tensor}\" in \"{shard}\", but {actual}"
                    ),
                });
            }
        }
        Ok(store)
    }

    /// Maps and indexes `files`; `source` is what [`ImportError::MissingTensor`] names.
    pub fn from_files(source: PathBuf, files: &[PathBuf]) -> R<TensorStore> {
        let mut store = TensorStore {
            source,
            shards: Vec::with_capacity(files.len()),
            index: BTreeMap::new(),
            folded: Derived::default(),
            ones: Derived::default(),
        };
        for path in files {
            let map = map_file(path)?;
            let shard = store.shards.len();
            let (header_len, metadata) =
                SafeTensors::read_metadata(&map).map_err(|e| bad_safetensors(path, &map, e))?;
            // read_metadata has checked that the offsets tile the data section exactly.
            let data_start = 8 + header_len;
            let mut tensors: Vec<_> = metadata.tensors().into_iter().collect();
            tensors.sort_by(|a, b| a.0.cmp(&b.0));
            for (name, info) in tensors {
                if let Some(first) = store.index.get(&name) {
                    return Err(ImportError::DuplicateTensor {
                        tensor: name,
                        first: store.shards[first.shard].path.clone(),
                        second: path.clone(),
                    });
                }
                let (begin, end) = info.data_offsets;
                let data = data_start + begin..data_start + end;
                let numel = info.shape.iter().product();
                let kind = match readable(info.dtype) {
                    Some(dtype) => EntryKind::Readable(TensorInfo {
                        name: name.clone(),
                        dtype,
                        shape: info.shape.clone(),
                        file: path.clone(),
                    }),
                    None => EntryKind::Unreadable {
                        dtype: info.dtype.to_string(),
                        numel,
                    },
                };
                store.index.insert(name, Entry { shard, data, kind });
            }
            store.shards.push(Shard {
                path: path.clone(),
                map,
            });
        }
        // The readable tensors of `rank` dimensions.
        let of_rank = |rank: usize| -> Vec<String> {
            store
                .index
                .iter()
                .filter(|(_, e)| matches!(&e.kind, EntryKind::Readable(i) if i.shape.len() == rank))
                .map(|(n, _)| n.clone())
                .collect()
        };
        let (matrices, vectors) = (of_rank(2), of_rank(1));
        store.folded = Derived::new(matrices.iter().map(String::as_str));
        store.ones = Derived::new(vectors.iter().map(String::as_str));
        Ok(store)
    }

    /// The checkpoint's entry point (model.safetensors, the index, or the directory).
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// The safetensors files, in load order.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().map(|s| s.path.as_path())
    }

    /// Every tensor name in the checkpoint, sorted, including those of unreadable dtypes.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The tensor's description; `None` if it is absent or of an unreadable dtype.
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.entry(name).ok().map(|(_, info)| info)
    }

    /// Whether the checkpoint has a tensor of this name (of any dtype).
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// The entry and its readable info, or the error that names why not.
    fn entry(&self, name: &str) -> R<(&Entry, &TensorInfo)> {
        // A folded matrix is its matrix's shape and dtype, checked against its norm weight's;
        // ones are their norm weight's (their bytes: `bytes`).
        if !self.index.contains_key(name) {
            if let Some((matrix, norm)) = layout::folded_of(name) {
                let (entry, info) = self.entry(matrix)?;
                let (_, n) = self.entry(norm)?;
                if info.shape.len() != 2 || n.shape != [info.shape[1]] || info.dtype.is_quantized()
                {
                    return Err(ImportError::Inconsistent {
                        file: info.file.clone(),
                        message: format!(
                            "tensor \"{matrix}\" {} of {:?} cannot fold norm weight \"{norm}\" of {:?}",
                            info.dtype, info.shape, n.shape
                        ),
                    });
                }
                return Ok((entry, info));
            }
            if let Some(norm) = layout::ones_of(name) {
                return self.entry(norm);
            }
        }
        let Some(entry) = self.index.get(name) else {
            return Err(ImportError::MissingTensor {
                file: self.source.clone(),
                tensor: name.to_string(),
            });
        };
        match &entry.kind {
            EntryKind::Readable(info) => Ok((entry, info)),
            EntryKind::Unreadable { dtype, .. } => Err(ImportError::UnsupportedDtype {
                file: self.shards[entry.shard].path.clone(),
                tensor: name.to_string(),
                dtype: dtype.clone(),
            }),
        }
    }

    /// The tensor, checked to be present, readable and of `shape`.
    pub fn expect(&self, name: &str, shape: &[usize]) -> R<&TensorInfo> {
        // A folded matrix's own shape first: a matrix of the wrong shape is that, not a matrix
        // that cannot fold its norm weight.
        if let Some((matrix, _)) = layout::folded_of(name) {
            if !self.index.contains_key(name) {
                self.expect(matrix, shape)?;
            }
        }
        let (_, info) = self.entry(name)?;
        if info.shape != shape {
            // A derived name (a norm's ones) has its source's shape: the error names that
            // tensor, not the compiler's name for what it makes of it.
            return Err(ImportError::WrongShape {
                file: info.file.clone(),
                tensor: layout::sources(name)[0].to_string(),
                found: info.shape.clone(),
                expected: shape.to_vec(),
            });
        }
        Ok(info)
    }

    /// The tensor's raw little-endian bytes, borrowed from the memory map; a folded matrix's
    /// ([`layout::folded`]) and a norm weight's ones ([`layout::ones`]) made once and kept. A
    /// transposed matrix ([`layout::transposed`]) is [`Self::made_bytes`]'s only.
    pub fn bytes(&self, name: &str) -> R<&[u8]> {
        if !self.index.contains_key(name) {
            if let Some((matrix, norm)) = layout::folded_of(name) {
                return self.fold(name, matrix, norm);
            }
            if let Some(norm) = layout::ones_of(name) {
                let (_, info) = self.entry(norm)?;
                let make = || layout::ones_bytes(info.dtype, info.numel());
                return self
                    .ones
                    .made(norm, make)
                    .map(Vec::as_slice)
                    .ok_or_else(|| ImportError::Inconsistent {
                        file: info.file.clone(),
                        message: format!(
                            "tensor \"{norm}\" of shape {:?} is no vector",
                            info.shape
                        ),
                    });
            }
        }
        let (entry, info) = self.entry(name)?;
        self.shards[entry.shard]
            .map
            .get(entry.data.clone())
            .ok_or_else(|| ImportError::BadSafetensors {
                file: info.file.clone(),
                message: format!("tensor \"{name}\" lies outside the file"),
            })
    }

    /// The bytes of `name`, matrix `matrix` with norm weight `norm` folded into its columns
    /// ([`layout::folded`]).
    fn fold(&self, name: &str, matrix: &str, norm: &str) -> R<&[u8]> {
        let (_, info) = self.entry(name)?;
        let make = || self.fold_columns(info, matrix, norm);
        let inconsistent = |message| ImportError::Inconsistent {
            file: info.file.clone(),
            message,
        };
        match self.folded.made(matrix, || (norm.to_string(), make())) {
            Some((with, _)) if with != norm => Err(inconsistent(format!(
                "tensor \"{matrix}\" is folded with \"{with}\" already, not also with \"{norm}\""
            ))),
            Some((_, made)) => made
                .as_deref()
                .map_err(|m| inconsistent(format!("tensor \"{matrix}\" folded: {m}"))),
            None => Err(inconsistent(format!(
                "tensor \"{matrix}\" is no matrix to fold"
            ))),
        }
    }

    /// Matrix `matrix` (described by `info`) with norm weight `norm` folded into its columns,
    /// or why not.
    fn fold_columns(&self, info: &TensorInfo, matrix: &str, norm: &str) -> Result<Vec<u8>, String> {
        let scale = self.to_f32(norm).map_err(|e| e.to_string())?;
        let bytes = self.bytes(matrix).map_err(|e| e.to_string())?;
        layout::fold_columns(bytes, info.dtype, info.shape[0], info.shape[1], &scale)
    }

    /// The bytes of a name the store computes, a matrix transposed or folded with a norm
    /// weight ([`super::layout`]), made now and not kept: what a schedule's writer and uploads
    /// read (`TensorBytes`), one tensor at a time, so that compiling a model holds none of its
    /// transposed or folded matrices past their write. `None` for every other name (the
    /// checkpoint's own tensors, borrowed; the norms' ones, kept by [`Self::bytes`]).
    pub fn made_bytes(&self, name: &str) -> Option<R<Vec<u8>>> {
        if self.index.contains_key(name) {
            return None;
        }
        if let Some(of) = layout::transposed_of(name) {
            return Some(self.transposed(of));
        }
        let (matrix, norm) = layout::folded_of(name)?;
        Some(self.entry(name).and_then(|(_, info)| {
            self.fold_columns(info, matrix, norm)
                .map_err(|m| ImportError::Inconsistent {
                    file: info.file.clone(),
                    message: format!("tensor \"{matrix}\" folded: {m}"),
                })
        }))
    }

    /// How many bytes [`Self::made_bytes`] or [`Self::bytes`] give for `name`, from its
    /// description (nothing made; a transposed name checked to be a matrix's).
    pub fn byte_len(&self, name: &str) -> R<u64> {
        if let Some(of) = layout::transposed_of(name).filter(|_| !self.index.contains_key(name)) {
            let info = self.matrix(of)?;
            let (rows, cols) = (info.shape[0], info.shape[1]);
            return Ok(layout::transposed_bytes(info.dtype, rows, cols) as u64);
        }
        let info = self.entry(name)?.1;
        Ok(info.dtype.row_bytes(info.numel()) as u64)
    }

    /// Matrix `of`'s description, refused where it has no transposed layout.
    fn matrix(&self, of: &str) -> R<&TensorInfo> {
        let (_, info) = self.entry(of)?;
        if info.shape.len() != 2 {
            return Err(ImportError::Inconsistent {
                file: info.file.clone(),
                message: format!(
                    "tensor \"{of}\" of shape {:?} has no transposed layout (not a matrix)",
                    info.shape
                ),
            });
        }
        Ok(info)
    }

    /// Matrix `of`'s bytes transposed ([`super::layout`]).
    fn transposed(&self, of: &str) -> R<Vec<u8>> {
        let info = self.matrix(of)?;
        layout::transpose(self.bytes(of)?, info.dtype, info.shape[0], info.shape[1]).map_err(
            |message| ImportError::BadSafetensors {
                file: info.file.clone(),
                message: format!("tensor \"{of}\" transposed: {message}"),
            },
        )
    }

    /// The tensor's values widened to f32 (row-major).
    pub fn to_f32(&self, name: &str) -> R<Vec<f32>> {
        let (_, info) = self.entry(name)?;
        let bytes = self.bytes(name)?;
        let values = match info.dtype {
            DType::F32 | DType::F16 | DType::BF16 => crate::quant::blocks::decode(
                info.dtype,
                bytes,
                info.shape.last().copied().unwrap_or(1),
            ),
            // Not produced by `readable`; kept total rather than panicking.
            DType::I32 | DType::Q8_0 | DType::Q4_0 => {
                return Err(ImportError::UnsupportedDtype {
                    file: info.file.clone(),
                    tensor: name.to_string(),
                    dtype: info.dtype.name().to_uppercase(),
                })
            }
        };
        Ok(values)
    }

    /// Bytes of tensor data in all files (headers excluded), unreadable dtypes included.
    pub fn total_bytes(&self) -> usize {
        self.index
            .values()
            .fold(0usize, |sum, e| sum.saturating_add(e.data.len()))
    }

    /// Elements in all tensors, unreadable dtypes included.
    pub fn total_params(&self) -> usize {
        self.index.values().fold(0usize, |sum, e| {
            sum.saturating_add(match &e.kind {
                EntryKind::Readable(info) => info.numel(),
                EntryKind::Unreadable { numel, .. } => *numel,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A safetensors file of one 2x2 F32 tensor: an 8-byte length, the JSON header, 16 bytes.
    fn one_tensor() -> Vec<u8> {
        let header = br#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}"#;
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header);
        b.extend_from_slice(&[0; 16]);
        b
    }

    fn refusal(bytes: &[u8]) -> String {
        let error = SafeTensors::read_metadata(bytes).map(|_| ()).unwrap_err();
        bad_safetensors(Path::new("m.safetensors"), bytes, error).to_string()
    }

    /// Two tensors of 16 bytes each with the given header entries for "b" (the bad one).
    fn with_entry(b: &str) -> Vec<u8> {
        let header =
            format!(r#"{{"a":{{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}},"b":{b}}}"#);
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(&[0; 32]);
        bytes
    }

    /// A bad header entry is named by its tensor, with what is wrong with it in numbers.
    #[test]
    fn a_bad_entry_is_named_by_its_tensor() {
        for (entry, why) in [
            (
                r#"{"dtype":"F32","shape":[2,3],"data_offsets":[16,32]}"#,
                r#"tensor "b": shape [2, 3] of F32 is 24 bytes, but its data_offsets [16, 32] span 16"#,
            ),
            (
                r#"{"dtype":"I8","shape":[2,2],"data_offsets":[16,32]}"#,
                r#"tensor "b": shape [2, 2] of I8 is 4 bytes, but its data_offsets [16, 32] span 16"#,
            ),
            (
                r#"{"dtype":"F32","shape":[2,2],"data_offsets":[32,16]}"#,
                r#"tensor "b": data_offsets [32, 16] are reversed"#,
            ),
        ] {
            let bytes = with_entry(entry);
            let message = refusal(&bytes);
            assert!(message.contains(why), "{entry}: {message}");
        }
        // A good file has no bad entry.
        let good = with_entry(r#"{"dtype":"F32","shape":[2,2],"data_offsets":[16,32]}"#);
        assert!(SafeTensors::read_metadata(&good).is_ok());
    }

    /// An entry that does not parse, or offsets that leave a gap or overlap, are named by the
    /// tensors concerned (the crate says "invalid offset for tensor" or only where the JSON
    /// failed).
    #[test]
    fn a_bad_dtype_a_gap_or_an_overlap_is_named_by_its_tensors() {
        for (entry, why) in [
            (
                r#"{"dtype":"F99","shape":[2,2],"data_offsets":[16,32]}"#,
                r#"tensor "b": unknown variant `F99`"#,
            ),
            (
                r#"{"dtype":"F32","shape":[2,2]}"#,
                r#"tensor "b": missing field `data_offsets`"#,
            ),
            (
                r#"{"dtype":"F32","shape":[2],"data_offsets":[24,32]}"#,
                r#"tensor "b" starts at byte 24 of the data, but "a" ends at 16: 8 bytes between them belong to no tensor"#,
            ),
            (
                r#"{"dtype":"F32","shape":[2,2],"data_offsets":[8,24]}"#,
                r#"tensor "b" starts at byte 8 of the data, inside "a", which ends at 16"#,
            ),
        ] {
            let message = refusal(&with_entry(entry));
            assert!(message.contains(why), "{entry}: {message}");
        }
        // The first tensor starts past 0 (the crate reads this one too).
        let header = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}"#;
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(&[0; 16]);
        let message = refusal(&bytes);
        assert!(
            message.contains(
                r#"tensor "a" starts at byte 8 of the data, but the first tensor must start at 0"#
            ),
            "{message}"
        );
        // The header's own string map is no tensor.
        let header = r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(&[0; 16]);
        assert!(SafeTensors::read_metadata(&bytes).is_ok());
        assert_eq!(bad_entry(header.as_bytes()), None);
    }

    #[test]
    fn a_cut_file_is_reported_as_truncated_with_both_sizes() {
        let whole = one_tensor();
        assert!(SafeTensors::read_metadata(&whole).is_ok());
        let n = whole.len();
        // Cut in the data, then in the header.
        assert_eq!(
            refusal(&whole[..n - 5]),
            format!(
                "m.safetensors is truncated: its header declares {n} bytes, the file has {}",
                n - 5
            )
        );
        assert_eq!(
            refusal(&whole[..20]),
            format!(
                "m.safetensors is truncated: its header declares at least {} bytes, the file has 20",
                n - 16
            )
        );
    }

    #[test]
    fn other_refusals_keep_the_crate_message() {
        // Too long is not truncated; a garbage length is not a cut header.
        let mut long = one_tensor();
        long.push(0);
        let msg = refusal(&long);
        assert!(
            msg.starts_with("m.safetensors: not a valid safetensors file: "),
            "{msg}"
        );
        let mut garbage = one_tensor();
        garbage[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        let msg = refusal(&garbage);
        assert!(
            msg.starts_with("m.safetensors: not a valid safetensors file: "),
            "{msg}"
        );
        assert!(refusal(&[1, 2, 3]).contains("not a valid safetensors file"));
    }
}
