//! ggml's block formats q8_0 and q4_0 (32 weights per block, an f16 scale `d` each), with
//! ggml's arithmetic (`quantize_row_q8_0_ref`, `quantize_row_q4_0_ref`, `dequantize_row_*` in
//! ggml-quants.c), and the row layout vkfuse stores them in.
//!
//! q8_0: `d = max|x| / 127`, code `round(x / d)` (as ggml: `x · (1/d)`, rounded half away from
//! zero), weight = code · d.
//! q4_0: `max` is the value of largest magnitude (its sign kept), `d = max / -8`, code
//! `min(15, trunc(x · (1/d) + 8.5))`, weight = (code − 8) · d.
//! The scale is computed in f32 and stored in f16 (round to nearest even); the weights are
//! rebuilt from the stored f16.
//!
//! Row layout (docs/schedule-format.md): a row of `cols` weights (a multiple of 32) is its
//! codes (q8_0: one signed byte per weight; q4_0: 16 bytes per block in [`q4_0_stored`]'s
//! order), then its f16 scales in block order, then zeros up to [`DType::row_bytes`] (a
//! multiple of 16), so every row of a matrix starts 16-byte aligned for the kernels' uvec4
//! loads.

use crate::ir::DType;
use half::{bf16, f16};

/// Weights per block.
pub const BLOCK: usize = DType::BLOCK;

/// One q8_0 block: the scale and 32 signed codes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; BLOCK],
}

/// One q4_0 block: the scale and 16 bytes of two 4-bit codes each (element j low, j + 16 high).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; BLOCK / 2],
}

/// ggml's `quantize_row_q8_0_ref` for one block.
pub fn quantize_q8_0(x: &[f32; BLOCK]) -> BlockQ8_0 {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; BLOCK];
    for (q, v) in qs.iter_mut().zip(x) {
        // |v · id| <= 127 up to rounding; `as` saturates the rest.
        *q = (v * id).round() as i8;
    }
    BlockQ8_0 {
        d: f16::from_f32(d),
        qs,
    }
}

/// ggml's `quantize_row_q4_0_ref` for one block.
pub fn quantize_q4_0(x: &[f32; BLOCK]) -> BlockQ4_0 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    // ggml: MIN(15, (int8_t)(x·id + 8.5f)); the cast truncates toward zero.
    let code = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
    let mut qs = [0u8; BLOCK / 2];
    for (j, q) in qs.iter_mut().enumerate() {
        *q = code(x[j]) | (code(x[j + BLOCK / 2]) << 4);
    }
    BlockQ4_0 {
        d: f16::from_f32(d),
        qs,
    }
}

/// A q4_0 block's 16 code bytes as vkfuse stores them: word k (bytes 4k .. 4k + 3) holds
/// elements 8k .. 8k + 3 in its low nibbles and 8k + 4 .. 8k + 7 in its high ones, so that a
/// kernel's step of 8 weights (one word) meets 8 consecutive inputs, as a step of q8_0 or of a
/// 16-bit float does (the input's vec4s 2c and 2c + 1 for step c). In ggml's `qs` order
/// (element j low, j + 16 high) word k meets inputs 4k .. 4k + 3 and 16 + 4k .. 16 + 4k + 3,
/// and on an H100 q4_0 decoded 1.1% slower so (docs/perf.md, session 28). The same codes and
/// scale as ggml's: only their order differs.
pub fn q4_0_stored(b: &BlockQ4_0) -> [u8; BLOCK / 2] {
    let code = |e: usize| {
        if e < BLOCK / 2 {
            b.qs[e] & 15
        } else {
            b.qs[e - BLOCK / 2] >> 4
        }
    };
    std::array::from_fn(|j| {
        let e = 8 * (j / 4) + j % 4;
        code(e) | (code(e + 4) << 4)
    })
}

/// The inverse of [`q4_0_stored`]: ggml's block from the stored codes and scale.
pub fn q4_0_from_stored(d: f16, stored: &[u8; BLOCK / 2]) -> BlockQ4_0 {
    let code = |e: usize| {
        let byte = stored[4 * (e / 8) + e % 4];
        if e % 8 < 4 {
            byte & 15
        } else {
            byte >> 4
        }
    };
    BlockQ4_0 {
        d,
        qs: std::array::from_fn(|j| code(j) | (code(j + BLOCK / 2) << 4)),
    }
}

/// ggml's `dequantize_row_q8_0` for one block.
pub fn dequantize_q8_0(b: &BlockQ8_0) -> [f32; BLOCK] {
    let d = b.d.to_f32();
    b.qs.map(|q| f32::from(q) * d)
}

/// ggml's `dequantize_row_q4_0` for one block.
pub fn dequantize_q4_0(b: &BlockQ4_0) -> [f32; BLOCK] {
    let d = b.d.to_f32();
    let mut y = [0.0f32; BLOCK];
    for (j, q) in b.qs.iter().enumerate() {
        y[j] = (i32::from(q & 15) - 8) as f32 * d;
        y[j + BLOCK / 2] = (i32::from(q >> 4) - 8) as f32 * d;
    }
    y
}

/// Appends `x` (one row, or rows of `cols` one after the other) in `dtype`'s layout: element
/// dtypes little-endian, block formats as the module doc says. Block formats need `cols` to be
/// a multiple of [`BLOCK`]; `x.len()` is a multiple of `cols`.
pub fn encode(dtype: DType, x: &[f32], cols: usize, out: &mut Vec<u8>) {
    // Rows are independent: a large tensor's are encoded on every core (converting a model
    // of tens of GB to a block format is most of its compile).
    let parts = in_parallel(x, cols, |rows| {
        let mut part = Vec::new();
        encode_rows(dtype, rows, cols, &mut part);
        part
    });
    for part in parts {
        if out.is_empty() {
            *out = part;
        } else {
            out.extend_from_slice(&part);
        }
    }
}

