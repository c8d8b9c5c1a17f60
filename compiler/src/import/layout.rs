//! Weights in a layout other than the checkpoint's. A fused kernel that reads a matrix better
//! transposed (the chained MLP's down projection, `fuse::codegen::ChainSpec`) names a derived
//! tensor in its upload, [`transposed`]`(name)`; the weights' sources ([`super::TensorStore`],
//! `quant::EncodedWeights`) compute its bytes on first use and keep them. A schedule file stores
//! the derived bytes under that name, so the runtime never transforms anything.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::ir::DType;

/// What a derived tensor's name adds to its source's (no checkpoint tensor is named so; one
/// that were would shadow the derived tensor, being looked up first).
const TRANSPOSED: &str = "#transposed";

/// The name of matrix `tensor` stored transposed.
pub fn transposed(tensor: &str) -> String {
    format!("{tensor}{TRANSPOSED}")
}

/// The matrix a derived name transposes, if it is one.
pub fn transposed_of(name: &str) -> Option<&str> {
    name.strip_suffix(TRANSPOSED)
}

/// What a folded matrix's name adds to its matrix's, before the norm weight's name.
const FOLDED: &str = "#times:";
/// What a norm weight of ones adds to the norm weight's name.
const ONES: &str = "#ones";

/// The name of matrix `tensor` with its columns multiplied by the norm weight `norm`
/// (`TraceOptions::fold_norms`): `W · diag(norm)`, so that `W (norm ⊙ x̂) = folded x̂`.
pub fn folded(tensor: &str, norm: &str) -> String {
    format!("{tensor}{FOLDED}{norm}")
}

/// The matrix and the norm weight a derived name folds, if it is one.
pub fn folded_of(name: &str) -> Option<(&str, &str)> {
    name.split_once(FOLDED)
}

/// The name of a vector of ones shaped and typed as norm weight `norm` (what a norm whose
/// weight was folded into its matrices is left with).
pub fn ones(norm: &str) -> String {
    format!("{norm}{ONES}")
}

/// The norm weight a derived vector of ones stands for, if it is one.
pub fn ones_of(name: &str) -> Option<&str> {
    name.strip_suffix(ONES)
}

/// The checkpoint tensors a name is made from: itself where it derives from none, else the
/// sources of what [`transposed`], [`folded`] or [`ones`] made it from.
pub fn sources(name: &str) -> Vec<&str> {
    if let Some(of) = transposed_of(name) {
        sources(of)
    } else if let Some((matrix, norm)) = folded_of(name) {
        [sources(matrix), sources(norm)].concat()
    } else if let Some(norm) = ones_of(name) {
        sources(norm)
    } else {
        vec![name]
    }
}

/// Row-major `[rows, cols]` matrix `bytes` of element dtype `dtype` with column c multiplied
/// by `scale[c]`, rounded back to `dtype`; or why not (the block formats are encoded from the
/// folded values later, as any converted weight is).
pub fn fold_columns(
    bytes: &[u8],
    dtype: DType,
    rows: usize,
    cols: usize,
    scale: &[f32],
) -> Result<Vec<u8>, String> {
    if dtype.is_quantized() || dtype == DType::I32 {
        return Err(format!(
            "a {dtype} matrix cannot be folded (float matrices only)"
        ));
    }
    if scale.len() != cols
        || rows
            .checked_mul(cols)
            .and_then(|n| n.checked_mul(dtype.size()))
            != Some(bytes.len())
    {
        return Err(format!(
            "{} bytes of {dtype} and {} scales are no [{rows}, {cols}] matrix and its columns' norm",
            bytes.len(),
            scale.len()
        ));
    }
    if bytes.is_empty() {
        return Ok(vec![]);
    }
    let mut values = crate::quant::blocks::decode(dtype, bytes, cols);
    fold_values(&mut values, scale);
    let mut out = Vec::with_capacity(bytes.len());
    crate::quant::blocks::encode(dtype, &values, cols, &mut out);
    Ok(out)
}

/// Row-major `values` (rows of `scale.len()`) with column c multiplied by `scale[c]`, in f32:
/// what a folded matrix converted to another format is encoded from, rounded once
/// (`quant::EncodedWeights`).
pub fn fold_values(values: &mut [f32], scale: &[f32]) {
    if scale.is_empty() {
        return;
    }
    for row in values.chunks_exact_mut(scale.len()) {
        for (v, s) in row.iter_mut().zip(scale) {
            *v *= s;
        }
    }
}

/// Bytes of `n` ones of element dtype `dtype`.
pub fn ones_bytes(dtype: DType, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * dtype.size());
    crate::quant::blocks::encode(dtype, &vec![1.0; n], n.max(1), &mut out);
    out
}

