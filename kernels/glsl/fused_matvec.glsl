// The matvec-family anchor of fused kernels (vkfuse fuse::codegen generates the including
// source). For every output row: the dots of one or more weight rows with the input, with an
// optional rms-norm prologue, then a generated epilogue expression.
//
// Weights: PARTS matrices [rows_k, I] of W_DTYPE packed side by side (row after row) at compile
// time; block formats (Q8_0, Q4_0) are rows of codes and scales (quant.glsl), dequantised in
// the inner loop, 8 weights per row and step. Stacked (ZIPPED 0): output row r is weight row
// r, written at r + SHIFT_k (each part starts at an aligned offset); O = all rows. Zipped
// (ZIPPED 1): all parts have O rows and output row r combines weight rows k*O + r of every part k.
// Prologue (NORM 1): x̂ = x / sqrt(mean(x²) + EPS) · nw (· (1 + nw) when NORM_ZC), never in
// memory. The dots are linear in x̂'s scale, so it is applied after them: every workgroup meets
// each element of x once in its dot loop and sums x² there, beside the dots, and the sum shares
// their one exchange. No pass over x and no reduction comes before the first weight load.
// Epilogue: EPILOGUE(row, a, pre) with a[k] the dot of part k (a[0] when stacked) and pre[k]
// the row's element of extra input k. PRELOAD_INS(row, pre) loads them (IN<k>(row)) before
// the dots, so their latency hides behind the weights' and the epilogue waits on no memory.
//
// Step (STEP 1, one part, the logits): the argmax of the rows folded into the token state as a
// 64-bit key by every workgroup, and the position advanced (matvec_step.glsl).
//
// The including source defines W_DTYPE, NORM, NW_DTYPE, NORM_ZC, PARTS, ZIPPED, N_IN (extra
// inputs, at least 1), PRELOAD_INS, EPILOGUE and STEP (with STEP_BINDING).
// Bindings: 0 = y f32, 1 = w (uint / uvec2 / uvec4 views), 2 = x f32 (float / vec4 views),
// 3 = nw [I] of NW_DTYPE when NORM, then the extra inputs, then STEP's three.
// Spec constants: 0 = workgroup size (power of two), 1 = O, 2 = I, 3 = ROWS (output rows per
// workgroup; ROWS * (ZIPPED ? PARTS : 1) <= 8), 4 = VEC4 (1 when rows and x are 16-byte
// aligned), 5 = EPS (f32), 6..13 = END_k (cumulative row ends of the parts, stacked),
// 14..21 = SHIFT_k (output offset minus row start of part k, stacked).
// Dispatch: ceil(O / ROWS) workgroups.

#extension GL_KHR_shader_subgroup_shuffle : require
// Handoffs (handoff.glsl): y can be published, except by the step's lm_head, which no level
// after it reads. x is not read as handoff words: every workgroup reads all of it, each through
// its own L2 requests, and that costs more than the barrier it saves. On the H100 a matvec
// consumer lost 9-50% with a load per element in the dot loop (docs/perf.md, session 14), and
// staged once per workgroup with 16-byte loads, waiting on nothing, it still cost 4.6-5.8 µs per
// layer (session 15). The matvec that does read words (o_proj) is a wide one instead
// (fused_chain.glsl's INNER_ONLY): few workgroups, weights loaded before the wait.
#if STEP
#define HANDOFF_ROLE 0u
#else
#define HANDOFF_ROLE 0x80000000u
#endif
#include "handoff.glsl"
#include "reduce.glsl"
// q8_0's steps as one 8-byte load each (quant.glsl's Q8_STEP) through WPair, declared below.
#define Q8_PAIRS w_pair
#include "quant.glsl"
#include "fused_epilogue.glsl"

