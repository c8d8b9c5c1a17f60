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

// q8_0's step c (its two code words) of the row whose codes start at word `aw` (even: rows
// start on 16 bytes) of the uint array A. Where the includer names, in Q8_PAIRS before it
// includes this file, a uvec2 view of the binding that holds A (every caller passes the
// weights' array; with Q8_PAIRS, A itself is not read), one 8-byte load: a subgroup's load instruction then spans 256 contiguous bytes
// where two 4-byte loads leave a gap after every word (q8_0 +1.38% on an H200 in the chain and
// the fused matvecs; on the H100 with its bounds checks it had lost 1.1%: docs/perf.md,
// sessions 28 and 58). Else two 4-byte loads.
#ifdef Q8_PAIRS
#define Q8_STEP(A, aw, c) Q8_PAIRS[(aw) / 2u + (c)]
#else
#define Q8_STEP(A, aw, c) uvec2(A[(aw) + 2u * (c)], A[(aw) + 2u * (c) + 1u])
#endif

// The dot of q8_0's step codes s (Q8_STEP) with the inputs xa, xb.
float q8_step_dot(uvec2 s, vec4 xa, vec4 xb) {
    return dot(q8_codes(s.x), xa) + dot(q8_codes(s.y), xb);
}

// The dot of step c's codes (the row's codes start at word `aw` of the uint array A) with
// the inputs xa, xb, before the block's scale.
#define Q_STEP_DOT(dt, A, aw, c, xa, xb) \
    ((dt) == Q8_0 ? q8_step_dot(Q8_STEP(A, aw, c), xa, xb) \
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

// F16_DOTS (`compile-model --dots f16`, the default for q8_0/q4_0: FuseOptions::f16_dots; or one
// part of it as a probe, VKFUSE_DEFINES=F16_MV the fused matvecs, q/k/v and lm_head; F16_CHAIN the
// chain's inner dots and the wide matvec; F16_DOWN the chain's down projection; block formats
// only; on an H200 q8_0 +5.0%, q4_0 +6.2%, docs/perf.md session 38): a step's dot in packed f16
// arithmetic, two weights per instruction. A step's codes become four f16 pairs with no conversion:
// a pair of nibbles (q4_0) or bytes (q8_0) masked into the low mantissa bits of 64 (ulp 1/16) or of
// 4 (ulp 1/256), and the offset subtracted exactly: (n - 8) / 16 and code / 256, both exact in f16.
// The codes come out in the pairs (0, 2), (1, 3), (4, 6), (5, 7) of the step's 8 elements, so the
// input is paired the same way (QH_X). One mask and a subtraction per pair, and one multiply-add
// per pair, where the f32 form takes a permute, a subtraction and a multiply-add per weight. Each
// lane of a step's f16 pair sums 4 products of at most |x| / 2, so it overflows only where |x|
// passes 32768 (x itself past f16's 65504); x is packed before the norm's scale, and where |x| is
// below 2^-14 it is an f16 subnormal and loses bits. Each product is rounded to f16 (relative
// 2^-11), against q8_0's and q4_0's own 2^-8 and 2^-4.
// QH_UNSCALE(dt) undoes the codes' 1/16 or 1/256 once, after the dots.
#ifdef F16_DOTS
#ifndef F16_MV
#define F16_MV 1
#endif
#ifndef F16_CHAIN
#define F16_CHAIN 1
#endif
#ifndef F16_DOWN
#define F16_DOWN 1
#endif
#endif
#if defined(F16_MV) || defined(F16_CHAIN) || defined(F16_DOWN)
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#define QH_UNSCALE(dt) ((dt) == Q8_0 ? 256.0 : 16.0)
// The step's input xa (elements 0-3), xb (4-7) as the f16 pairs its codes meet.
uvec4 QH_X(vec4 xa, vec4 xb) {
    return uvec4(packHalf2x16(xa.xz), packHalf2x16(xa.yw), packHalf2x16(xb.xz),
                 packHalf2x16(xb.yw));
}
// Pair k (0-3) of a step's codes, from the code words w0 (q4_0: the step's word; q8_0: its
// first) and w1 (q8_0: its second). q8_0's byte b is code + 128 after its sign bit flips (the
// xor), in 4's mantissa: 4 + (code + 128) / 256.
f16vec2 qh_pair(uint dt, uint w0, uint w1, uint k) {
    if (dt == Q8_0) {
        uint w = k < 2u ? w0 : w1;
        uint s = (k & 1u) * 8u;
        return unpackFloat2x16(((w >> s) & 0x00FF00FFu) ^ 0x44804480u) - f16vec2(4.5hf);
    }
    // Nibble pairs: the low nibbles of bytes 0 and 2 (elements 0, 2; bits 0-3 of each half) in
    // 64's mantissa, where its ulp is 1/16; their high nibbles (4, 6; bits 4-7) where they
    // already are, in 4's, whose ulp is 1/256 so that bit 4 is 1/16 again; bytes 1 and 3
    // likewise after one shift by 8 (1, 3 and 5, 7). One shift a word, not one a pair.
    uint w = (k & 1u) != 0u ? w0 >> 8 : w0;
    return k < 2u ? unpackFloat2x16((w & 0x000F000Fu) | 0x54005400u) - f16vec2(64.5hf)
                  : unpackFloat2x16((w & 0x00F000F0u) | 0x44004400u) - f16vec2(4.5hf);
}
// Four code pairs times the input pairs xh, as two f16 sums.
f16vec2 qh_dot2(f16vec2 a, f16vec2 b, f16vec2 c, f16vec2 d, uvec4 xh) {
    f16vec2 p = a * unpackFloat2x16(xh.x);
    p = fma(b, unpackFloat2x16(xh.y), p);
    p = fma(c, unpackFloat2x16(xh.z), p);
    return fma(d, unpackFloat2x16(xh.w), p);
}
// The same summed in f32.
float qh_dot(f16vec2 a, f16vec2 b, f16vec2 c, f16vec2 d, uvec4 xh) {
    f16vec2 p = qh_dot2(a, b, c, d, xh);
    return float(p.x) + float(p.y);
}
// The step's dot (codes w0, w1 as in qh_pair) with the input pairs xh, scaled as the codes are.
float qh_step_dot(uint dt, uint w0, uint w1, uvec4 xh) {
    return qh_dot(qh_pair(dt, w0, w1, 0u), qh_pair(dt, w0, w1, 1u), qh_pair(dt, w0, w1, 2u),
                  qh_pair(dt, w0, w1, 3u), xh);
}
f16vec2 qh_step_dot2(uint dt, uint w0, uint w1, uvec4 xh) {
    return qh_dot2(qh_pair(dt, w0, w1, 0u), qh_pair(dt, w0, w1, 1u), qh_pair(dt, w0, w1, 2u),
                   qh_pair(dt, w0, w1, 3u), xh);
}
// The same of q8_0's step codes s (Q8_STEP).
float qh_q8_step_dot(uvec2 s, uvec4 xh) {
    return qh_step_dot(Q8_0, s.x, s.y, xh);
}
f16vec2 qh_q8_step_dot2(uvec2 s, uvec4 xh) {
    return qh_step_dot2(Q8_0, s.x, s.y, xh);
}
// F16_ACC (with F16_MV or F16_CHAIN): each row's steps accumulated in f16 pairs too, one
// multiply-add per step by the block's f16 scale instead of two conversions, an add and a
// multiply-add in f32. The scale is taken times QH_UNSCALE (exact), so the sums are the dots'
// own partials, d · code · x with x still unnormed (the norm's scale comes after the dots):
// they overflow once d |x| passes ~129 (q8_0) or ~2047 (q4_0), and lose bits to f16's
// subnormals once d |x| falls below ~2^-14 (a review's numpy model: 1e-2 relative error at
// |x| ~ 1e-4, against 3.5e-4 without F16_ACC). A probe's range: a default would scale x by
// the norm first. qh_scale2 is block b's scale so, from the word holding it, in both halves.
f16vec2 qh_scale2(uint dt, uint word, uint b) {
    return f16vec2(unpackFloat2x16(word)[b & 1u] * float16_t(QH_UNSCALE(dt)));
}
// Step c of the row whose codes start at word aw of the uint array A, as Q_STEP_DOT reads it.
#define QH_STEP_DOT(dt, A, aw, c, xh) \
    ((dt) == Q8_0 ? qh_q8_step_dot(Q8_STEP(A, aw, c), xh) \
                  : qh_step_dot(Q4_0, A[(aw) + (c)], 0u, xh))
#define QH_STEP_DOT2(dt, A, aw, c, xh) \
    ((dt) == Q8_0 ? qh_q8_step_dot2(Q8_STEP(A, aw, c), xh) \
                  : qh_step_dot2(Q4_0, A[(aw) + (c)], 0u, xh))
#endif

// QI_DOTS (the chain defines it under I8_CHAIN: glslang declares the instruction's capability
// in every module that declares the instruction, used or not, and the capability is a device
// feature): a step's dot as two packed 4x8-bit integer dot products (SPIR-V's OpSDot,
// SPV_KHR_integer_dot_product; Debian's glslang has no GL_EXT_integer_dot_product, so the
// instruction is declared through GL_EXT_spirv_intrinsics), the input quantised to int8 per
// block of 32 (ggml's q8_1 route): q8_0's codes as they are, q4_0's nibbles as the signed
// bytes n - 8 (Q4_SIGNED: per byte (n + 128 - 8) ^ 128, no borrow between bytes).
#ifdef QI_DOTS
#extension GL_EXT_spirv_intrinsics : require
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018],
                  id = 4450)
int qi_sdot_packed(int a, int b, spirv_literal int format);
// Σ of the products of the four signed bytes of a and b.
int qi_sdot(uint a, uint b) {
    return qi_sdot_packed(int(a), int(b), 0);
}
#define Q4_SIGNED(n) ((((n) | 0x80808080u) - 0x08080808u) ^ 0x80808080u)
#endif

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
