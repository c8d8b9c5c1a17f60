//! A program's weights in the formats its types say: the checkpoint's bytes where the type is
//! the stored dtype, converted bytes where `convert` retyped the weight, made each time they
//! are read and not kept, so that writing a schedule holds one converted tensor at a time (a
//! Qwen3-Next-80B's experts in q8_0 are ~85 GB).

use std::borrow::{Borrow, Cow};
use std::collections::{HashMap, HashSet};

use crate::import::layout;
use crate::import::{ImportError, TensorInfo, TensorStore};
use crate::ir::{DType, OpKind, Program, Type};
use crate::reference::WeightSource;
use vkfuse_runtime::session::TensorBytes;

use super::blocks;

/// The weights of one program, by tensor name, over a checkpoint it owns (`S = TensorStore`,
/// for executors that keep their weights source) or borrows (`S = &TensorStore`).
pub struct EncodedWeights<S: Borrow<TensorStore>> {
    store: S,
    /// The tensors whose type differs from the checkpoint's dtype: that type (their bytes are
    /// converted as they are read).
    retyped: HashMap<String, Type>,
}

impl<S: Borrow<TensorStore>> std::fmt::Debug for EncodedWeights<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncodedWeights")
            .field("store", self.store.borrow())
            .field("retyped", &self.retyped.len())
            .finish()
    }
}

impl<S: Borrow<TensorStore>> EncodedWeights<S> {
    /// The weights of `program` over `store`: every `weight` whose type differs from the
    /// checkpoint's dtype, and every expert matrix of a `weight_stack` that does, is converted
    /// when read. Checked here, before any is read: every matrix is in the checkpoint with its
    /// shape (in a readable float dtype: `TensorStore::expect`) and every source tensor holds
    /// finite values; a retyped weight's rows are whole blocks where its format needs them
    /// (`Program::verify`).
    pub fn new(store: S, program: &Program) -> Result<Self, ImportError> {
        let mut retyped = HashMap::new();
        let mut checked: HashSet<String> = HashSet::new();
        let tensors: &TensorStore = store.borrow();
        // Every matrix a weight op names: a weight's own, or each expert's of a stack (the
        // stack's uploads name them one by one).
        let matrices: Vec<(String, Type)> = program
            .ops
            .iter()
            .flat_map(|op| {
                let ty = op.result.map(|v| program.ty(v));
                let list: Vec<(String, Type)> = match (&op.kind, ty) {
                    (OpKind::Weight { name }, Some(ty)) => vec![(name.clone(), ty.clone())],
                    (OpKind::WeightStack { pattern, count }, Some(ty)) => {
                        let one = Type::new(ty.dtype, &ty.shape.dims()[1..]);
                        (0..*count)
                            .map(|e| (pattern.replace("{}", &e.to_string()), one.clone()))
                            .collect()
                    }
                    _ => vec![],
                };
                list
            })
            .collect();
        for (name, ty) in &matrices {
            let stored = tensors.expect(name, ty.shape.dims())?.dtype;
            // The checkpoint's own tensors, each once: a derived name's bytes (a transposed or
            // folded copy, which the store makes) hold the same values.
            for source in layout::sources(name) {
                if let Some(info) = tensors
                    .get(source)
                    .filter(|_| checked.insert(source.to_string()))
                {
                    check_finite(source, info, tensors.bytes(source)?)?;
                }
            }
            if stored != ty.dtype {
                retyped.insert(name.clone(), ty.clone());
            }
        }
        Ok(EncodedWeights { store, retyped })
    }

    /// Tensor `name` (retyped to `ty`) converted: a folded matrix from its f32 products, not
    /// from the store's bytes (rounded to the checkpoint's dtype): one rounding, the
    /// conversion's.
    fn convert(&self, name: &str, ty: &Type) -> Result<Vec<u8>, ImportError> {
        let tensors: &TensorStore = self.store.borrow();
        let values = match layout::folded_of(name) {
            Some((matrix, norm)) => {
                let mut values = tensors.to_f32(matrix)?;
                layout::fold_values(&mut values, &tensors.to_f32(norm)?);
                values
            }
            None => tensors.to_f32(name)?,
        };
        let mut bytes = Vec::with_capacity(ty.bytes());
        blocks::encode(ty.dtype, &values, ty.shape.last(), &mut bytes);
        debug_assert_eq!(bytes.len(), ty.bytes());
        Ok(bytes)
    }

    /// The retyped tensor `tensor` names: itself, or the matrix a transposed name derives from
    /// (`import::layout`), with its type and whether it is the transposed one.
    fn retyped_of<'a>(&'a self, tensor: &'a str) -> Option<(&'a str, &'a Type, bool)> {
        if let Some(ty) = self.retyped.get(tensor) {
            return Some((tensor, ty, false));
        }
        let of = layout::transposed_of(tensor)?;
        Some((of, self.retyped.get(of)?, true))
    }
}

