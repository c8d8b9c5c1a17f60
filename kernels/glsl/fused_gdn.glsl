// The Gated DeltaNet step anchor (vkfuse fuse::codegen generates the including source): one
// decode step, computing what causal_conv1d, conv_shift, silu, l2_norm, the gates,
// delta_rule_update, delta_rule_readout and gated_rms_norm compute, each key head's state
// columns split over GDN_PARTS workgroups (parts):
//   1. conv: for each channel of the key head (its q and k channels, then the v channels of
//      the part's columns): y = w[c, KM1] * x + sum_j w[c, j] * state[c, j], silu(y);
//   2. q and k scaled by 1 / sqrt(sum^2 + L2_EPS); the gates g and beta of each value head;
//   3. per state column j of value head h (COLS columns a part, each walked by DSPLIT
//      invocations of DCH rows): s *= exp(g[h]), delta = beta[h] * (v[h, j] - s^T k),
//      s += k * delta in place, o = SCALE * s^T q;
//   4. per value head: y = o / sqrt(mean(o^2) + NORM_EPS) * w_norm * silu(z).
// x is the projection [HK, W] row-major; per key head q, k, v (R value heads side by side) and
// z start at columns QO, KO, VO, ZO. Channel order of the conv (and its state and weight) is
// [q of every key head | k of every key head | v of every value head].
//
// Why parts: one workgroup per key head (Qwen3-Next's 16, 8 in docs/perf.md's
// qwen3-next-small) left the step ~15.7 µs a layer on an H200, each of those few SMs walking
// 128 KB of state while the rest idled. A part's columns are independent, but every part needs
// the head's whole q and k, so each convolves all of the head's q and k channels itself (256
// channels at Qwen3-Next's sizes, from L2). Their conv state rows are read by every part and
// can be shifted only once all have read them: the part that arrives last on the head's
// counter (as the attention splits combine, fused_attention.glsl) writes them, from rows it
// computed in step 1. A part's v channels are its own and shift in place. The gated norm needs
// a value head's whole o: a part holding whole value heads normalises its own (LOCAL_NORM);
// narrower parts write o to y and the last to arrive normalises every value head from there.
// Each invocation's state rows are loaded first, before the conv: they depend on nothing the
// kernel computes.
//
// The including source defines CW_DTYPE, NW_DTYPE, GDN_PARTS (and COUNT_BINDING when it is
// above 1), includes fused_epilogue.glsl, declares the gate inputs (bindings 6..) and defines
// `float gate_g(uint h)` and `float gate_beta(uint h)`.
// Bindings: 0 = y f32[HK * R, DV], 1 = conv state f32[C, KM1] (read and written),
// 2 = recurrent state f32[HK * R, DK, DV] (read and written), 3 = x f32[HK * W],
// 4 = conv weight [C, KM1 + 1] of CW_DTYPE, 5 = norm weight [DV] of NW_DTYPE; with parts,
// COUNT_BINDING = arrival counters u32[HK] (zero before the dispatch, zero again after it).
// Spec constants: 0 = workgroup size (COLS * DSPLIT, DSPLIT dividing DK), 1 = HK, 2 = R,
// 3 = DK, 4 = DV, 5 = KM1, 6 = W, 7 = QO, 8 = KO, 9 = VO, 10 = ZO, 11 = L2_EPS, 12 = SCALE,
// 13 = NORM_EPS (f32).
// Dispatch: HK * GDN_PARTS workgroups, (kh, part) at kh * GDN_PARTS + part.
//
// Handoffs (handoff.glsl): y can be published, each element once, by the workgroup that
// normalises it (gated_norm), so that the out projection after it (a wide matvec, as the
// attention block's o_proj) may read it as words with no barrier between them. x can be read
// as words (slot 0), and so can the gate inputs the including source reads through
// handoff_load (the projection's a and b columns, slots 1 and 2): the source then defines
// HANDOFF_ROLE (publishes binding 0, reads binding 3 and those gate bindings) and includes
// handoff.glsl before its gate functions, and the step's workgroups launch while the projection
// still runs, load their state rows and the conv's weights and rows first, and wait only for
// the words they read: every x word they read polled at once, then waited on.

