// The chained-matvec anchor (vkfuse fuse::codegen::chain generates the including source):
// y = W2 · act (+ in0), act[j] = EPILOGUE(j, a) over the dots a of the inner matvec's rows for
// j (its rms-norm prologue applied, parts zipped row by row), in one dispatch and one
// dependency level where two matvec kernels take two (SwiGLU's gate/up then down).
//
// Split over act (split-K for W2): workgroup b computes act[CB*b .. CB*b + CB) into shared
// memory, then its share of every output row, W2[r, CB*b .. +CB) · act_b, and adds it to y[r]
// with a float atomicAdd. So y must be zero before the dispatch (a zero kernel of an earlier
// level writes it), and the order of the sum over workgroups varies from run to run (f32
// reassociation only). Workgroup 0 also adds the extra input in0[r] when ADD_IN.
//
// The inner weights: PARTS matrices [J, I] packed row after row (ZIPPED: act row j combines
// rows k*J + j of every part k), W_DTYPE as in fused_matvec.glsl; x · nw (NORM), else x, is
// staged once per workgroup in shared memory, and the norm's rsqrt(mean(x²) + EPS) scales the
// inner dots (they are linear in it): x and nw are loaded together, and the x² sum is
// exchanged at the barrier the staging needs anyway, with no reduction before the dots.
//
// The including source defines W_DTYPE, NORM, NW_DTYPE, NORM_ZC, PARTS, ZIPPED, EPILOGUE(row, a)
// (over a[0..PER_ROW) only), W2_DTYPE, ADD_IN, CH_J, CH_I, CH_O (act length, inner columns,
// output rows) and, when ADD_IN, IN0(row) reading binding W2_BINDING + 1.
// Bindings: 0 = y f32[CH_O] (accumulated), 1 = w, 2 = x f32[CH_I], 3 = nw when NORM, then
// W2_BINDING = w2 of W2_DTYPE, then in0 when ADD_IN.
// OUTER_T (float outer weights): w2 is stored transposed, [CH_J, CH_O] (compile-model lays it
// out so), and CH_O is a multiple of 4; else w2 is [CH_O, CH_J] (the block formats).
// CH_CB: inner rows per workgroup (32, one quantisation block, for block formats; a multiple
// of 4 dividing CH_J otherwise). CH_DG: inner dots a subgroup takes at once (dividing
// CH_CB * PER_ROW). OUT_Q (OUTER_T): ceil(CH_O / 4 / workgroup size), the chunks of 4 output
// rows per invocation.
// Spec constants: 0 = workgroup size (a multiple of the subgroup size), 1 = EPS (f32).
// Dispatch: CH_J / CH_CB workgroups.

#extension GL_EXT_shader_atomic_float : require

#define REDUCE_NO_DOTS
#include "reduce.glsl"
#include "quant.glsl"
#include "fused_epilogue.glsl"

layout(constant_id = 1) const float EPS = 0.0;

const uint CB = CH_CB;
#if ZIPPED
const uint PER_ROW = PARTS;
#else
const uint PER_ROW = 1u;
#endif
// Dots per workgroup, taken DG at a time by a subgroup (DG loads in flight per step).
const uint NDOTS = CB * PER_ROW;
const uint DG = CH_DG;

layout(set = 0, binding = 0, std430) buffer Y { float y[]; };
layout(set = 0, binding = 1, std430) readonly buffer W { uint w[]; };
layout(set = 0, binding = 1, std430) readonly buffer W4 { uvec4 w4[]; };
layout(set = 0, binding = 2, std430) readonly buffer X { float x[]; };
#if NORM
layout(set = 0, binding = 3, std430) readonly buffer NW { uint nw[]; };
#endif
layout(set = 0, binding = W2_BINDING, std430) readonly buffer W2 { uint w2[]; };
layout(set = 0, binding = W2_BINDING, std430) readonly buffer W24 { uvec4 w2_4[]; };
layout(set = 0, binding = W2_BINDING, std430) readonly buffer W22 { uvec2 w2_2[]; };

// The staged input, then (OUTER_T) this block's share of the output rows: a subgroup's
// atomics must land on consecutive rows, one L2 line per instruction (each invocation adding
// its own four rows, four lines per instruction, cost ~6 µs per layer on an H100).
const uint STAGE4 = (OUTER_T != 0 && CH_O > CH_I ? CH_O : CH_I) / 4u;
shared vec4 xs4[STAGE4];
shared float dots_s[NDOTS];
shared vec4 act4[CB / 4u];

#if OUTER_T
// Weights 4q .. 4q + 3 of transposed outer row j (act row j), raw: converted only where used,
// so that loading them does not wait for them.
#if W2_DTYPE == F32
#define OUTER_RAW uvec4
#define OUTER_LOAD(j, q) w2_4[(j) * (CH_O / 4u) + (q)]
#define OUTER_VEC(v) uintBitsToFloat(v)
#else
#define OUTER_RAW uvec2
#define OUTER_LOAD(j, q) w2_2[(j) * (CH_O / 4u) + (q)]
#define OUTER_VEC(v) vec4(PAIR(W2_DTYPE, (v).x), PAIR(W2_DTYPE, (v).y))
#endif
#endif

// The vec4s of the input that step c (8 weights of a row) meets: 2c and 2c + 1, or the
// block formats' order (quant.glsl).
uvec2 step_x4(uint dt, uint c) {
    return (dt == Q8_0 || dt == Q4_0) ? q_x4(dt, c) : uvec2(2u * c, 2u * c + 1u);
}