/// `Err` naming the first NaN or infinity among `bytes`, `info`'s values as stored: a damaged
/// checkpoint is refused here rather than decoded into garbage tokens. A bit test per element
/// (the exponent all ones), in blocks without an early exit so that it vectorises: cheap
/// beside the conversion and the write.
fn check_finite(name: &str, info: &TensorInfo, bytes: &[u8]) -> Result<(), ImportError> {
    let (width, mask) = match info.dtype {
        DType::F32 => (4, 0x7f80_0000u32),
        DType::F16 => (2, 0x7c00),
        DType::BF16 => (2, 0x7f80),
        _ => return Ok(()),
    };
    let bits = |b: &[u8]| match width {
        4 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        _ => u32::from(u16::from_le_bytes([b[0], b[1]])),
    };
    const BLOCK: usize = 4096;
    for (n, block) in bytes.chunks(BLOCK).enumerate() {
        let any = block
            .chunks_exact(width)
            .fold(false, |acc, b| acc | (bits(b) & mask == mask));
        if !any {
            continue;
        }
        let i = block
            .chunks_exact(width)
            .position(|b| bits(b) & mask == mask)
            .expect("the block has one");
        let b = &block[i * width..(i + 1) * width];
        let value = match info.dtype {
            DType::F32 => f32::from_bits(bits(b)),
            DType::F16 => half::f16::from_bits(bits(b) as u16).to_f32(),
            _ => half::bf16::from_bits(bits(b) as u16).to_f32(),
        };
        return Err(ImportError::NonFinite {
            file: info.file.clone(),
            tensor: name.to_string(),
            index: n * BLOCK / width + i,
            value: value.to_string(),
        });
    }
    Ok(())
}

impl<S: Borrow<TensorStore>> TensorBytes for EncodedWeights<S> {
    fn tensor_bytes(&self, tensor: &str) -> Result<Cow<'_, [u8]>, String> {
        let Some((of, ty, transposed)) = self.retyped_of(tensor) else {
            return self.store.borrow().tensor_bytes(tensor);
        };
        let bytes = self.convert(of, ty).map_err(|e| e.to_string())?;
        if !transposed {
            return Ok(Cow::Owned(bytes));
        }
        // A converted matrix transposed (others: the checkpoint's bytes transposed, which the
        // store makes); the block formats by whole blocks, the same weights.
        let cols = ty.shape.last();
        let rows = bytes.len() / ty.dtype.row_bytes(cols).max(1);
        layout::transpose(&bytes, ty.dtype, rows, cols)
            .map(Cow::Owned)
            .map_err(|m| format!("tensor \"{of}\" transposed: {m}"))
    }

    /// A converted tensor's size from its type (a transposed one's rows padded as
    /// `layout::transpose` pads them), without converting it.
    fn tensor_len(&self, tensor: &str) -> Result<u64, String> {
        match self.retyped_of(tensor) {
            Some((_, ty, false)) => Ok(ty.bytes() as u64),
            Some((_, ty, true)) => {
                let cols = ty.shape.last();
                let rows = ty.shape.numel() / cols.max(1);
                Ok(layout::transposed_bytes(ty.dtype, rows, cols) as u64)
            }
            None => self.store.borrow().tensor_len(tensor),
        }
    }
}

impl<S: Borrow<TensorStore>> WeightSource for EncodedWeights<S> {
    /// Converted weights dequantised (or widened) from the very bytes the device gets.
    fn f32(&self, name: &str) -> Result<Vec<f32>, ImportError> {
        match self.retyped.get(name) {
            Some(ty) => Ok(blocks::decode(
                ty.dtype,
                &self.convert(name, ty)?,
                ty.shape.last(),
            )),
            None => self.store.borrow().to_f32(name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(dtype: DType) -> TensorInfo {
        TensorInfo {
            name: "w".into(),
            dtype,
            shape: vec![3000],
            file: "m.safetensors".into(),
        }
    }

    /// The first non-finite element is named with its index, in every float dtype, past the
    /// first scan block too; finite extremes pass.
    #[test]
    fn the_first_nan_or_infinity_is_named() {
        let n = 3000;
        let enc = |dtype: DType, v: f32| match dtype {
            DType::F32 => v.to_le_bytes().to_vec(),
            DType::F16 => half::f16::from_f32(v).to_le_bytes().to_vec(),
            _ => half::bf16::from_f32(v).to_le_bytes().to_vec(),
        };
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let big = match dtype {
                DType::F16 => 65504.0,
                _ => 3.0e38,
            };
            let mut values = vec![1.0f32; n];
            values[7] = -big;
            values[2999] = big;
            let bytes = |v: &[f32]| v.iter().flat_map(|x| enc(dtype, *x)).collect::<Vec<u8>>();
            assert!(
                check_finite("w", &info(dtype), &bytes(&values)).is_ok(),
                "{dtype:?}"
            );
            for (at, bad) in [
                (2100, f32::NAN),
                (2999, f32::INFINITY),
                (0, f32::NEG_INFINITY),
            ] {
                let mut v = values.clone();
                v[at] = bad;
                v[2999.min(at + 1)] = f32::NAN;
                let err = check_finite("w", &info(dtype), &bytes(&v))
                    .unwrap_err()
                    .to_string();
                assert!(
                    err.contains(&format!("at element {at}:")) && err.contains("\"w\""),
                    "{dtype:?}: {err}"
                );
            }
        }
    }
}