#ifndef HANDOFF_ROLE
#define HANDOFF_ROLE 0x80000000u
#endif
#include "handoff.glsl"
#include "reduce.glsl"

layout(constant_id = 1) const uint HK = 1;
layout(constant_id = 2) const uint R = 1;
layout(constant_id = 3) const uint DK = 1;
layout(constant_id = 4) const uint DV = 1;
layout(constant_id = 5) const uint KM1 = 1;
layout(constant_id = 6) const uint W = 1;
layout(constant_id = 7) const uint QO = 0;
layout(constant_id = 8) const uint KO = 0;
layout(constant_id = 9) const uint VO = 0;
layout(constant_id = 10) const uint ZO = 0;
layout(constant_id = 11) const float L2_EPS = 1e-6;
layout(constant_id = 12) const float SCALE = 1.0;
layout(constant_id = 13) const float NORM_EPS = 1e-6;

// Coherent: with parts, the last to arrive reads what the others wrote in this dispatch.
layout(set = 0, binding = 0, std430) coherent buffer Y { float y[]; };
layout(set = 0, binding = 1, std430) buffer CS { float cs[]; };
layout(set = 0, binding = 2, std430) buffer S { float st[]; };
layout(set = 0, binding = 3, std430) readonly buffer X { float x[]; };
layout(set = 0, binding = 4, std430) readonly buffer CW { uint cw[]; };
layout(set = 0, binding = 5, std430) readonly buffer NW { uint nw[]; };
#if GDN_PARTS > 1
layout(set = 0, binding = COUNT_BINDING, std430) coherent buffer Count { uint arrived[]; };
shared uint last_s;
#endif

const uint PARTS = GDN_PARTS;
const uint WG = gl_WorkGroupSize.x;
const uint RDV = R * DV;
// Columns of a part, invocations walking each column, rows of the state each walks.
const uint COLS = RDV / PARTS;
const uint DSPLIT = WG / COLS;
const uint DCH = DK / DSPLIT;
const bool LOCAL_NORM = COLS % DV == 0u;
// Elements of the output each invocation normalises (at most; all R value heads).
const uint NZ = (RDV + WG - 1u) / WG;

shared float q_s[DK];
shared float k_s[DK];
shared float v_s[COLS];
shared float o_s[RDV];
shared float g_s[R];
shared float b_s[R];
shared float inv_s[R];
// The head's q and k conv state rows shifted (step 1), written out by the last to arrive.
shared float qk_new[2u * DK * KM1 + 1u];

// q's and k's squares summed in one exchange (wg_sum2.glsl; its own array, where reduce.glsl's
// has one slot for a one-invocation workgroup).
shared vec2 red2_s[gl_WorkGroupSize.x];
#include "wg_sum2.glsl"

// The conv state row index of the head's q or k channel i (i < 2 * DK).
uint qk_channel(uint kh, uint i) {
    return i < DK ? kh * DK + i : HK * DK + kh * DK + (i - DK);
}

// silu(z) * w_norm of element t + i * WG of the value heads this workgroup may normalise.
float gz[NZ];

// The conv's channels a workgroup takes (the head's q and k, the part's v), and at most how many
// each invocation takes.
const uint NCH = 2u * DK + COLS;
const uint NCV = (NCH + WG - 1u) / WG;

// Channel i of a part's conv: its row in the conv state and weight (c) and its element of x.
void conv_channel(uint kh, uint part, uint i, out uint c, out uint xi) {
    uint row = kh * W;
    if (i < 2u * DK) {
        c = qk_channel(kh, i);
        xi = row + (i < DK ? QO + i : KO + (i - DK));
    } else {
        uint vc = part * COLS + (i - 2u * DK);
        c = 2u * HK * DK + kh * RDV + vc;
        xi = row + VO + vc;
    }
}

