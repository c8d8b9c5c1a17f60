// ggml's block-quantised weights (q8_0, q4_0) as vkfuse lays them out: the dequantising loads
// of the matvec inner loops and of the embedding gather.
//
// A matrix is rows of q_row_bytes each (docs/schedule-format.md): the row's codes, then its
// f16 scales (one per block of 32 weights), then zeros up to a multiple of 16 bytes, so every
// row starts 16-byte aligned.
//   q8_0: code i of the row is the signed byte i; weight i = code · d[i / 32].
//   q4_0: block b is 16 bytes; word k of it (bytes 4k .. 4k + 3) holds elements
//         32b + 8k .. + 3 in its low nibbles and 32b + 8k + 4 .. + 7 in its high ones (ggml's
//         codes, not in ggml's qs order: quant::blocks::q4_0_stored says why);
//         weight = (nibble - 8) · d[b].
// The includer defines the dtype codes (common.glsl) and names the dtype in the macro
// arguments; `cols` (the row length) is a multiple of 32. Guarded: persistent regions include
// several matvec bodies in one shader.
#ifndef VKFUSE_QUANT_GLSL
#define VKFUSE_QUANT_GLSL

// Bytes of a row's codes, and of a whole row (codes, scales, padding to 16 bytes).
uint q_code_bytes(uint dt, uint cols) {
    return dt == Q8_0 ? cols : cols / 2u;
}
uint q_row_bytes(uint dt, uint cols) {
    return (q_code_bytes(dt, cols) + cols / 16u + 15u) & ~15u;
}

// The four bytes of a word as the floats 2^23 + byte: each byte put in the low mantissa bits
// of 2^23 (one byte permute each where the compiler sees it) and no int-to-float conversion,
// which NVIDIA runs at a fraction of the float rate; the codes below subtract 2^23 and their
// offset exactly (q4_0 +1.5% on the H100, q8_0 +0.2%: docs/perf.md, session 23).
vec4 q_magic_bytes(uint w) {
    return uintBitsToFloat(uvec4(w & 0xFFu, (w >> 8) & 0xFFu, (w >> 16) & 0xFFu, w >> 24) |
                           0x4B000000u);
}

// A code word readied for q_magic_bytes (Q8_READY: byte ^ 0x80 is code + 128; Q4_LOW_BYTES,
// Q4_HIGH_BYTES: a q4_0 word's low and high nibbles as bytes), and what is then subtracted to
// leave the codes: 2^23 + 128 and 2^23 + 8. In two halves so that a kernel can ready its words
// before its input arrives and subtract after (fused_chain.glsl's PRE_SPLIT); macros, so that
// the code is the same as written out.
#define Q8_READY(w) ((w) ^ 0x80808080u)
#define Q4_LOW_BYTES(w) ((w) & 0x0F0F0F0Fu)
#define Q4_HIGH_BYTES(w) (((w) >> 4) & 0x0F0F0F0Fu)
#define Q8_MAGIC_OFF 8388736.0
#define Q4_MAGIC_OFF 8388616.0

// The four signed bytes of a word, as floats (byte 0 first).
vec4 q8_codes(uint w) {
    return q_magic_bytes(Q8_READY(w)) - Q8_MAGIC_OFF;
}

// Low and high nibbles of the four bytes of a word, minus 8.
vec4 q4_low(uint w) {
    return q_magic_bytes(Q4_LOW_BYTES(w)) - Q4_MAGIC_OFF;
}
vec4 q4_high(uint w) {
    return q_magic_bytes(Q4_HIGH_BYTES(w)) - Q4_MAGIC_OFF;
}

// The matvec loops take 8 weights of a row per invocation and step, as the 16-bit dtypes do
// (a 1024-wide row is 128 steps: one per invocation of a 128-wide workgroup): step c is
// elements 8c .. 8c + 7, two words of q8_0 codes or one word of q4_0 codes (its low nibbles,
// then its high ones), all of block c/4, and meets the input's vec4s 2c and 2c + 1.
// Neighbouring invocations read neighbouring words, so a subgroup's loads coalesce.
// (One uvec4 of codes per step, 16 or 32 weights, measured slower on the H200: a quarter of
// the invocations per row, each with 4x the arithmetic; docs/perf.md.)

