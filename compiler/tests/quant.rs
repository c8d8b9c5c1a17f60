//! The q8_0 / q4_0 quantiser against a direct transcription of ggml's reference formulas
//! (`quantize_row_q8_0_ref`, `quantize_row_q4_0_ref` in ggml-quants.c), the error bounds those
//! formulas promise, hand-computed codes, and the row layout the kernels read.

use half::f16;
use proptest::prelude::*;
use vkfuse_compiler::ir::{DType, Type};
use vkfuse_compiler::quant::blocks::{self, BLOCK};

/// ggml's q8_0 for one block, transcribed from the C: (d as stored, codes).
fn ggml_q8_0(x: &[f32]) -> (f16, Vec<i8>) {
    let mut amax = 0.0f32;
    for v in x {
        amax = amax.max(v.abs());
    }
    let d = amax / ((1 << 7) - 1) as f32;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (
        f16::from_f32(d),
        x.iter().map(|v| (v * id).round() as i8).collect(),
    )
}

/// ggml's q4_0 for one block, transcribed from the C: (d as stored, the 32 codes 0..=15).
fn ggml_q4_0(x: &[f32]) -> (f16, Vec<u8>) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let codes = x
        .iter()
        .map(|v| {
            let c = (v * id + 8.5) as i8; // C's (int8_t) conversion truncates
            c.min(15) as u8
        })
        .collect();
    (f16::from_f32(d), codes)
}

fn block(v: &[f32]) -> [f32; BLOCK] {
    v.try_into().expect("32 values")
}

/// Blocks of values of magnitudes spread over many octaves (and some exact zeros).
fn values() -> impl Strategy<Value = Vec<f32>> {
    (
        prop::collection::vec(-1.0f32..1.0, BLOCK),
        -12i32..6,
        any::<bool>(),
    )
        .prop_map(|(v, e, zeros)| {
            let s = 2f32.powi(e);
            v.into_iter()
                .enumerate()
                .map(|(i, x)| if zeros && i % 5 == 0 { 0.0 } else { x * s })
                .collect()
        })
}

proptest! {
    #[test]
    fn q8_0_codes_are_ggmls_and_the_error_is_at_most_half_a_step(x in values()) {
        let b = blocks::quantize_q8_0(&block(&x));
        let (d, codes) = ggml_q8_0(&x);
        prop_assert_eq!(b.d.to_bits(), d.to_bits());
        prop_assert_eq!(b.qs.to_vec(), codes.clone());
        let deq = blocks::dequantize_q8_0(&b);
        // The codes are round(x/d) with d in f32; the weights use d rounded to f16.
        let d32 = x.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
        let d16 = d.to_f64();
        for i in 0..BLOCK {
            let bound = d32 / 2.0 + (codes[i] as f64).abs() * (d32 - d16).abs();
            let err = (x[i] as f64 - deq[i] as f64).abs();
            prop_assert!(err <= bound * (1.0 + 1e-4) + 1e-30, "element {}: |{} - {}| = {} > {}", i, x[i], deq[i], err, bound);
        }
    }

    #[test]
    fn q4_0_codes_are_ggmls_and_the_error_is_at_most_a_step(x in values()) {
        let b = blocks::quantize_q4_0(&block(&x));
        let (d, codes) = ggml_q4_0(&x);
        prop_assert_eq!(b.d.to_bits(), d.to_bits());
        for j in 0..BLOCK / 2 {
            prop_assert_eq!(b.qs[j] & 15, codes[j], "low nibble {}", j);
            prop_assert_eq!(b.qs[j] >> 4, codes[j + 16], "high nibble {}", j);
        }
        let deq = blocks::dequantize_q4_0(&b);
        let max = x.iter().fold(0.0f32, |m, v| if v.abs() > m.abs() { *v } else { m });
        let d32 = (max as f64 / -8.0).abs();
        let d16 = d.to_f64().abs();
        for i in 0..BLOCK {
            let bound = d32 + 8.0 * (d32 - d16).abs();
            let err = (x[i] as f64 - deq[i] as f64).abs();
            prop_assert!(err <= bound * (1.0 + 1e-4) + 1e-30, "element {}: |{} - {}| = {} > {}", i, x[i], deq[i], err, bound);
        }
    }

    #[test]
    fn rows_decode_to_the_blocks_dequantised(
        fmt in prop_oneof![Just(DType::Q8_0), Just(DType::Q4_0)],
        rows in 1usize..4,
        blocks_per_row in 1usize..5,
        seed in prop::collection::vec(-2.0f32..2.0, 4 * 4 * BLOCK),
    ) {
        let cols = blocks_per_row * BLOCK;
        let x = &seed[..rows * cols];
        let mut bytes = vec![];
        blocks::encode(fmt, x, cols, &mut bytes);
        prop_assert_eq!(bytes.len(), Type::new(fmt, [rows, cols]).bytes());
        prop_assert_eq!(bytes.len() % (16 * rows), 0, "rows are 16-byte multiples");
        let want: Vec<f32> = x
            .chunks_exact(BLOCK)
            .flat_map(|b| match fmt {
                DType::Q8_0 => blocks::dequantize_q8_0(&blocks::quantize_q8_0(&block(b))),
                _ => blocks::dequantize_q4_0(&blocks::quantize_q4_0(&block(b))),
            })
            .collect();
        prop_assert_eq!(blocks::decode(fmt, &bytes, cols), want);
    }
}