// Element i of x in two halves: its first poll (a handoff word where this dispatch reads them,
// else its bits from the binding), then its value (the word polled again while empty). Every
// poll is issued before any is waited on: one round trip for all of them.
uint x_poll(uint i) {
    return handoff_reading() ? handoff_poll(handoff_at(0u, i)) : floatBitsToUint(x[i]);
}

float x_value(uint i, uint w) {
    return handoff_reading() ? handoff_value(handoff_at(0u, i), w) : uintBitsToFloat(w);
}

// Step 4 for value heads h0 .. h0 + nh - 1 of key head kh, their o in o_s from h0's.
void gated_norm(uint kh, uint h0, uint nh) {
    uint t = gl_LocalInvocationID.x;
    for (uint hh = 0u; hh < nh; hh++) {
        float p = 0.0;
        for (uint j = t; j < DV; j += WG) {
            float o = o_s[hh * DV + j];
            p += o * o;
        }
        // Only invocations t < DV hold squares (reduce.glsl's wg_sum_of).
        float s = wg_sum_of(p, subgroups_holding(DV));
        if (t == 0u) {
            inv_s[hh] = inversesqrt(s / float(DV) + NORM_EPS);
        }
    }
    barrier();
    for (uint i = 0u; i < NZ; i++) {
        uint e = t + i * WG;
        if (e < nh * DV) {
            float v = o_s[e] * inv_s[e / DV] * gz[i];
            y[(kh * R + h0) * DV + e] = v;
            handoff_store((kh * R + h0) * DV + e, v);
        }
    }
}

