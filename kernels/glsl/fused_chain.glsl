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
// inner dots (they are linear in it): each invocation's first vec4 of nw is loaded before x is
// waited for (in the staging loop it would start only once x had arrived: on an H100 bf16 and
// q4_0 +0.5%, q8_0 -0.1..-0.3%, docs/perf.md session 28), and the x² partials are exchanged at
// the barrier the staging needs anyway; the block formats sum them right after it, before the
// dots (EARLY_SCALE), the others after the dots.
//
// The outer weights are stored transposed (compile-model lays them out so:
// compiler/src/import/layout.rs), so that a workgroup's share of them is contiguous:
// - Float weights, W2ᵀ [CH_J, CH_O]: the block's CB rows, read in steps of 4 output rows (one
//   8- or 16-byte load). The invocations form OUT_NG groups of OUT_SPAN, group g taking act
//   rows g*CB/OUT_NG .. of the block, each invocation OUT_Q steps; the groups' partial sums
//   meet in shared memory (the staged input's array, free by then).
// - Block formats, by whole blocks: row b holds block b (inputs 32b .. 32b + 32) of every
//   output row, codes (q8_0's in two runs of 16-byte halves) then scales (CB is 32, one
//   block): invocation t takes output rows t + k * workgroup size (OUT_Q of them), one
//   16-byte (q4_0) or two (q8_0) code loads and the scale each.
// The block formats' loads are issued before the inner dots, the float weights' after them
// (see OUTER below), and one atomic per output row adds
// the block's share, a subgroup's on consecutive rows: one L2 line per instruction (each
// invocation adding its own four rows, four lines per instruction, cost ~6 µs per layer on
// an H100).
//
// The including source defines W_DTYPE, NORM, NW_DTYPE, NORM_ZC, PARTS, ZIPPED, EPILOGUE(row, a)
// (over a[0..PER_ROW) only), W2_DTYPE, ADD_IN, CH_J, CH_I, CH_O (act length, inner columns,
// output rows: a multiple of 4 for float weights) and, when ADD_IN, IN0(row) reading binding
// W2_BINDING + 1; CH_CB (inner rows per workgroup, a multiple of 4 dividing CH_J; 32 for the
// block formats), CH_DG (inner dots a group of subgroups takes at once, dividing CH_CB *
// PER_ROW), CH_KS (subgroups per group, each a CH_KS-th of every row's steps, dividing
// CH_I / 8; 1 if undefined; the workgroup must hold at least CH_KS subgroups: a loop that let
// fewer take the shares in turn cost the H100 0.3-1.3% even where it ran once, so the compiler
// keeps CH_KS to a quarter of the subgroups a workgroup has at 32 invocations: whole on
// any device of up to 128-wide subgroups that runs 4 of them in a workgroup),
// OUT_Q, and for float weights OUT_NG (dividing CH_CB) and OUT_SPAN (OUT_NG * OUT_SPAN <=
// workgroup size, OUT_SPAN * OUT_Q >= CH_O / 4).
// Bindings: 0 = y f32[CH_O] (accumulated), 1 = w, 2 = x f32[CH_I], 3 = nw when NORM, then
// W2_BINDING = w2ᵀ of W2_DTYPE, then in0 when ADD_IN.
// Spec constants: 0 = workgroup size (a multiple of the subgroup size), 1 = EPS (f32).
// Dispatch: CH_J / CH_CB workgroups.
//
// Preloaded inner weights (PRE_STEPS > 0, block formats and 16-bit floats): each subgroup
// loads the first PRE_STEPS steps of its share of its group's first DG rows into registers
// before x is staged, so that they stream while x is still being waited for (a handed-over x:
// handoff.glsl), and the dots after the staging start from registers; the rest of a row, and
// any later round of dots, is loaded in the loop as before. On the H100 the chain's gate/up preloaded so gain 3% q8_0,
// ±0.5% q4_0 alone, and with the wide o_proj handed over (below) bf16 +3% more than without
// (docs/perf.md, session 16).
//
// The inner matvec alone (INNER_ONLY 1, `codegen::wide_matvec`): y[j] = EPILOGUE(j, a), written
// and published as handoff words, with no outer matrix: a matvec in wide workgroups (CB rows;
// groups of CH_KS subgroups take CH_DG rows each, a CH_KS-th of x per subgroup, so that x is
// read from shared memory once per CH_DG rows) that stages x once per workgroup and preloads
// its weights. Few workgroups read x, so x can be handed over to it: the attention block's
// output to o_proj.
// Its invocations poll their shares of x at once, four words per request (handoff_load4). A
// gate that had one subgroup wait for a word of each attention head first, so that 1024
// invocations would not poll the same few L2 lines while the heads ran, paid while each word
// took a request of its own; with the vec4 polls it cost its round trip (on an H100, without
// it bf16 +0.9%, q8_0 +1.3%, q4_0 +1.5%: docs/perf.md, session 29).
// EPILOGUE may read the extra input as `pin` (INNER_IN 1: IN0(row), loaded before the wait).
// Bindings: 0 = y, 1 = w, 2 = x, 3 = nw when NORM, then in0 when INNER_IN; W2_BINDING is 1 and
// ADD_IN 0 (no outer weights).