layout(constant_id = 1) const uint O = 1;
layout(constant_id = 2) const uint I = 1;
layout(constant_id = 3) const uint ROWS = 1;
layout(constant_id = 4) const uint VEC4 = 0;
layout(constant_id = 5) const float EPS = 0.0;
layout(constant_id = 6) const uint END0 = 0;
layout(constant_id = 7) const uint END1 = 0;
layout(constant_id = 8) const uint END2 = 0;
layout(constant_id = 9) const uint END3 = 0;
layout(constant_id = 10) const uint END4 = 0;
layout(constant_id = 11) const uint END5 = 0;
layout(constant_id = 12) const uint END6 = 0;
layout(constant_id = 13) const uint END7 = 0;
layout(constant_id = 14) const uint SHIFT0 = 0;
layout(constant_id = 15) const uint SHIFT1 = 0;
layout(constant_id = 16) const uint SHIFT2 = 0;
layout(constant_id = 17) const uint SHIFT3 = 0;
layout(constant_id = 18) const uint SHIFT4 = 0;
layout(constant_id = 19) const uint SHIFT5 = 0;
layout(constant_id = 20) const uint SHIFT6 = 0;
layout(constant_id = 21) const uint SHIFT7 = 0;

layout(set = 0, binding = 0, std430) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1, std430) readonly buffer W { uint w[]; };
layout(set = 0, binding = 1, std430) readonly buffer W4 { uvec4 w4[]; };
layout(set = 0, binding = 1, std430) readonly buffer WPair { uvec2 w_pair[]; };
layout(set = 0, binding = 2, std430) readonly buffer X { float x[]; };
layout(set = 0, binding = 2, std430) readonly buffer X4 { vec4 x4[]; };
#if NORM
#include "norm_weights.glsl"
#endif

#include "matvec_rows.glsl"
#if STEP
#include "matvec_step.glsl"
#endif

// Steps of 8 weights per invocation and row: a constant once specialised, so the step loops
// below have a constant trip count the compiler can unroll, every weight load of the
// workgroup's rows in flight at once rather than one step's after another.
const uint STEPS8 = (I / 8u + gl_WorkGroupSize.x - 1u) / gl_WorkGroupSize.x;

#if W_DTYPE == Q8_0 || W_DTYPE == Q4_0
// Words of a row's f16 scales (two per word; an odd count pads the last), and whether the
// workgroup is one subgroup with a lane for each of them (lm_head's 32 invocations on a device
// with subgroups of 32): then each lane loads one scale word per row and the steps take them
// with a shuffle, one load per row instead of one per step (q8_0's lm_head 79.1 -> 73.0 µs on
// an H100, docs/perf.md).
const uint SCALE_WORDS = (I / 32u + 1u) / 2u;
#define SCALE_SHUFFLE (gl_WorkGroupSize.x == gl_SubgroupSize && SCALE_WORDS <= gl_SubgroupSize)
#endif
// q4_0's logits (STEP) with f32 dots (`--dots f32`; the f16 dots take the place of it) take
// the codes in quant.glsl's linear form: each of lm_head's steps meets its rows with one Σ x,
// and saves a subtraction per weight. Measured with the 8 rows per workgroup of vocabularies of
// 65536 or more (compiler/src/kernels/select.rs); smaller vocabularies get 2 rows per
// workgroup below 4096, which share Σ x less (not measured).
#if defined(F16_MV) && defined(F16_ACC) && (W_DTYPE == Q8_0 || W_DTYPE == Q4_0)
#define QH_ACC 1
#else
#define QH_ACC 0
#endif
#if W_DTYPE == Q4_0 && STEP && !defined(F16_MV)
#define LIN4 1
#else
#define LIN4 0
#endif

#if W_DTYPE != F32
// The input's two vec4s that step c's 8 weights meet (in every dtype of such steps: 16-bit
// floats and, in quant.glsl's order, the block formats), normed (NORM: their squares added to
// ss when `live`).
void step_x(uint c, bool live, inout float ss, out vec4 xa, out vec4 xb) {
    xa = x4[2u * c];
    xb = x4[2u * c + 1u];
#if NORM
    ss += live ? dot(xa, xa) + dot(xb, xb) : 0.0;
    xa *= nw4_at(2u * c);
    xb *= nw4_at(2u * c + 1u);
#endif
}
#endif