void main() {
    uint wid = group_id();
    uint kh = wid / PARTS;
    uint part = wid - kh * PARTS;
    if (kh >= HK) {
        return;
    }
    uint t = gl_LocalInvocationID.x;
    uint row = kh * W;

    // 0. This invocation's DCH rows of its column's state.
    uint jl = t % COLS;
    uint dc = t / COLS;
    uint col = part * COLS + jl;
    uint hh = col / DV;
    uint base = (kh * R + hh) * DK * DV + (col - hh * DV) + dc * DCH * DV;
    float sv[DCH];
    [[unroll]] for (uint i = 0u; i < DCH; i++) {
        sv[i] = st[base + i * DV];
    }

    // The value heads this workgroup may normalise, their z and the conv's x: polled now,
    // beside the state, all before any is waited on.
    uint h0 = LOCAL_NORM ? part * (COLS / DV) : 0u;
    uint nh = LOCAL_NORM ? COLS / DV : R;
    uint zw[NZ];
    for (uint i = 0u; i < NZ; i++) {
        uint e = min(t + i * WG, nh * DV - 1u);
        zw[i] = x_poll(row + ZO + h0 * DV + e);
    }
    uint xw[NCV];
    for (uint s = 0u; s < NCV; s++) {
        uint c;
        uint xi;
        conv_channel(kh, part, min(t + s * WG, NCH - 1u), c, xi);
        xw[s] = x_poll(xi);
    }
    // The gates, g and beta by different invocations (each may wait on a word).
    for (uint i = t; i < 2u * R; i += WG) {
        if (i < R) {
            g_s[i] = gate_g(kh * R + i);
        } else {
            b_s[i - R] = gate_beta(kh * R + i - R);
        }
    }
    for (uint i = 0u; i < NZ; i++) {
        uint e = min(t + i * WG, nh * DV - 1u);
        gz[i] = silu(x_value(row + ZO + h0 * DV + e, zw[i])) * LOAD(NW_DTYPE, nw, e % DV);
    }

    // 1. The conv of the head's q and k channels and of the part's v channels, silu: the
    // channel's history summed before its x is waited on.
    for (uint s = 0u; s < NCV; s++) {
        uint i = t + s * WG;
        if (i >= NCH) {
            break;
        }
        uint c;
        uint xi;
        conv_channel(kh, part, i, c, xi);
        uint k = KM1 + 1u;
        float acc = 0.0;
        for (uint j = 0u; j < KM1; j++) {
            acc += LOAD(CW_DTYPE, cw, c * k + j) * cs[c * KM1 + j];
        }
        float xv = x_value(xi, xw[s]);
        acc += LOAD(CW_DTYPE, cw, c * k + KM1) * xv;
        float a = silu(acc);
        if (i < 2u * DK) {
            for (uint j = 0u; j < KM1; j++) {
                qk_new[i * KM1 + j] = j + 1u < KM1 ? cs[c * KM1 + j + 1u] : xv;
            }
            if (i < DK) {
                q_s[i] = a;
            } else {
                k_s[i - DK] = a;
            }
        } else {
            for (uint j = 0u; j < KM1; j++) {
                cs[c * KM1 + j] = j + 1u < KM1 ? cs[c * KM1 + j + 1u] : xv;
            }
            v_s[i - 2u * DK] = a;
        }
    }
    barrier();

    // 2. l2 norms of q and k.
    vec2 pqk = vec2(0.0);
    for (uint i = t; i < DK; i += WG) {
        pqk += vec2(q_s[i] * q_s[i], k_s[i] * k_s[i]);
    }
    // Only invocations t < DK hold squares.
    vec2 s2 = wg_sum2_of(pqk, subgroups_holding(DK));
    float sq = inversesqrt(s2.x + L2_EPS);
    float sk = inversesqrt(s2.y + L2_EPS);

    // 3. The delta rule on the invocation's rows, summed over the column's DSPLIT walkers in a
    // fixed order (every walker gets the same delta), then the readout.
    uint d0 = dc * DCH;
    float decay = exp(g_s[hh]);
    float m = 0.0;
    [[unroll]] for (uint i = 0u; i < DCH; i++) {
        m += (sv[i] * decay) * k_s[d0 + i];
    }
    red_f[t] = m * sk;
    barrier();
    float mem = 0.0;
    for (uint c = 0u; c < DSPLIT; c++) {
        mem += red_f[c * COLS + jl];
    }
    float delta = (v_s[jl] - mem) * b_s[hh];
    float o = 0.0;
    [[unroll]] for (uint i = 0u; i < DCH; i++) {
        float kd = k_s[d0 + i] * sk;
        float s = sv[i] * decay + kd * delta;
        st[base + i * DV] = s;
        o += s * q_s[d0 + i];
    }
    barrier();
    red_f[t] = o * sq;
    barrier();
    if (dc == 0u) {
        float total = 0.0;
        for (uint c = 0u; c < DSPLIT; c++) {
            total += red_f[c * COLS + jl];
        }
        total *= SCALE;
        if (LOCAL_NORM) {
            o_s[jl] = total;
        } else {
            y[(kh * R) * DV + col] = total;
        }
    }

    // 4. Normalise what this part holds; count the arrival; the last writes the q and k conv
    // rows and, for narrow parts, normalises the head from y.
    if (LOCAL_NORM) {
        barrier();
        gated_norm(kh, h0, nh);
    }
#if GDN_PARTS > 1
    // Every invocation's o (narrow parts) is visible device-wide before the arrival is counted.
    memoryBarrierBuffer();
    barrier();
    if (t == 0u) {
        last_s = atomicAdd(arrived[kh], 1u) == PARTS - 1u ? 1u : 0u;
    }
    barrier();
    if (last_s == 0u) {
        return;
    }
    memoryBarrierBuffer();
    // Self-cleaning: every part of this head has arrived, none reads the counter again.
    if (t == 0u) {
        arrived[kh] = 0u;
    }
#endif
    for (uint i = t; i < 2u * DK * KM1; i += WG) {
        uint ch = i / KM1;
        cs[qk_channel(kh, ch) * KM1 + (i - ch * KM1)] = qk_new[i];
    }
    if (!LOCAL_NORM) {
        for (uint i = t; i < RDV; i += WG) {
            o_s[i] = y[kh * RDV + i];
        }
        barrier();
        gated_norm(kh, 0u, R);
    }
}