#extension GL_EXT_shader_atomic_float : require
#ifndef INNER_ONLY
#define INNER_ONLY 0
#endif
#ifndef INNER_IN
#define INNER_IN 0
#endif
#ifndef PRE_STEPS
#define PRE_STEPS 0
#endif
// The wide matvec's preloaded block-format steps (PRE_HALVES): their codes converted to exact
// f16 pairs (q8_0's -128..127 and q4_0's -8..7 are whole numbers f16 holds) and their scales to
// floats while x is awaited, so that after x arrives a step is four unpacks and its multiply-
// adds, not a mask, permute and subtraction per weight. On an H100: q8_0 +0.74%, q4_0 +1.25%,
// the same greedy ids, with 64 registers (56-58 before); the codes as scaled f32 vec4s instead
// took 114 and lost 0.5% and 1.3% (docs/perf.md, session 30). Steps past the preloaded ones
// (rows longer than a subgroup's PRE_STEPS cover) dequantise as before. Not in the chain: its
// 1024 invocations have no registers to spare.
#if INNER_ONLY && PRE_STEPS > 0 && (W_DTYPE == Q8_0 || W_DTYPE == Q4_0)
#define PRE_HALVES 1
#else
#define PRE_HALVES 0
#endif
// The chain's preloaded block-format steps (PRE_SPLIT) are readied while x is awaited: q8_0's
// two words with their bytes' sign bits flipped (code + 128, as q8_codes does) in the registers
// they already take, q4_0's code word split into its low and its high nibbles (one register
// more a step: the q4_0 chain 48 -> 56 of the 64 a 1024-wide workgroup allows), and the
// block's scale unpacked to a float; after x arrives a weight is a permute, a subtraction and a
// multiply-add. On the H100 q4_0 +1.36%, q8_0 +0.66%, the same greedy ids (docs/perf.md,
// session 31). f16 pairs, as PRE_HALVES makes them, took 24 registers more than the raw q4_0
// steps for 8 steps (16 for q8_0), past what the chain had: 4 of them lost 1.1%, all 8 5.5%.
#if !INNER_ONLY && PRE_STEPS > 0 && (W_DTYPE == Q8_0 || W_DTYPE == Q4_0)
#define PRE_SPLIT 1
#else
#define PRE_SPLIT 0
#endif
// x's vec4 i read as handoff words in main()'s staging. Where preloaded weights are readied,
// the first (i == t) was polled before the readying (main()'s xw).
#if PRE_HALVES || PRE_SPLIT
#define X_WORDS4(i) ((i) == t ? handoff_finish4(0u, i, xw) : handoff_load4(0u, i))
#else
#define X_WORDS4(i) handoff_load4(0u, i)
#endif
// Handoffs (handoff.glsl): x, and in0 where it is x again, can be read as handoff words (the
// runtime hands them over only when they are the same slice: see below). The inner matvec
// alone publishes y too.
#if INNER_ONLY
#define HANDOFF_ROLE (0x80000000u | (1u << 2))
#elif ADD_IN
#define HANDOFF_ROLE ((1u << 2) | (1u << (W2_BINDING + 1)))
#else
#define HANDOFF_ROLE (1u << 2)
#endif
#include "handoff.glsl"

#define REDUCE_NO_DOTS
#include "reduce.glsl"
// The int8 dots where the chain has block-format weights (QI_IN, QI_OUT below).
#if defined(I8_CHAIN) && !INNER_ONLY && \
    (W_DTYPE == Q8_0 || W_DTYPE == Q4_0 || W2_DTYPE == Q8_0 || W2_DTYPE == Q4_0)
#define QI_DOTS 1
#endif
#include "quant.glsl"
#include "fused_epilogue.glsl"

// The f16 dots (F16_DOTS, quant.glsl) in the inner dots (QH_IN) and the outer blocks (QH_OUT): the
// staged input as the f16 pairs the codes meet (xh4: step c's four pairs), act likewise.
// I8_CHAIN instead (the chain's gate/up dots, QI_IN; its down projection's, QI_OUT): x staged
// as int8 codes per block of 32 (xq2: step c's two words; xd: block β's scale), the dots two
// integer dot products a step (quant.glsl; fuse::dots says why and what it costs in accuracy).
#if defined(QI_DOTS) && (W_DTYPE == Q8_0 || W_DTYPE == Q4_0)
#define QI_IN 1
#else
#define QI_IN 0
#endif
#if defined(F16_CHAIN) && !QI_IN && (W_DTYPE == Q8_0 || W_DTYPE == Q4_0)
#define QH_IN 1
#else
#define QH_IN 0
#endif
// F16_ACC: the preloaded steps of the chain (PRE_SPLIT) summed in f16 pairs (quant.glsl).
#if QH_IN && defined(F16_ACC) && !INNER_ONLY
#define QH_ACC 1
#else
#define QH_ACC 0
#endif
// I8_CHAIN: the outer blocks' dots as integer dot products too (QI_OUT), act (one block of 32)
// quantised to int8 once per workgroup.
#if defined(QI_DOTS) && (W2_DTYPE == Q8_0 || W2_DTYPE == Q4_0)
#define QI_OUT 1
#else
#define QI_OUT 0
#endif
#if defined(F16_DOWN) && !QI_OUT && !INNER_ONLY && (W2_DTYPE == Q8_0 || W2_DTYPE == Q4_0)
#define QH_OUT 1
#else
#define QH_OUT 0
#endif

layout(constant_id = 1) const float EPS = 0.0;