void main() {
    uint t = gl_LocalInvocationID.x;
    uint row0 = group_id() * ROWS;
    if (row0 >= O) {
        return;
    }
#ifdef ABLATE_EMPTY
    // Timing only (compile-model --ablate matvec): its input read (one element per row), its
    // outputs written and published.
    if (t < ROWS && row0 + t < O) {
        uint r = row0 + t;
        float v = x[r % I] * 1e-30;
        y[out_index(r)] = v;
        handoff_store(out_index(r), v);
    }
    return;
#endif
#if STEP
    step_begin();
#endif
    // Dot j is output row row0 + j / PER_ROW, part j % PER_ROW; rows past O repeat O - 1.
    uint wrow[MAX_DOTS];
    float acc[MAX_DOTS];
    for (uint j = 0u; j < MAX_DOTS; j++) {
        uint r = min(row0 + j / PER_ROW, O - 1u);
        uint k = j % PER_ROW;
        wrow[j] = k * O + r;
        acc[j] = 0.0;
    }
    uint ndots = ROWS * PER_ROW;
    // The extra inputs of the row this invocation finishes (see the top).
    float pre[N_IN];
    for (uint k = 0u; k < N_IN; k++) {
        pre[k] = 0.0;
    }
    if (t < ROWS) {
        uint row = min(row0 + t, O - 1u);
        PRELOAD_INS(row, pre)
    }

    // Σ x² over the elements of x this invocation meets (NORM).
    float ss = 0.0;

#if W_DTYPE == Q8_0 || W_DTYPE == Q4_0
    uint rb = q_row_bytes(W_DTYPE, I);
#if QH_ACC
    f16vec2 acch[MAX_DOTS];
    for (uint j = 0u; j < MAX_DOTS; j++) {
        acch[j] = f16vec2(0.0hf);
    }
#endif
    if (SCALE_SHUFFLE) {
        // Lane s holds scale word s of each row; step c takes its block's (c / 4, in word
        // c / 8) from that lane.
        uint sw[MAX_DOTS];
        for (uint j = 0u; j < ndots; j++) {
            uint at = wrow[j] * rb;
            sw[j] = t < SCALE_WORDS ? w[(at + q_code_bytes(W_DTYPE, I)) / 4u + t] : 0u;
        }
        for (uint k = 0u; k < STEPS8; k++) {
            // Every lane takes every step (one past the row redoes the row's last step and adds
            // nothing), so that each shuffle finds the lane it reads still there. Shuffled
            // after the step's loads are issued: before them, the code loads would wait for
            // the scale words (lm_head q8_0 +6 µs on an H100).
            uint c0 = t + k * gl_WorkGroupSize.x;
            bool live = c0 < I / 8u;
            uint c = min(c0, I / 8u - 1u);
            vec4 xa, xb;
            step_x(c, live, ss, xa, xb);
            uint b = c / 4u;
#if LIN4
            float sx = dot(xa + xb, vec4(1.0));
#endif
#ifdef F16_MV
            uvec4 xh = QH_X(xa, xb);
#endif
            for (uint j = 0u; j < ndots; j++) {
#if QH_ACC
                f16vec2 p = QH_STEP_DOT2(W_DTYPE, w, wrow[j] * rb / 4u, c, xh);
                f16vec2 h = fma(p, qh_scale2(W_DTYPE, subgroupShuffle(sw[j], b / 2u), b), acch[j]);
                acch[j] = live ? h : acch[j];
#else
                float d = Q_SCALE_HALF(subgroupShuffle(sw[j], b / 2u), b);
#ifdef F16_MV
                float v = d * QH_STEP_DOT(W_DTYPE, w, wrow[j] * rb / 4u, c, xh);
#elif LIN4
                float v = 256.0 * d * Q4_LIN_STEP_DOT(w, wrow[j] * rb / 4u, c, xa, xb, sx);
#else
                float v = d * Q_STEP_DOT(W_DTYPE, w, wrow[j] * rb / 4u, c, xa, xb);
#endif
                acc[j] += live ? v : 0.0;
#endif
            }
        }
    } else {
        for (uint k = 0u; k < STEPS8; k++) {
            uint c = t + k * gl_WorkGroupSize.x;
            if (c >= I / 8u) {
                break;
            }
            vec4 xa, xb;
            step_x(c, true, ss, xa, xb);
#if LIN4
            float sx = dot(xa + xb, vec4(1.0));
#endif
#ifdef F16_MV
            uvec4 xh = QH_X(xa, xb);
#endif
            for (uint j = 0u; j < ndots; j++) {
                uint at = wrow[j] * rb;
#if QH_ACC
                f16vec2 p = QH_STEP_DOT2(W_DTYPE, w, at / 4u, c, xh);
                uint sword = w[(at + q_code_bytes(W_DTYPE, I)) / 4u + c / 8u];
                acch[j] = fma(p, qh_scale2(W_DTYPE, sword, c / 4u), acch[j]);
#elif defined(F16_MV)
                acc[j] += Q_SCALE(W_DTYPE, w, at, I, c / 4u) *
                          QH_STEP_DOT(W_DTYPE, w, at / 4u, c, xh);
#elif LIN4
                acc[j] += 256.0 * Q_SCALE(W_DTYPE, w, at, I, c / 4u) *
                          Q4_LIN_STEP_DOT(w, at / 4u, c, xa, xb, sx);
#else
                acc[j] += Q_SCALE(W_DTYPE, w, at, I, c / 4u) *
                          Q_STEP_DOT(W_DTYPE, w, at / 4u, c, xa, xb);
#endif
            }
        }
    }
#if QH_ACC
    // The f16 sums already carry QH_UNSCALE (qh_scale2).
    for (uint j = 0u; j < MAX_DOTS; j++) {
        acc[j] = float(acch[j].x) + float(acch[j].y);
    }
#endif
#else
    if (VEC4 != 0u) {
#if W_DTYPE == F32
        uint n4 = I / 4u;
        for (uint c = t; c < n4; c += gl_WorkGroupSize.x) {
            vec4 xv = x4[c];
#if NORM
            ss += dot(xv, xv);
            xv *= nw4_at(c);
#endif
            for (uint j = 0u; j < ndots; j++) {
                acc[j] += dot(uintBitsToFloat(w4[wrow[j] * n4 + c]), xv);
            }
        }
#else
        uint n8 = I / 8u;
        for (uint k = 0u; k < STEPS8; k++) {
            uint c = t + k * gl_WorkGroupSize.x;
            if (c >= n8) {
                break;
            }
            vec4 xa, xb;
            step_x(c, true, ss, xa, xb);
            for (uint j = 0u; j < ndots; j++) {
                uvec4 wv = w4[wrow[j] * n8 + c];
                vec2 p0 = PAIR(W_DTYPE, wv.x);
                vec2 p1 = PAIR(W_DTYPE, wv.y);
                vec2 p2 = PAIR(W_DTYPE, wv.z);
                vec2 p3 = PAIR(W_DTYPE, wv.w);
                acc[j] += dot(vec4(p0, p1), xa) + dot(vec4(p2, p3), xb);
            }
        }
#endif
    } else {
        for (uint c = t; c < I; c += gl_WorkGroupSize.x) {
            float xv = x[c];
            ss += xv * xv;
            xv *= nw_at(c);
            for (uint j = 0u; j < ndots; j++) {
                acc[j] += LOAD(W_DTYPE, w, wrow[j] * I + c) * xv;
            }
        }
    }
#endif

    float scale = 1.0;
#if NORM
    wg_publish_sum(ss);
#endif
    wg_share_dots(acc, ndots);
#if NORM
    scale = inversesqrt(wg_published_sum() / float(I) + EPS);
#endif
#if defined(F16_MV) && (W_DTYPE == Q8_0 || W_DTYPE == Q4_0) && !QH_ACC
    scale *= QH_UNSCALE(W_DTYPE);
#endif
#if STEP
    uint step_best = 0u;
    uint step_row = NONE;
#endif
    if (t < ROWS && row0 + t < O) {
        float a[PER_ROW];
        for (uint k = 0u; k < PER_ROW; k++) {
            a[k] = wg_dot_total(t * PER_ROW + k) * scale;
        }
        uint r = row0 + t;
        float v = EPILOGUE(r, a, pre);
        y[out_index(r)] = v;
        handoff_store(out_index(r), v);
#if STEP
        step_best = order_key(v);
        step_row = r;
#endif
    }
#if STEP
    step_arrive(step_best, step_row);
#endif
}
