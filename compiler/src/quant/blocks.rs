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
