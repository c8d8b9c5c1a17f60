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
/// they are the same every time).
#[derive(Default)]
pub struct Derived {
    cells: HashMap<String, OnceLock<Result<Vec<u8>, String>>>,
}

impl Derived {
    /// Room for the transposed layout of each of `sources`.
    pub fn new<'a>(sources: impl IntoIterator<Item = &'a str>) -> Derived {
        Derived {
            cells: sources
                .into_iter()
                .map(|s| (s.to_string(), OnceLock::new()))
                .collect(),
        }
    }

    /// Source `of`'s transposed bytes, computed by `make` the first time; None where `of` is
    /// not one of the sources.
    pub fn transposed(
        &self,
        of: &str,
        make: impl FnOnce() -> Result<Vec<u8>, String>,
    ) -> Option<Result<&[u8], String>> {
        let cell = self.cells.get(of)?;
        Some(cell.get_or_init(make).as_deref().map_err(Clone::clone))
    }
}

impl std::fmt::Debug for Derived {
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