const uint CB = CH_CB;
#if ZIPPED
const uint PER_ROW = PARTS;
#else
const uint PER_ROW = 1u;
#endif
// Dots per workgroup, taken DG at a time by a group of KS subgroups (DG loads in flight per
// step), each subgroup of the group a KS-th of the row's steps (SPK of them).
const uint NDOTS = CB * PER_ROW;
const uint DG = CH_DG;
#ifndef CH_KS
#define CH_KS 1u
#endif
const uint KS = CH_KS;
const uint SPK = CH_I / 8u / KS;

layout(set = 0, binding = 0, std430) buffer Y { float y[]; };
layout(set = 0, binding = 1, std430) readonly buffer W { uint w[]; };
layout(set = 0, binding = 1, std430) readonly buffer W4 { uvec4 w4[]; };
// q8_0's steps as one 8-byte load each (inner_raw; quant.glsl's Q8_STEP says what it gains).
layout(set = 0, binding = 1, std430) readonly buffer WPair { uvec2 w_pair[]; };
layout(set = 0, binding = 2, std430) readonly buffer X { float x[]; };
#if NORM
#include "norm_weights.glsl"
#endif
layout(set = 0, binding = W2_BINDING, std430) readonly buffer W2 { uint w2[]; };
layout(set = 0, binding = W2_BINDING, std430) readonly buffer W24 { uvec4 w2_4[]; };
layout(set = 0, binding = W2_BINDING, std430) readonly buffer W22 { uvec2 w2_2[]; };

#if W2_DTYPE == Q8_0 || W2_DTYPE == Q4_0
#define OUT_BLOCKS 1
// 16-byte code loads per block.
const uint CODE4 = W2_DTYPE == Q8_0 ? 2u : 1u;
// Row b of the transposed blocks, as words: 16-byte piece i of output row r's codes at
// uvec4 i * CH_O + r (q8_0's halves apart, so that neighbouring invocations read neighbouring
// 16 bytes), the scales after every row's codes.
uint orow(uint b) {
    return b * (q_row_bytes(W2_DTYPE, CH_O * 32u) / 4u);
}
#if QH_IN || QI_IN
// x is staged as f16 pairs in xh4 (or int8 codes in xq2) instead: xs4 is left unused.
const uint STAGE4 = 1u;
#else
const uint STAGE4 = CH_I / 4u;
#endif
#else
#define OUT_BLOCKS 0
// Steps of 4 output rows per transposed row, and act rows per group.
const uint OSTEPS = CH_O / 4u;
const uint JPG = CB / OUT_NG;
#if W2_DTYPE == F32
#define OUTER_RAW uvec4
#define OUTER_LOAD(j, s) w2_4[(j) * OSTEPS + (s)]
#define OUTER_VEC(v) uintBitsToFloat(v)
#else
#define OUTER_RAW uvec2
#define OUTER_LOAD(j, s) w2_2[(j) * OSTEPS + (s)]
#define OUTER_VEC(v) vec4(PAIR(W2_DTYPE, (v).x), PAIR(W2_DTYPE, (v).y))
#endif
// The staged input, then the groups' partial sums of the output rows.
const uint STAGE4 = (OUT_NG * CH_O > CH_I ? OUT_NG * CH_O : CH_I) / 4u;
#endif
shared vec4 xs4[STAGE4];
#if QH_IN
shared uvec4 xh4[CH_I / 8u];
#endif
#if QI_IN
shared uvec2 xq2[CH_I / 8u];
shared float xd[CH_I / 32u];
#endif

// Where the staged input's vec4 i lives. A subgroup's 16-byte shared loads are served 8 lanes
// at a time, and 8 lanes conflict unless their vec4s sit in 8 distinct groups of 4 banks
// (index mod 8). With float weights the dots' lanes read vec4s 2c and 2c + 1 for consecutive
// steps c: as stored, two lanes of every 8 meet in each group, and every load takes two
// passes. Flipping bit 0 of the vec4s whose bit 3 is set spreads them over all 8 groups: on the
// H100 bf16's o_proj dots 1.28 -> 0.77 µs, the chain's 1.54 -> 1.28 (docs/perf.md, session 23).
// The block formats, whose steps read the same vec4s, keep the plain order: the swizzle
// measured level for q8_0 and cost q4_0 0.7% (docs/perf.md, sessions 23 and 28).
// Only where whole runs of 16 vec4s are staged, so that an index stays in the array.
uint xs_at(uint i) {
#if defined(NO_XS_SWIZZLE) || W_DTYPE == Q8_0 || W_DTYPE == Q4_0
    return i;
#else
    return (CH_I / 4u) % 16u == 0u ? i ^ ((i >> 3u) & 1u) : i;
#endif
}
// Each dot's KS partial sums, one per subgroup of its group.
shared float dots_s[NDOTS * KS];
shared vec4 act4[CB / 4u];
#if QI_OUT
// act's int8 codes (word j: elements 4j .. 4j + 3), their scale, and (q4_0) 8 x their sum.
shared uint aq_s[8];
shared float ad_s;
shared int asum8_s;
#endif

// The vec4s of the input that step c (8 weights of a row, in every dtype: quant.glsl) meets.
uvec2 step_x4(uint c) {
    return uvec2(2u * c, 2u * c + 1u);
}