// The dot of step c's codes (the row's codes start at word `aw` of the uint array A) with
// the inputs xa, xb, before the block's scale.
#define Q_STEP_DOT(dt, A, aw, c, xa, xb) \
    ((dt) == Q8_0 \
         ? dot(q8_codes(A[(aw) + 2u * (c)]), xa) + dot(q8_codes(A[(aw) + 2u * (c) + 1u]), xb) \
         : dot(q4_low(A[(aw) + (c)]), xa) + dot(q4_high(A[(aw) + (c)]), xb))

// q4_0's codes in the linear form: each nibble n as f = 0.5 + n / 256 exactly (the byte, which
// must be below 128, in bits 16..22 of 0.5's pattern: one permute), so that n - 8 = 256 (f -
// 17/32) and a weight is one multiply-add with no subtraction: step c's dot is 256 (Σ f·x -
// 17/32 Σ x), Σ x (sx, the sum of xa and xb) once per step for every row that meets it.
// Q4_LIN_STEP_DOT is the bracket. It pays only where many rows share sx: lm_head's 8 rows per
// step, +0.74% on the H100 (docs/perf.md, session 31); with the 2 rows of the chain's dots it
// lost 0.8%, in q/k/v 0.46% (session 25 found the same before the hops shrank). It also rounds
// worse: the bracket's terms are ~0.53 |x| where their difference is ~|n - 8| / 256 |x|, so a
// row's sum loses ~4 bits to cancellation (a CPU model of lm_head's sums: worst relative error
// 2e-4 against 8.5e-6), harmless for an argmax but for near-ties; in q/k/v on qwen3-next it
// missed fused-vs-eager's 1e-4.
vec4 q_lin_bytes(uint w) {
    return uintBitsToFloat(uvec4((w << 16) & 0xFF0000u, (w << 8) & 0xFF0000u, w & 0xFF0000u,
                                 (w >> 8) & 0xFF0000u) |
                           0x3F000000u);
}
#define Q4_LIN_STEP_DOT(A, aw, c, xa, xb, sx) \
    (dot(q_lin_bytes(Q4_LOW_BYTES(A[(aw) + (c)])), xa) + \
     dot(q_lin_bytes(Q4_HIGH_BYTES(A[(aw) + (c)])), xb) - 0.53125 * (sx))

// Scale b from the word that holds the f16 scales b & ~1 and b | 1 (two blocks of a row, or
// the transposed layout's blocks of two rows).
#define Q_SCALE_HALF(word, b) unpackHalf2x16(word)[(b) & 1u]
// The f16 scale of block b of the row whose codes start at byte `row_at` (A: uint array).
#define Q_SCALE(dt, A, row_at, cols, b) \
    Q_SCALE_HALF(A[((row_at) + q_code_bytes(dt, cols)) / 4u + (b) / 2u], b)

// Byte of the row holding element i's code (q4_0: the high nibble where i % 8 >= 4).
uint q_byte(uint dt, uint i) {
    return dt == Q8_0 ? i : 16u * (i / 32u) + 4u * ((i & 31u) / 8u) + (i & 3u);
}

// The code of element i from the word holding it, as a float (q4_0: minus 8).
float q_code(uint dt, uint word, uint byte_in_word, bool high) {
    if (dt == Q8_0) {
        return float(bitfieldExtract(int(word), int(8u * byte_in_word), 8));
    }
    return float((word >> (8u * byte_in_word + (high ? 4u : 0u))) & 15u) - 8.0;
}

// Element i of row `row` (A: uint array of rows of `cols`), dequantised.
#define Q_LOAD(dt, A, row, i, cols) \
    (q_code(dt, A[((row) * q_row_bytes(dt, cols) + q_byte(dt, i)) / 4u], \
            q_byte(dt, i) & 3u, dt == Q4_0 && ((i) & 4u) != 0u) * \
     Q_SCALE(dt, A, (row) * q_row_bytes(dt, cols), cols, (i) / 32u))

#endif
