// The body of matvec and expert_matvec: ROWS dot products of weight rows with one input
// vector, each workgroup striding the input with 16-byte loads where aligned (VEC4), then one
// subgroup-plus-shared-memory reduction for all rows at once (reduce.glsl's wg_share_dots).
//
// The including kernel declares, before including this file:
//   W (uint w[]), WPair (uvec2 w_pair[]: q8_0's steps, quant.glsl's Q8_PAIRS) and W4
//   (uvec4 w4[]) on the weight binding (DTYPE_1),
//   X  (float x[]) and X4 (vec4 x4[]) on the input binding.
// Spec constants declared here: 1 = O (rows per matrix), 2 = I (row length), 3 = ROWS (rows
// per workgroup, 1..=8), 4 = VEC4 (1 when rows and the input are 16-byte aligned: I % 4 == 0
// for f32 weights, I % 8 == 0 for f16/bf16; always 1 for the block formats).
// Block formats (DTYPE_1 Q8_0 or Q4_0, quant.glsl): each step of the loop takes 8 weights of
// each row (two words of q8_0 codes, one of q4_0) and their block's f16 scale; I is a
// multiple of 32.

layout(constant_id = 1) const uint O = 1;
layout(constant_id = 2) const uint I = 1;
layout(constant_id = 3) const uint ROWS = 1;
layout(constant_id = 4) const uint VEC4 = 0;

#include "reduce.glsl"
#define Q8_PAIRS w_pair
#include "quant.glsl"

const uint MAX_ROWS = MAX_DOTS;

// Returns, in invocation r < ROWS, the dot of weight row (wrow + r) with x[xoff .. xoff + I];
// rows past `last` repeat row `last` (the caller discards them). Uniform control flow required.
float matvec_rows(uint wrow, uint last, uint xoff) {
    uint t = gl_LocalInvocationID.x;
    uint row[MAX_ROWS];
    float acc[MAX_ROWS];
    for (uint r = 0u; r < MAX_ROWS; r++) {
        acc[r] = 0.0;
        row[r] = min(wrow + r, last);
    }
#if DTYPE_1 == Q8_0 || DTYPE_1 == Q4_0
    uint rb = q_row_bytes(DTYPE_1, I);
    for (uint c = t; c < I / 8u; c += gl_WorkGroupSize.x) {
        vec4 xa = x4[xoff / 4u + 2u * c];
        vec4 xb = x4[xoff / 4u + 2u * c + 1u];
        for (uint r = 0u; r < ROWS; r++) {
            uint at = row[r] * rb;
            acc[r] += Q_SCALE(DTYPE_1, w, at, I, c / 4u) *
                      Q_STEP_DOT(DTYPE_1, w, at / 4u, c, xa, xb);
        }
    }
#else
    if (VEC4 != 0u) {
#if DTYPE_1 == F32
        uint n4 = I / 4u;
        for (uint c = t; c < n4; c += gl_WorkGroupSize.x) {
            vec4 xv = x4[xoff / 4u + c];
            for (uint r = 0u; r < ROWS; r++) {
                acc[r] += dot(uintBitsToFloat(w4[row[r] * n4 + c]), xv);
            }
        }
#else
        uint n8 = I / 8u;
        for (uint c = t; c < n8; c += gl_WorkGroupSize.x) {
            vec4 xa = x4[xoff / 4u + 2u * c];
            vec4 xb = x4[xoff / 4u + 2u * c + 1u];
            for (uint r = 0u; r < ROWS; r++) {
                uvec4 wv = w4[row[r] * n8 + c];
                vec2 p0 = PAIR(DTYPE_1, wv.x);
                vec2 p1 = PAIR(DTYPE_1, wv.y);
                vec2 p2 = PAIR(DTYPE_1, wv.z);
                vec2 p3 = PAIR(DTYPE_1, wv.w);
                acc[r] += dot(vec4(p0, p1), xa) + dot(vec4(p2, p3), xb);
            }
        }
#endif
    } else {
        for (uint c = t; c < I; c += gl_WorkGroupSize.x) {
            float xv = x[xoff + c];
            for (uint r = 0u; r < ROWS; r++) {
                acc[r] += LOAD(DTYPE_1, w, row[r] * I + c) * xv;
            }
        }
    }
#endif
    wg_share_dots(acc, ROWS);
    return wg_dot_total(min(t, ROWS - 1u));
}