#if W_DTYPE != F32
// Step c of inner weight row `row` as raw words (block formats: the codes, then the scale
// word), and their dot with the input vec4s xa, xb: a step in two halves, so that the loads
// can be issued early (PRE_STEPS) and the dots done later.
uvec4 inner_raw(uint row, uint c) {
#if W_DTYPE == Q8_0 || W_DTYPE == Q4_0
    uint at = row * q_row_bytes(W_DTYPE, CH_I);
    uint sw = w[(at + q_code_bytes(W_DTYPE, CH_I)) / 4u + c / 8u];
    // Rows start on 16 bytes (q_row_bytes): q8_0's step is one aligned 8-byte load.
    return W_DTYPE == Q8_0 ? uvec4(w_pair[at / 8u + c], sw, 0u) : uvec4(w[at / 4u + c], 0u, sw, 0u);
#else
    return w4[row * (CH_I / 8u) + c];
#endif
}

#if QI_IN
// Step c's raw words v (inner_raw) · its int8 input xq, before the scales.
int inner_idot(uvec4 v, uvec2 xq) {
    return W_DTYPE == Q8_0 ? qi_sdot(v.x, xq.x) + qi_sdot(v.y, xq.y)
                           : qi_sdot(Q4_SIGNED(Q4_LOW_BYTES(v.x)), xq.x) +
                                 qi_sdot(Q4_SIGNED(Q4_HIGH_BYTES(v.x)), xq.y);
}
#endif

float inner_dot(uvec4 v, uint c, vec4 xa, vec4 xb) {
#if QH_IN
    // xa's bits are step c's f16 pairs (inner_step's caller passes them so).
    return Q_SCALE_HALF(v.z, c / 4u) * qh_step_dot(W_DTYPE, v.x, v.y, floatBitsToUint(xa));
#elif W_DTYPE == Q8_0 || W_DTYPE == Q4_0
    // Block c / 4's f16 scale: half (c / 4) & 1 of its word (as Q_SCALE reads it).
    float d = Q_SCALE_HALF(v.z, c / 4u);
    return W_DTYPE == Q8_0 ? d * (dot(q8_codes(v.x), xa) + dot(q8_codes(v.y), xb))
                           : d * (dot(q4_low(v.x), xa) + dot(q4_high(v.x), xb));
#else
    return dot(vec4(PAIR(W_DTYPE, v.x), PAIR(W_DTYPE, v.y)), xa) +
           dot(vec4(PAIR(W_DTYPE, v.z), PAIR(W_DTYPE, v.w)), xb);
#endif
}
#endif

// Step c of inner weight row `row` · (xa, xb).
float inner_step(uint row, uint c, vec4 xa, vec4 xb) {
#if W_DTYPE == F32
    uint at = row * (CH_I / 4u) + 2u * c;
    return dot(uintBitsToFloat(w4[at]), xa) + dot(uintBitsToFloat(w4[at + 1u]), xb);
#else
    return inner_dot(inner_raw(row, c), c, xa, xb);
#endif
}

// The DG dots' sums over this subgroup's lanes into dots_s (dot d0 + i's partial over share
// sh of the steps), transposed where they fit (reduce.glsl's SUBGROUP_SUMS: on the H100 +1.2%
// bf16 and q8_0, +0.4% q4_0 against a subgroupAdd per dot).
void reduce_dots(float acc[DG], uint d0, uint sh) {
#define DOT_PARTIAL(j, v) dots_s[(d0 + (j)) * KS + sh] = (v)
    SUBGROUP_SUMS_STORE(acc, DG, subgroup_sums_fit(DG), DOT_PARTIAL)
#undef DOT_PARTIAL
}

// Σ x² over the workgroup (after wg_publish_sum and a barrier): only the subgroups that stage x
// (main()'s staging loop, invocations t < CH_I / 4) published partials that are not zero.
float x_sq_sum() {
    return wg_published_sum_of(subgroups_holding(CH_I / 4u));
}