/// Values at which [`encode`] and [`decode`] split a tensor's rows over threads.
const PARALLEL_VALUES: usize = 1 << 20;

/// `f` of consecutive runs of whole rows of `cols` items of `items`, on as many threads as the
/// machine has cores where `items` is large (one run otherwise), in order.
fn in_parallel<T: Sync, R: Send>(items: &[T], cols: usize, f: impl Fn(&[T]) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rows = items.len() / cols.max(1);
    if items.len() < PARALLEL_VALUES || threads < 2 || rows < 2 || cols == 0 {
        return vec![f(items)];
    }
    let run = rows.div_ceil(threads) * cols;
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .chunks(run)
            .map(|chunk| s.spawn(|| f(chunk)))
            .collect();
        handles
            .into_iter()
            // A panicking run panics here as it would have on one thread.
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

fn encode_rows(dtype: DType, x: &[f32], cols: usize, out: &mut Vec<u8>) {
    match dtype {
        DType::F32 => out.extend(x.iter().flat_map(|v| v.to_le_bytes())),
        DType::F16 => out.extend(x.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes())),
        DType::BF16 => out.extend(x.iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes())),
        DType::I32 => unreachable!("weights are never i32"),
        DType::Q8_0 | DType::Q4_0 => {
            assert!(cols.is_multiple_of(BLOCK), "{dtype} rows are whole blocks");
            for row in x.chunks_exact(cols) {
                encode_row(dtype, row, out);
            }
        }
    }
}

fn encode_row(dtype: DType, row: &[f32], out: &mut Vec<u8>) {
    let start = out.len();
    let mut scales = Vec::with_capacity(row.len() / BLOCK);
    for block in row.chunks_exact(BLOCK) {
        let block: &[f32; BLOCK] = block.try_into().expect("chunks of BLOCK");
        if dtype == DType::Q8_0 {
            let b = quantize_q8_0(block);
            out.extend(b.qs.iter().map(|q| *q as u8));
            scales.push(b.d);
        } else {
            let b = quantize_q4_0(block);
            out.extend_from_slice(&q4_0_stored(&b));
            scales.push(b.d);
        }
    }
    out.extend(scales.iter().flat_map(|d| d.to_le_bytes()));
    out.resize(start + dtype.row_bytes(row.len()), 0);
}

/// The values `bytes` holds in `dtype`'s layout, rows of `cols` (the inverse of [`encode`] for
/// element dtypes; ggml's dequantisation for the block formats).
pub fn decode(dtype: DType, bytes: &[u8], cols: usize) -> Vec<f32> {
    // Split at whole rows (a block format's are its row bytes; an element's, its bytes).
    let row = match dtype {
        DType::Q8_0 | DType::Q4_0 => dtype.row_bytes(cols),
        _ => dtype.size(),
    };
    let parts = in_parallel(bytes, row, |rows| decode_rows(dtype, rows, cols));
    match <[Vec<f32>; 1]>::try_from(parts) {
        Ok([one]) => one,
        Err(parts) => parts.concat(),
    }
}

fn decode_rows(dtype: DType, bytes: &[u8], cols: usize) -> Vec<f32> {
    match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        DType::I32 => unreachable!("weights are never i32"),
        DType::Q8_0 | DType::Q4_0 => {
            let mut y = Vec::with_capacity(bytes.len());
            for row in bytes.chunks_exact(dtype.row_bytes(cols)) {
                let blocks = cols / BLOCK;
                let code_bytes = cols * dtype.quant_bits().expect("a block format") / 8;
                let per_block = code_bytes / blocks.max(1);
                for b in 0..blocks {
                    let at = code_bytes + 2 * b;
                    let d = f16::from_le_bytes([row[at], row[at + 1]]);
                    let codes = &row[b * per_block..(b + 1) * per_block];
                    let values = if dtype == DType::Q8_0 {
                        let mut qs = [0i8; BLOCK];
                        for (q, c) in qs.iter_mut().zip(codes) {
                            *q = *c as i8;
                        }
                        dequantize_q8_0(&BlockQ8_0 { d, qs })
                    } else {
                        let stored: &[u8; BLOCK / 2] = codes.try_into().expect("16 bytes a block");
                        dequantize_q4_0(&q4_0_from_stored(d, stored))
                    };
                    y.extend_from_slice(&values);
                }
            }
            y
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tensor large enough to be split over threads encodes and decodes to the bytes and
    /// values of one run over all its rows, in every format, appended after what `out` held
    /// (on a machine of one core both take the one run: then this only checks the append).
    #[test]
    fn large_tensors_split_over_threads_give_one_run_s_bytes() {
        let (rows, cols) = (PARALLEL_VALUES / 64 + 3, 128);
        let x: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0)
            .collect();
        for dtype in [
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::Q8_0,
            DType::Q4_0,
        ] {
            let mut one = vec![7u8];
            encode_rows(dtype, &x, cols, &mut one);
            let mut split = vec![7u8];
            encode(dtype, &x, cols, &mut split);
            assert!(split == one, "{dtype}: encoded differently");
            assert!(
                decode(dtype, &split[1..], cols) == decode_rows(dtype, &one[1..], cols),
                "{dtype}: decoded differently"
            );
        }
    }
}