/// Bytes of matrix `[rows, cols]` of `dtype` transposed: the same elements; for the block
/// formats [`transpose`]'s rows of blocks, padded as rows are.
pub fn transposed_bytes(dtype: DType, rows: usize, cols: usize) -> usize {
    if dtype.is_quantized() {
        cols / DType::BLOCK * dtype.row_bytes(rows * DType::BLOCK)
    } else {
        rows * cols * dtype.size()
    }
}

/// The bytes of a row-major `[rows, cols]` matrix of `dtype` in `[cols, rows]` order, or why
/// not. Element dtypes move element by element. The block formats move whole blocks, so that
/// the weights are the very ones the untransposed matrix holds (same blocks, same scales):
/// block b of source row r becomes block r of row b, each row in vkfuse's layout (the codes of
/// its blocks, then their scales, padded to 16 bytes), except that q8_0's 32-byte codes are
/// split in halves: the first 16 bytes of every block, then the second ones. Row b then holds
/// every output row's weights for inputs 32b .. 32b + 32: what one workgroup of the chained
/// kernel reads, each invocation one output row's block in 16-byte loads that neighbouring
/// invocations make contiguous.
pub fn transpose(bytes: &[u8], dtype: DType, rows: usize, cols: usize) -> Result<Vec<u8>, String> {
    let shape = || {
        format!(
            "{} bytes are no [{rows}, {cols}] matrix of {dtype}",
            bytes.len()
        )
    };
    if let Some(bits) = dtype.quant_bits() {
        let row = dtype.row_bytes(cols);
        if !cols.is_multiple_of(DType::BLOCK) || rows.checked_mul(row) != Some(bytes.len()) {
            return Err(shape());
        }
        let (blocks, codes) = (cols / DType::BLOCK, DType::BLOCK * bits / 8);
        let out_row = dtype.row_bytes(rows * DType::BLOCK);
        let mut out = vec![0u8; blocks * out_row];
        for (r, src) in bytes.chunks_exact(row).enumerate() {
            for b in 0..blocks {
                let dst = &mut out[b * out_row..][..out_row];
                // 16-byte pieces: q4_0's one, q8_0's two (half h of every block together).
                for (h, piece) in src[b * codes..][..codes].chunks_exact(16).enumerate() {
                    dst[(h * rows + r) * 16..][..16].copy_from_slice(piece);
                }
                let (from, to) = (blocks * codes + 2 * b, rows * codes + 2 * r);
                dst[to..to + 2].copy_from_slice(&src[from..from + 2]);
            }
        }
        return Ok(out);
    }
    let elem = dtype.size();
    if rows.checked_mul(cols).and_then(|n| n.checked_mul(elem)) != Some(bytes.len()) {
        return Err(shape());
    }
    let mut out = vec![0u8; bytes.len()];
    for (r, row) in bytes.chunks_exact(cols * elem).enumerate() {
        for (c, e) in row.chunks_exact(elem).enumerate() {
            let at = (c * rows + r) * elem;
            out[at..at + elem].copy_from_slice(e);
        }
    }
    Ok(out)
}

/// Derived tensors of a fixed set of sources, each computed once on first use (errors too:
/// they are the same every time). A cell holds `T`: what a kind of derived tensor keeps
/// (`TensorStore`'s folds and ones; what a schedule's writer reads is made for it and not kept).
pub struct Derived<T> {
    cells: HashMap<String, OnceLock<T>>,
}

impl<T> Default for Derived<T> {
    fn default() -> Self {
        Derived {
            cells: HashMap::new(),
        }
    }
}

impl<T> Derived<T> {
    /// Room for one derived tensor of each of `sources`.
    pub fn new<'a>(sources: impl IntoIterator<Item = &'a str>) -> Self {
        Derived {
            cells: sources
                .into_iter()
                .map(|s| (s.to_string(), OnceLock::new()))
                .collect(),
        }
    }

    /// Source `of`'s cell, filled by `make` the first time; None where `of` is not one of the
    /// sources.
    pub fn made(&self, of: &str, make: impl FnOnce() -> T) -> Option<&T> {
        Some(self.cells.get(of)?.get_or_init(make))
    }
}