// Step c of inner weight row `row` · (xa, xb).
float inner_step(uint row, uint c, vec4 xa, vec4 xb) {
#if W_DTYPE == Q8_0 || W_DTYPE == Q4_0
    uint at = row * q_row_bytes(W_DTYPE, CH_I);
    return Q_SCALE(W_DTYPE, w, at, CH_I, c / 4u) * Q_STEP_DOT(W_DTYPE, w, at / 4u, c, xa, xb);
#elif W_DTYPE == F32
    uint at = row * (CH_I / 4u) + 2u * c;
    return dot(uintBitsToFloat(w4[at]), xa) + dot(uintBitsToFloat(w4[at + 1u]), xb);
#else
    uvec4 v = w4[row * (CH_I / 8u) + c];
    return dot(vec4(PAIR(W_DTYPE, v.x), PAIR(W_DTYPE, v.y)), xa) +
           dot(vec4(PAIR(W_DTYPE, v.z), PAIR(W_DTYPE, v.w)), xb);
#endif
}

#if !OUTER_T
// W2[r, CB*b .. +CB) · act_b (the block formats: CB = 32, one block).
float outer_block(uint r, uint b) {
    float s = 0.0;
    uint at = r * q_row_bytes(W2_DTYPE, CH_J);
    for (uint i = 0u; i < 4u; i++) {
        uint c = 4u * b + i;
        uvec2 xi = step_x4(W2_DTYPE, c) - 8u * b;
        s += Q_STEP_DOT(W2_DTYPE, w2, at / 4u, c, act4[xi.x], act4[xi.y]);
    }
    s *= Q_SCALE(W2_DTYPE, w2, at, CH_J, b);
    return s;
}
#endif

// Adds v, this block's share of output row r, into y (workgroup 0 adds the extra input too).
void add_row(uint r, uint b, float v) {
#if ADD_IN
    if (b == 0u) {
        v += IN0(r);
    }
#endif
    atomicAdd(y[r], v);
}

void main() {
    uint t = gl_LocalInvocationID.x;
    uint b = group_id();
    if (b >= CH_J / CB) {
        return;
    }

    // x · nw into shared memory; the x² partials beside it (see the top).
    float ss = 0.0;
    for (uint i = t; i < CH_I / 4u; i += gl_WorkGroupSize.x) {
        vec4 v = vec4(x[4u * i], x[4u * i + 1u], x[4u * i + 2u], x[4u * i + 3u]);
        ss += dot(v, v);
#if NORM
        vec4 nv;
        for (uint e = 0u; e < 4u; e++) {
            float n = LOAD(NW_DTYPE, nw, 4u * i + e);
            nv[e] = NORM_ZC != 0 ? n + 1.0 : n;
        }
        v *= nv;
#endif
        xs4[i] = v;
    }
#if NORM
    wg_publish_sum(ss);
#endif
    barrier();

#if OUTER_T
    // The outer weights do not depend on act: loaded now, their latency overlaps the inner
    // dots. Chunk q of invocation t's k-th: rows 4q .. 4q + 3, q = t + k * workgroup size.
    OUTER_RAW pre[OUT_Q * CB];
    for (uint k = 0u; k < OUT_Q; k++) {
        uint q = min(t + k * gl_WorkGroupSize.x, CH_O / 4u - 1u);
        for (uint j = 0u; j < CB; j++) {
            pre[k * CB + j] = OUTER_LOAD(CB * b + j, q);
        }
    }
#endif

    // The block's inner dots: dot d is act row CB*b + d / PER_ROW, part d % PER_ROW.
    uint lane = gl_SubgroupInvocationID;
    for (uint d0 = DG * gl_SubgroupID; d0 < NDOTS; d0 += DG * gl_NumSubgroups) {
        uint wrow[DG];
        float acc[DG];
        for (uint i = 0u; i < DG; i++) {
            uint d = d0 + i;
            wrow[i] = (d % PER_ROW) * CH_J + CB * b + d / PER_ROW;
            acc[i] = 0.0;
        }
        for (uint c = lane; c < CH_I / 8u; c += gl_SubgroupSize) {
            uvec2 xi = step_x4(W_DTYPE, c);
            vec4 xa = xs4[xi.x];
            vec4 xb = xs4[xi.y];
            for (uint i = 0u; i < DG; i++) {
                acc[i] += inner_step(wrow[i], c, xa, xb);
            }
        }
        for (uint i = 0u; i < DG; i++) {
            float v = subgroupAdd(acc[i]);
            if (subgroupElect()) {
                dots_s[d0 + i] = v;
            }
        }
    }
    barrier();
    if (t < CB) {
        float scale = 1.0;
#if NORM
        scale = inversesqrt(wg_published_sum() / float(CH_I) + EPS);
#endif
        float a[PER_ROW];
        for (uint k = 0u; k < PER_ROW; k++) {
            a[k] = dots_s[t * PER_ROW + k] * scale;
        }
        act4[t / 4u][t % 4u] = EPILOGUE(CB * b + t, a);
    }
    barrier();

    // This block's share of every output row.
#if OUTER_T
    for (uint k = 0u; k < OUT_Q; k++) {
        uint q = t + k * gl_WorkGroupSize.x;
        if (q >= CH_O / 4u) {
            break;
        }
        vec4 v = vec4(0.0);
        for (uint j = 0u; j < CB; j++) {
            v += act4[j / 4u][j % 4u] * OUTER_VEC(pre[k * CB + j]);
        }
        xs4[q] = v;
    }
    barrier();
    for (uint r = t; r < CH_O; r += gl_WorkGroupSize.x) {
        add_row(r, b, xs4[r / 4u][r % 4u]);
    }
#else
    for (uint r = t; r < CH_O; r += gl_WorkGroupSize.x) {
        add_row(r, b, outer_block(r, b));
    }
#endif
}
