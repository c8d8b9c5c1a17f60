//! A program's weights in the formats its types say: the checkpoint's bytes where the type is
//! the stored dtype, converted bytes (computed once, at construction) where `convert`
//! retyped the weight.

use std::borrow::Borrow;
use std::collections::HashMap;

use crate::import::layout::{self, Derived};
use crate::import::{ImportError, TensorStore};
use crate::ir::{DType, OpKind, Program};
use crate::reference::WeightSource;
use vkfuse_runtime::session::TensorBytes;

use super::blocks;

/// The weights of one program, by tensor name, over a checkpoint it owns (`S = TensorStore`,
/// for executors that keep their weights source) or borrows (`S = &TensorStore`).
pub struct EncodedWeights<S: Borrow<TensorStore>> {
    store: S,
    /// Converted tensors: dtype, row length and bytes.
    converted: HashMap<String, (DType, usize, Vec<u8>)>,
    /// Converted matrices in other layouts, made on first use (`import::layout`).
    derived: Derived,
}

impl<S: Borrow<TensorStore>> std::fmt::Debug for EncodedWeights<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncodedWeights")
            .field("store", self.store.borrow())
            .field("converted", &self.converted.len())
            .finish()
    }
}

impl<S: Borrow<TensorStore>> EncodedWeights<S> {
    /// Converts every `weight` of `program` whose type differs from the checkpoint's dtype.
    pub fn new(store: S, program: &Program) -> Result<Self, ImportError> {
        let mut converted = HashMap::new();
        let tensors: &TensorStore = store.borrow();
        for op in &program.ops {
            let OpKind::Weight { name } = &op.kind else {
                continue;
            };
            let ty = program.ty(op.result.expect("weights have a result"));
            let stored = tensors.expect(name, ty.shape.dims())?.dtype;
            if stored == ty.dtype || converted.contains_key(name) {
                continue;
            }
            // A folded matrix from its f32 products, not from the store's bytes (rounded to
            // the checkpoint's dtype): one rounding, the conversion's.
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
            converted.insert(name.clone(), (ty.dtype, ty.shape.last(), bytes));
        }
        let derived = Derived::new(converted.keys().map(String::as_str));
        Ok(EncodedWeights {
            store,
            converted,
            derived,
        })
    }
}

impl<S: Borrow<TensorStore>> TensorBytes for EncodedWeights<S> {
    fn tensor_bytes(&self, tensor: &str) -> Result<&[u8], String> {
        if let Some((_, _, bytes)) = self.converted.get(tensor) {
            return Ok(bytes);
        }
        // A converted matrix transposed (others: the checkpoint's bytes transposed, which the
        // store makes); the block formats by whole blocks, the same weights.
        if let Some((of, (dtype, cols, bytes))) =
            layout::transposed_of(tensor).and_then(|of| Some((of, self.converted.get(of)?)))
        {
            let rows = bytes.len() / dtype.row_bytes(*cols).max(1);
            let make = || layout::transpose(bytes, *dtype, rows, *cols);
            if let Some(made) = self.derived.transposed(of, make) {
                return made.map_err(|m| format!("tensor \"{of}\" transposed: {m}"));
            }
        }
        self.store.borrow().tensor_bytes(tensor)
    }
}

impl<S: Borrow<TensorStore>> WeightSource for EncodedWeights<S> {
    /// Converted weights dequantised (or widened) from the very bytes the device gets.
    fn f32(&self, name: &str) -> Result<Vec<f32>, ImportError> {
        match self.converted.get(name) {
            Some((dtype, cols, bytes)) => Ok(blocks::decode(*dtype, bytes, *cols)),
            None => self.store.borrow().to_f32(name),
        }
    }
}