impl<T> std::fmt::Debug for Derived<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let made = self.cells.values().filter(|c| c.get().is_some()).count();
        write!(f, "Derived({made} of {} made)", self.cells.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_round_trip() {
        let n = transposed("model.layers.0.mlp.down_proj.weight");
        assert_eq!(
            transposed_of(&n),
            Some("model.layers.0.mlp.down_proj.weight")
        );
        assert_eq!(transposed_of("model.layers.0.mlp.down_proj.weight"), None);
        let (q, norm) = (
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.input_layernorm.weight",
        );
        assert_eq!(folded_of(&folded(q, norm)), Some((q, norm)));
        assert_eq!(folded_of(q), None);
        assert_eq!(ones_of(&ones(norm)), Some(norm));
        assert_eq!(ones_of(norm), None);
    }

    #[test]
    fn fold_columns_scales_each_column_and_refuses_what_it_cannot_fold() {
        // [[1, 2, 3], [4, 5, 6]] · diag(10, 100, 1000), in f32 (exact).
        let m: Vec<u8> = [1f32, 2., 3., 4., 5., 6.]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let got = fold_columns(&m, DType::F32, 2, 3, &[10., 100., 1000.]).unwrap();
        let got: Vec<f32> = got
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(got, [10., 200., 3000., 40., 500., 6000.]);
        // bf16 rounds the products back to bf16.
        let m: Vec<u8> = [1f32, 1.]
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect();
        let got = fold_columns(&m, DType::BF16, 1, 2, &[1.0 / 3.0, 3.0]).unwrap();
        assert_eq!(got[..2], half::bf16::from_f32(1.0 / 3.0).to_le_bytes());
        assert!(fold_columns(&m, DType::BF16, 1, 2, &[1.0]).is_err());
        assert!(fold_columns(&m, DType::BF16, 2, 2, &[1.0, 1.0]).is_err());
        assert!(fold_columns(&[0; 36], DType::Q8_0, 1, 32, &[1.0; 32]).is_err());
        // A matrix of no columns (or rows) folds to itself.
        assert_eq!(fold_columns(&[], DType::F32, 3, 0, &[]), Ok(vec![]));
        assert_eq!(fold_columns(&[], DType::F32, 0, 2, &[1.0, 2.0]), Ok(vec![]));
        assert_eq!(
            ones_bytes(DType::F32, 2),
            [1f32.to_le_bytes(), 1f32.to_le_bytes()].concat()
        );
    }

    #[test]
    fn wrong_sizes_are_refused() {
        assert!(transpose(&[0; 36], DType::Q8_0, 1, 32).is_err());
        assert!(transpose(&[0; 48], DType::Q8_0, 1, 48).is_err());
        assert!(transpose(&[0; 6], DType::BF16, 2, 2).is_err());
    }

    proptest! {
        // Element (r, c) of the source is element (c, r) of the result, whatever its width.
        #[test]
        fn transpose_moves_every_element(rows in 1usize..9, cols in 1usize..9, wide in any::<bool>()) {
            let (dtype, elem) = if wide { (DType::F32, 4) } else { (DType::BF16, 2) };
            let bytes: Vec<u8> = (0..rows * cols * elem).map(|i| (i * 7 + i / 251) as u8).collect();
            let t = transpose(&bytes, dtype, rows, cols).unwrap();
            for r in 0..rows {
                for c in 0..cols {
                    let src = &bytes[(r * cols + c) * elem..][..elem];
                    let dst = &t[(c * rows + r) * elem..][..elem];
                    prop_assert_eq!(src, dst);
                }
            }
        }

        // The block formats: dequantising the transposed blocks gives the transposed values
        // of the source's own blocks (weights, not a new quantisation), rows of 1 to 5 blocks.
        #[test]
        fn blocks_keep_their_weights(rows in 1usize..7, blocks in 1usize..6, q4 in any::<bool>()) {
            use crate::quant::blocks::{decode, encode};
            let dtype = if q4 { DType::Q4_0 } else { DType::Q8_0 };
            let cols = blocks * DType::BLOCK;
            let v: Vec<f32> = (0..rows * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
            let mut bytes = vec![];
            encode(dtype, &v, cols, &mut bytes);
            let t = transpose(&bytes, dtype, rows, cols).unwrap();
            prop_assert_eq!(t.len(), transposed_bytes(dtype, rows, cols));
            let w = decode(dtype, &bytes, cols);
            // Row b of the result: [rows x 32] weights, output row r's block at r (q8_0's
            // halves put back together first).
            let mut t = t;
            if dtype == DType::Q8_0 {
                let row = dtype.row_bytes(rows * DType::BLOCK);
                for dst in t.chunks_exact_mut(row) {
                    let halves = dst[..rows * 32].to_vec();
                    for r in 0..rows {
                        for h in 0..2 {
                            dst[r * 32 + h * 16..][..16].copy_from_slice(&halves[(h * rows + r) * 16..][..16]);
                        }
                    }
                }
            }
            let wt = decode(dtype, &t, rows * DType::BLOCK);
            for r in 0..rows {
                for c in 0..cols {
                    let (b, i) = (c / DType::BLOCK, c % DType::BLOCK);
                    prop_assert_eq!(w[r * cols + c], wt[b * rows * DType::BLOCK + r * DType::BLOCK + i]);
                }
            }
        }
    }
}