#[test]
fn hand_computed_codes() {
    let mut x = [0.0f32; BLOCK];
    x[..4].copy_from_slice(&[-1.0, 0.5, 1.0, 0.25]);
    x[16] = -0.5;
    // q8_0: d = 1/127; 0.5·127 = 63.5 rounds away from zero to 64; 0.25·127 = 31.75 -> 32.
    let b = blocks::quantize_q8_0(&x);
    assert_eq!(b.d, f16::from_f32(1.0 / 127.0));
    assert_eq!(&b.qs[..4], &[-127, 64, 127, 32]);
    assert_eq!(b.qs[16], -64);
    // q4_0: the first value of largest magnitude is -1 (1.0 does not replace it), d = 0.125;
    // codes trunc(x·8 + 8.5): -1 -> 0, 0.5 -> 12, 1 -> 16 clamped to 15, 0.25 -> 10, 0 -> 8,
    // -0.5 -> 4 (element 16: the high nibble of byte 0).
    let b = blocks::quantize_q4_0(&x);
    assert_eq!(b.d, f16::from_f32(0.125));
    assert_eq!(b.qs[0], 4 << 4);
    assert_eq!(&b.qs[1..4], &[8 << 4 | 12, 8 << 4 | 15, 8 << 4 | 10]);
    assert_eq!(b.qs[4], 8 << 4 | 8);
    let deq = blocks::dequantize_q4_0(&b);
    assert_eq!(&deq[..4], &[-1.0, 0.5, 0.875, 0.25]);
    assert_eq!(deq[16], -0.5);
    // All zeros: d = 0, codes 0 (q8_0) and 8 (q4_0), weights 0.
    let z = [0.0f32; BLOCK];
    assert_eq!(blocks::quantize_q8_0(&z).qs, [0; BLOCK]);
    assert_eq!(blocks::quantize_q4_0(&z).qs, [0x88; BLOCK / 2]);
    assert_eq!(blocks::dequantize_q4_0(&blocks::quantize_q4_0(&z)), z);
}