// Adds v, this block's share of output row r, into y (workgroup 0 adds the extra input too).
void add_row(uint r, uint b, float v) {
#if ADD_IN
    if (b == 0u) {
        v += handoff_reading() ? handoff_load(1u, r) : IN0(r);
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

#if INNER_IN
    float pin = t < CB ? IN0(CB * b + t) : 0.0;
#endif
#if NORM
    // This invocation's first vec4 of norm weights, before x is waited for (see the top).
    vec4 nw_first = t < CH_I / 4u ? nw4_at(t) : vec4(0.0);
#endif
    uint lane = gl_SubgroupInvocationID;
    // This subgroup's dot group, and its share of the rows' steps: share * SPK .. + SPK. The
    // workgroup must hold at least KS subgroups (see the top).
    uint grp = gl_SubgroupID / KS;
    uint share = gl_SubgroupID - grp * KS;
    uint groups = gl_NumSubgroups / KS;
    uint cbase = share * SPK;
#if PRE_STEPS > 0
    // This subgroup's first round of dots, its first PRE_STEPS steps loaded now (see the top).
    uvec4 wp[DG * PRE_STEPS];
#ifdef ABLATE_EMPTY
    if (false) {
#else
    if (grp < groups && DG * grp < NDOTS) {
#endif
        for (uint i = 0u; i < DG; i++) {
            uint d = DG * grp + i;
            uint row = (d % PER_ROW) * CH_J + CB * b + d / PER_ROW;
            for (uint k = 0u; k < PRE_STEPS; k++) {
                uint c = cbase + min(lane + k * gl_SubgroupSize, SPK - 1u);
                wp[i * PRE_STEPS + k] = inner_raw(row, c);
            }
        }
    }
#if PRE_HALVES || PRE_SPLIT
    // x's first polls, issued before the readying below waits for the preloaded weights: a
    // workgroup that launches after x was published (the chain's last ones begin when o_proj's
    // and the prefetch's workgroups leave their SMs) then waits for both loads at once, where
    // polling after the readying waited for the weights first and then for x.
    uvec4 xw = handoff_reading() && t < CH_I / 4u ? handoff_poll4(0u, t) : uvec4(0u);
#endif
#if PRE_HALVES
    // Entry e's codes as f16 pairs (elements 0-1, 2-3 of xa's half, then of xb's) and its scale.
    uvec4 wh[DG * PRE_STEPS];
    float wd[DG * PRE_STEPS];
    for (uint e = 0u; e < DG * PRE_STEPS; e++) {
        uint c = cbase + min(lane + (e % PRE_STEPS) * gl_SubgroupSize, SPK - 1u);
        uvec4 v = wp[e];
        wd[e] = Q_SCALE_HALF(v.z, c / 4u);
#if QH_IN
        wh[e] = uvec4(packFloat2x16(qh_pair(W_DTYPE, v.x, v.y, 0u)),
                      packFloat2x16(qh_pair(W_DTYPE, v.x, v.y, 1u)),
                      packFloat2x16(qh_pair(W_DTYPE, v.x, v.y, 2u)),
                      packFloat2x16(qh_pair(W_DTYPE, v.x, v.y, 3u)));
#else
        vec4 lo = W_DTYPE == Q8_0 ? q8_codes(v.x) : q4_low(v.x);
        vec4 hi = W_DTYPE == Q8_0 ? q8_codes(v.y) : q4_high(v.x);
        wh[e] = uvec4(packHalf2x16(lo.xy), packHalf2x16(lo.zw), packHalf2x16(hi.xy),
                      packHalf2x16(hi.zw));
#endif
    }
#elif PRE_SPLIT
    // Entry e as (codes of xa's half, codes of xb's half, scale), the codes readied for
    // quant.glsl's q_magic_bytes (q8_codes and q4_low / q4_high in two halves).
    for (uint e = 0u; e < DG * PRE_STEPS; e++) {
        uint c = cbase + min(lane + (e % PRE_STEPS) * gl_SubgroupSize, SPK - 1u);
        uvec4 v = wp[e];
        float d = Q_SCALE_HALF(v.z, c / 4u);
#if QI_IN
        // q8_0's signed bytes as they are; q4_0's nibbles as the signed bytes n - 8.
        wp[e] = W_DTYPE == Q8_0 ? uvec4(v.x, v.y, floatBitsToUint(d), 0u)
                                : uvec4(Q4_SIGNED(Q4_LOW_BYTES(v.x)),
                                        Q4_SIGNED(Q4_HIGH_BYTES(v.x)), floatBitsToUint(d), 0u);
#elif QH_IN
        // The raw code words stay (qh_pair masks them after x arrives): the scale only.
#if QH_ACC
        wp[e] = uvec4(v.x, v.y, packFloat2x16(qh_scale2(W_DTYPE, v.z, c / 4u)), 0u);
#else
        wp[e] = uvec4(v.x, v.y, floatBitsToUint(d), 0u);
#endif
#else
        wp[e] = W_DTYPE == Q8_0
                    ? uvec4(Q8_READY(v.x), Q8_READY(v.y), floatBitsToUint(d), 0u)
                    : uvec4(Q4_LOW_BYTES(v.x), Q4_HIGH_BYTES(v.x), floatBitsToUint(d), 0u);
#endif
    }
#endif
#if defined(PROBE_MARK0_READY) && PRE_STEPS > 0
    // Probe (timeline only): mark 0 once the preloaded weights are back (the branch on all of
    // them keeps the clock read after their loads).
    uint ready = 0u;
    for (uint e = 0u; e < DG * PRE_STEPS; e++) {
        ready ^= wp[e].z;
    }
    if (ready != 0x7fc00001u || b == 0xffffu) {
        TIMELINE_MARK(0);
    }
#endif
#endif
#ifdef ABLATE_EMPTY
    // Timing only (compile-model --ablate chain / wide-matvec): no weights loaded; x waited for
    // as unablated, the outputs written (and published by the wide matvec).
    {
        float e = 0.0;
        for (uint i = t; i < CH_I / 4u; i += gl_WorkGroupSize.x) {
            vec4 v = handoff_reading() ? handoff_load4(0u, i) : vec4(x[4u * i]);
            e += v.x * 1e-30;
        }
#if INNER_ONLY
        if (t < CB) {
            float v = e;
#if INNER_IN
            v += pin;
#endif
            y[CB * b + t] = v;
            handoff_store(CB * b + t, v);
        }
#else
        if (b == 0u) {
            for (uint r = t; r < CH_O; r += gl_WorkGroupSize.x) {
                add_row(r, b, e);
            }
        }
#endif
        return;
    }
#endif

    // x · nw into shared memory; the x² partials beside it (see the top).
    float ss = 0.0;
    for (uint i = t; i < CH_I / 4u; i += gl_WorkGroupSize.x) {
        vec4 v = handoff_reading()
                     ? X_WORDS4(i)
                     : vec4(x[4u * i], x[4u * i + 1u], x[4u * i + 2u], x[4u * i + 3u]);
        ss += dot(v, v);
#if NORM
        v *= i == t ? nw_first : nw4_at(i);
#endif
#if QI_IN
        // vec4 i is half of step i / 2, and an eighth of block i / 8, whose largest |x| the
        // eight neighbouring invocations that stage it agree on (the workgroup and the
        // subgroups are whole multiples of 8 invocations); its codes round(127 x / max).
        float am = max(max(abs(v.x), abs(v.y)), max(abs(v.z), abs(v.w)));
        am = max(am, subgroupShuffleXor(am, 1u));
        am = max(am, subgroupShuffleXor(am, 2u));
        am = max(am, subgroupShuffleXor(am, 4u));
        uint q = am > 0.0 ? packSnorm4x8(v * (1.0 / am)) : 0u;
        if ((i & 1u) == 0u) {
            xq2[i / 2u].x = q;
        } else {
            xq2[i / 2u].y = q;
        }
        if ((i & 7u) == 0u) {
            xd[i / 8u] = am / 127.0;
        }
#elif QH_IN
        // vec4 i is half of step i / 2: its pairs (0, 2), (1, 3) or (4, 6), (5, 7).
        uvec2 h = uvec2(packHalf2x16(v.xz), packHalf2x16(v.yw));
        if ((i & 1u) == 0u) {
            xh4[i / 2u].xy = h;
        } else {
            xh4[i / 2u].zw = h;
        }
#else
        xs4[xs_at(i)] = v;
#endif
    }
#if NORM
    wg_publish_sum(ss);
#endif
    barrier();
#if !(defined(PROBE_MARK0_READY) && PRE_STEPS > 0)
    TIMELINE_MARK(0);
#endif
#if NORM && (W_DTYPE == Q8_0 || W_DTYPE == Q4_0)
    // The norm's scale, read from the x² partials now, before the dots: after them it sat on
    // the act rows' path, which the whole workgroup waits for. On an H100 q4_0 +0.35%, q8_0
    // +0.16%; bf16 lost 0.56% with it (the register it holds through the dots), so the float
    // formats read it after the dots as before (docs/perf.md, session 32).
#define EARLY_SCALE 1
    float nscale = t < CB ? inversesqrt(x_sq_sum() / float(CH_I) + EPS) : 1.0;
#else
#define EARLY_SCALE 0
#endif

    // The outer weights do not depend on act: the block formats' loaded now, their latency
    // overlapping the inner dots (loads past the end are clamped in bounds; their results are
    // dropped). The float weights' are loaded after the dots (OUTER below).
#if !INNER_ONLY && OUT_BLOCKS
    uvec4 pre_c[OUT_Q * CODE4];
    uint pre_s[OUT_Q];
    for (uint k = 0u; k < OUT_Q; k++) {
        uint r = min(t + k * gl_WorkGroupSize.x, CH_O - 1u);
        for (uint i = 0u; i < CODE4; i++) {
            pre_c[k * CODE4 + i] = w2_4[orow(b) / 4u + i * CH_O + r];
        }
        pre_s[k] = w2[orow(b) + q_code_bytes(W2_DTYPE, CH_O * 32u) / 4u + r / 2u];
    }
#endif

    // The block's inner dots: dot d is act row CB*b + d / PER_ROW, part d % PER_ROW.
    for (uint d0 = DG * grp; grp < groups && d0 < NDOTS; d0 += DG * groups) {
        uint wrow[DG];
        float acc[DG];
        for (uint i = 0u; i < DG; i++) {
            uint d = d0 + i;
            wrow[i] = (d % PER_ROW) * CH_J + CB * b + d / PER_ROW;
            acc[i] = 0.0;
        }
        uint c0 = lane;
#if PRE_STEPS > 0
        if (d0 == DG * grp) {
#if QH_ACC
            f16vec2 acch[DG];
            for (uint i = 0u; i < DG; i++) {
                acch[i] = f16vec2(0.0hf);
            }
#endif
            for (uint k = 0u; k < PRE_STEPS; k++) {
                uint c = lane + k * gl_SubgroupSize;
                if (c < SPK) {
                    uvec2 xi = step_x4(cbase + c);
#if QH_IN
                    uvec4 xh = xh4[cbase + c];
#endif
#if QI_IN
                    uvec2 xq = xq2[cbase + c];
                    float dx = xd[(cbase + c) / 4u];
#endif
                    for (uint i = 0u; i < DG; i++) {
#if QI_IN
                        uvec4 v = wp[i * PRE_STEPS + k];
                        acc[i] += uintBitsToFloat(v.z) * dx *
                                  float(qi_sdot(v.x, xq.x) + qi_sdot(v.y, xq.y));
#elif QH_IN && PRE_HALVES
                        uvec4 h = wh[i * PRE_STEPS + k];
                        acc[i] += wd[i * PRE_STEPS + k] *
                                  qh_dot(unpackFloat2x16(h.x), unpackFloat2x16(h.y),
                                         unpackFloat2x16(h.z), unpackFloat2x16(h.w), xh);
#elif QH_ACC
                        uvec4 v = wp[i * PRE_STEPS + k];
                        acch[i] = fma(qh_step_dot2(W_DTYPE, v.x, v.y, xh), unpackFloat2x16(v.z),
                                      acch[i]);
#elif QH_IN
                        uvec4 v = wp[i * PRE_STEPS + k];
                        acc[i] += uintBitsToFloat(v.z) * qh_step_dot(W_DTYPE, v.x, v.y, xh);
#elif PRE_HALVES
                        uvec4 h = wh[i * PRE_STEPS + k];
                        vec4 wa = vec4(unpackHalf2x16(h.x), unpackHalf2x16(h.y));
                        vec4 wb = vec4(unpackHalf2x16(h.z), unpackHalf2x16(h.w));
                        acc[i] += wd[i * PRE_STEPS + k] *
                                  (dot(wa, xs4[xs_at(xi.x)]) + dot(wb, xs4[xs_at(xi.y)]));
#elif PRE_SPLIT
                        const float off = W_DTYPE == Q8_0 ? Q8_MAGIC_OFF : Q4_MAGIC_OFF;
                        uvec4 v = wp[i * PRE_STEPS + k];
                        acc[i] += uintBitsToFloat(v.z) *
                                  (dot(q_magic_bytes(v.x) - off, xs4[xs_at(xi.x)]) +
                                   dot(q_magic_bytes(v.y) - off, xs4[xs_at(xi.y)]));
#else
                        acc[i] += inner_dot(wp[i * PRE_STEPS + k], cbase + c,
                                            xs4[xs_at(xi.x)], xs4[xs_at(xi.y)]);
#endif
                    }
                }
            }
#if QH_ACC
            // qh_scale2 carried QH_UNSCALE, which the act rows' scale applies again.
            for (uint i = 0u; i < DG; i++) {
                acc[i] += (float(acch[i].x) + float(acch[i].y)) / QH_UNSCALE(W_DTYPE);
            }
#endif
            c0 = lane + PRE_STEPS * gl_SubgroupSize;
        }
#endif
        for (uint c = cbase + c0; c < cbase + SPK; c += gl_SubgroupSize) {
#if QI_IN
            uvec2 xq = xq2[c];
            float dx = xd[c / 4u];
            for (uint i = 0u; i < DG; i++) {
                uvec4 v = inner_raw(wrow[i], c);
                acc[i] += Q_SCALE_HALF(v.z, c / 4u) * dx * float(inner_idot(v, xq));
            }
#else
#if QH_IN
            vec4 xa = uintBitsToFloat(xh4[c]);
            vec4 xb = vec4(0.0);
#else
            uvec2 xi = step_x4(c);
            vec4 xa = xs4[xs_at(xi.x)];
            vec4 xb = xs4[xs_at(xi.y)];
#endif
            for (uint i = 0u; i < DG; i++) {
                acc[i] += inner_step(wrow[i], c, xa, xb);
            }
#endif
        }
        reduce_dots(acc, d0, share);
    }
#if !INNER_ONLY && !OUT_BLOCKS
    // OUTER: the float weights' outer loads, issued once the dots are done and before the
    // barrier ahead of act, by the invocations of the groups only. Written before the dots,
    // NVIDIA's compiler sank them past act's barriers (their latency after act's), and kept
    // there by a branch they spilled the dots' registers (bf16 -7.7%); here bf16 +0.2..0.3% on
    // an H200 against the sunk loads, -1.4% where every invocation loads (f16 timed only with
    // lm_head's STEP_FILTER: +0.65% together; docs/perf.md, session 56).
    // Invocation t: group g, steps t % OUT_SPAN + k * OUT_SPAN.
    uint g = t / OUT_SPAN;
    OUTER_RAW pre[OUT_Q * JPG];
    if (g < OUT_NG) {
        uint jg = CB * b + g * JPG;
        for (uint k = 0u; k < OUT_Q; k++) {
            uint s = min(t % OUT_SPAN + k * OUT_SPAN, OSTEPS - 1u);
            for (uint i = 0u; i < JPG; i++) {
                pre[k * JPG + i] = OUTER_LOAD(jg + i, s);
            }
        }
    }
#endif
    barrier();
#ifndef CHAIN_MARK_AFTER_ACT
    TIMELINE_MARK(1);
#endif
    if (t < CB) {
        float scale = 1.0;
#if EARLY_SCALE
        scale = nscale;
#elif NORM
        scale = inversesqrt(x_sq_sum() / float(CH_I) + EPS);
#endif
#if QH_IN
        scale *= QH_UNSCALE(W_DTYPE);
#endif
        float a[PER_ROW];
        for (uint k = 0u; k < PER_ROW; k++) {
            float v = 0.0;
            for (uint j = 0u; j < KS; j++) {
                v += dots_s[(t * PER_ROW + k) * KS + j];
            }
            a[k] = v * scale;
        }
#if INNER_ONLY
        float v = EPILOGUE(CB * b + t, a);
        y[CB * b + t] = v;
        handoff_store(CB * b + t, v);
    }
#else
        float e = EPILOGUE(CB * b + t, a);
#if QI_OUT
        // act's int8 codes (all 32 rows are one block) straight from the invocations that
        // computed it, where they are one subgroup (subgroups of 32 or more): its largest |act|
        // by subgroupMax, each word of 4 codes gathered by two shuffles. Narrower subgroups
        // take the path below, through act4 and a barrier more: on an H200 this one is q8_0
        // +0.3..0.4%, q4_0 +0.9..1.1% (docs/perf.md, session 53); every subgroup computing
        // all 32 rows itself, with no barrier after the dots' at all, lost 2.2% and 3.8%.
        if (gl_SubgroupSize >= CB) {
            float am = subgroupMax(abs(e));
            uint q = am > 0.0 ? packSnorm4x8(vec4(e * (1.0 / am), 0.0, 0.0, 0.0)) & 0xffu : 0u;
            // q4_0's nibbles n meet the codes as n - 8: 8 x Σ codes comes off each row once.
            int s = subgroupAdd(bitfieldExtract(int(q), 0, 8));
            q <<= 8u * (t & 3u);
            q |= subgroupShuffleXor(q, 1u);
            q |= subgroupShuffleXor(q, 2u);
            if ((t & 3u) == 0u) {
                aq_s[t / 4u] = q;
            }
            if (t == 0u) {
                ad_s = am / 127.0;
                asum8_s = W2_DTYPE == Q4_0 ? 8 * s : 0;
            }
        } else
#endif
        {
            act4[t / 4u][t % 4u] = e;
        }
    }
    barrier();
#ifdef CHAIN_MARK_AFTER_ACT
    // Probe (timeline only): "work done" once act is in shared memory, so that the rest is
    // the down projection and its atomics alone.
    TIMELINE_MARK(1);
#endif

    // This block's share of every output row.
#if OUT_BLOCKS
#if QI_OUT
    // Subgroups narrower than the block: act's codes, a word from each of the first 8
    // invocations, which agree on its largest as x's stagers do (the runtime requires
    // subgroups of 8 or more).
    if (gl_SubgroupSize < CB) {
        if (t < 8u) {
            vec4 a = act4[t];
            vec4 aa = abs(a);
            float am = max(max(aa.x, aa.y), max(aa.z, aa.w));
            am = max(am, subgroupShuffleXor(am, 1u));
            am = max(am, subgroupShuffleXor(am, 2u));
            am = max(am, subgroupShuffleXor(am, 4u));
            uint q = am > 0.0 ? packSnorm4x8(a * (1.0 / am)) : 0u;
            aq_s[t] = q;
            int s = qi_sdot(q, 0x01010101u);
            s += subgroupShuffleXor(s, 1u);
            s += subgroupShuffleXor(s, 2u);
            s += subgroupShuffleXor(s, 4u);
            if (t == 0u) {
                ad_s = am / 127.0;
                asum8_s = W2_DTYPE == Q4_0 ? 8 * s : 0;
            }
        }
        barrier();
    }
    uint aq[8];
    for (uint j = 0u; j < 8u; j++) {
        aq[j] = aq_s[j];
    }
    float ad = ad_s;
    int asum8 = asum8_s;
#endif
#if QH_OUT
    // act as the f16 pairs of the block's four steps, once for all of this invocation's rows.
    uvec4 ah[4];
    for (uint w = 0u; w < 4u; w++) {
        ah[w] = QH_X(act4[2u * w], act4[2u * w + 1u]);
    }
#endif
    for (uint k = 0u; k < OUT_Q; k++) {
        uint r = t + k * gl_WorkGroupSize.x;
        if (r >= CH_O) {
            break;
        }
        float v = 0.0;
#if QI_OUT
        int iv = -asum8;
        if (W2_DTYPE == Q8_0) {
            for (uint i = 0u; i < 2u; i++) {
                uvec4 c = pre_c[k * 2u + i];
                for (uint w = 0u; w < 4u; w++) {
                    iv += qi_sdot(c[w], aq[4u * i + w]);
                }
            }
        } else {
            // Word w of the block: inputs 8w .. 8w + 3 in its low nibbles, 8w + 4 .. in its high.
            uvec4 c = pre_c[k];
            for (uint w = 0u; w < 4u; w++) {
                iv += qi_sdot(Q4_LOW_BYTES(c[w]), aq[2u * w]) +
                      qi_sdot(Q4_HIGH_BYTES(c[w]), aq[2u * w + 1u]);
            }
        }
        v = ad * float(iv);
#elif QH_OUT
        for (uint w = 0u; w < 4u; w++) {
            v += W2_DTYPE == Q8_0
                     ? qh_step_dot(Q8_0, pre_c[k * 2u + w / 2u][2u * (w % 2u)],
                                   pre_c[k * 2u + w / 2u][2u * (w % 2u) + 1u], ah[w])
                     : qh_step_dot(Q4_0, pre_c[k][w], 0u, ah[w]);
        }
        v *= QH_UNSCALE(W2_DTYPE);
#elif W2_DTYPE == Q4_0
        // Word w of the block: inputs 8w .. 8w + 3 in its low nibbles, 8w + 4 .. in its high.
        uvec4 c = pre_c[k];
        for (uint w = 0u; w < 4u; w++) {
            v += dot(q4_low(c[w]), act4[2u * w]) + dot(q4_high(c[w]), act4[2u * w + 1u]);
        }
#else
        for (uint i = 0u; i < 2u; i++) {
            uvec4 c = pre_c[k * 2u + i];
            for (uint w = 0u; w < 4u; w++) {
                v += dot(q8_codes(c[w]), act4[4u * i + w]);
            }
        }
#endif
        add_row(r, b, v * Q_SCALE_HALF(pre_s[k], r));
    }
#else
    // Each group's partial sums, then their total.
    if (g < OUT_NG) {
        for (uint k = 0u; k < OUT_Q; k++) {
            uint s = t % OUT_SPAN + k * OUT_SPAN;
            if (s >= OSTEPS) {
                break;
            }
            vec4 v = vec4(0.0);
            for (uint i = 0u; i < JPG; i++) {
                uint j = g * JPG + i;
                v += act4[j / 4u][j % 4u] * OUTER_VEC(pre[k * JPG + i]);
            }
            xs4[g * OSTEPS + s] = v;
        }
    }
    barrier();
    for (uint r = t; r < CH_O; r += gl_WorkGroupSize.x) {
        float v = 0.0;
        for (uint h = 0u; h < OUT_NG; h++) {
            v += xs4[h * OSTEPS + r / 4u][r % 4u];
        }
        add_row(r, b, v);
    }
#endif
#endif // INNER_ONLY
}