#[test]
fn row_layout_is_codes_then_scales_then_padding() {
    let x: Vec<f32> = (0..2 * BLOCK).map(|i| i as f32 - 20.0).collect();
    for (fmt, code_bytes, row_bytes) in [(DType::Q8_0, 64, 80), (DType::Q4_0, 32, 48)] {
        assert_eq!(fmt.row_bytes(2 * BLOCK), row_bytes);
        let mut bytes = vec![];
        blocks::encode(fmt, &x, 2 * BLOCK, &mut bytes);
        assert_eq!(bytes.len(), row_bytes);
        let d0 = f16::from_le_bytes([bytes[code_bytes], bytes[code_bytes + 1]]);
        let d1 = f16::from_le_bytes([bytes[code_bytes + 2], bytes[code_bytes + 3]]);
        let (want0, want1) = match fmt {
            DType::Q8_0 => (ggml_q8_0(&x[..32]).0, ggml_q8_0(&x[32..]).0),
            _ => (ggml_q4_0(&x[..32]).0, ggml_q4_0(&x[32..]).0),
        };
        assert_eq!((d0, d1), (want0, want1), "{fmt}: scales after the codes");
        assert!(
            bytes[code_bytes + 4..].iter().all(|b| *b == 0),
            "{fmt}: zero padding"
        );
        if fmt == DType::Q8_0 {
            let codes: Vec<i8> = bytes[..32].iter().map(|b| *b as i8).collect();
            assert_eq!(codes, ggml_q8_0(&x[..32]).1);
        } else {
            // ggml's codes, in vkfuse's order: word k of a block holds elements 8k .. 8k + 3
            // low and 8k + 4 .. 8k + 7 high (a kernel step's 8 consecutive inputs).
            for b in 0..2 {
                let codes = ggml_q4_0(&x[32 * b..32 * b + 32]).1;
                for j in 0..16 {
                    let e = 8 * (j / 4) + j % 4;
                    let byte = bytes[16 * b + j];
                    assert_eq!(byte & 15, codes[e], "block {b} byte {j} low: element {e}");
                    assert_eq!(byte >> 4, codes[e + 4], "block {b} byte {j} high");
                }
            }
        }
    }
    // Qwen3-0.6B's rows need no padding.
    assert_eq!(DType::Q8_0.row_bytes(1024), 1024 + 64);
    assert_eq!(DType::Q4_0.row_bytes(3072), 1536 + 192);
}

#[test]
fn q4_0_words_hold_eight_consecutive_weights() {
    // Codes (7e + e / 16) % 16: neighbours, and elements 4, 8 and 16 apart, all differ, so any
    // other order of the nibbles (ggml's element j / j + 16 among them) changes some byte.
    let x: [f32; BLOCK] = std::array::from_fn(|e| ((7 * e + e / 16) % 16) as f32 - 8.0);
    let (_, codes) = ggml_q4_0(&x);
    assert_eq!(
        codes[..4],
        [0, 7, 14, 5],
        "the block's scale is 1: codes are x + 8"
    );
    let mut bytes = vec![];
    blocks::encode(DType::Q4_0, &x, BLOCK, &mut bytes);
    for k in 0..4 {
        let word = &bytes[4 * k..4 * k + 4];
        let low: Vec<u8> = word.iter().map(|b| b & 15).collect();
        let high: Vec<u8> = word.iter().map(|b| b >> 4).collect();
        assert_eq!(
            low,
            codes[8 * k..8 * k + 4],
            "word {k}: elements 8k .. 8k + 3 low"
        );
        assert_eq!(
            high,
            codes[8 * k + 4..8 * k + 8],
            "word {k}: 8k + 4 .. 8k + 7 high"
        );
    }
}

#[test]
fn only_matvec_and_embedding_read_block_quantised_values() {
    use vkfuse_compiler::ir::{OpKind, Program, Shape};
    let mut p = Program::new();
    let w = p
        .push(
            OpKind::Weight { name: "w".into() },
            vec![],
            Some(Type::new(DType::Q8_0, [4, 64])),
        )
        .unwrap()
        .unwrap();
    let reshape = OpKind::Reshape {
        shape: Shape::new([8, 32]),
    };
    assert!(p.value(reshape, vec![w]).is_err(), "reshape of q8_0 rows");
    let slice = OpKind::Slice {
        axis: 1,
        start: 0,
        end: 32,
    };
    assert!(p.value(slice, vec![w]).is_err(), "slice of q8_0 rows");
    // Rows must be whole blocks.
    let bad = p.push(
        OpKind::Weight { name: "v".into() },
        vec![],
        Some(Type::new(DType::Q4_0, [4, 48])),
    );
    assert!(bad.is_err(), "q4_0 rows of 48");
}
