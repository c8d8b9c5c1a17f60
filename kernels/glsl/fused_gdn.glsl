// The Gated DeltaNet step anchor (vkfuse fuse::codegen generates the including source): one
// decode step of one key head per workgroup, computing what causal_conv1d, conv_shift, silu,
// l2_norm, the gates, delta_rule_update, delta_rule_readout and gated_rms_norm compute:
//   1. conv: for each channel of the head (its q and k channels, then the v channels of its R
//      value heads): y = w[c, KM1] * x + sum_j w[c, j] * state[c, j], silu(y); the conv state's
//      row shifted left with x appended, in place (one invocation owns a channel);
//   2. q and k scaled by 1 / sqrt(sum^2 + L2_EPS); the gates g and beta of each value head;
//   3. per state column j of each value head h (one invocation owns it): s *= exp(g[h]),
//      delta = beta[h] * (v[h, j] - s^T k), s += k * delta in place, o = SCALE * s^T q;
//   4. per value head: y = o / sqrt(mean(o^2) + NORM_EPS) * w_norm * silu(z).
// x is the projection [HK, W] row-major; per key head q, k, v (R value heads side by side) and
// z start at columns QO, KO, VO, ZO. Channel order of the conv (and its state and weight) is
// [q of every key head | k of every key head | v of every value head].
//
// The including source defines CW_DTYPE, NW_DTYPE, includes fused_epilogue.glsl, declares the
// gate inputs (bindings 6..) and defines `float gate_g(uint h)` and `float gate_beta(uint h)`.
// Bindings: 0 = y f32[HK * R, DV], 1 = conv state f32[C, KM1] (read and written),
// 2 = recurrent state f32[HK * R, DK, DV] (read and written), 3 = x f32[HK * W],
// 4 = conv weight [C, KM1 + 1] of CW_DTYPE, 5 = norm weight [DV] of NW_DTYPE.
// Spec constants: 0 = workgroup size (power of two), 1 = HK, 2 = R, 3 = DK, 4 = DV, 5 = KM1,
// 6 = W, 7 = QO, 8 = KO, 9 = VO, 10 = ZO, 11 = L2_EPS, 12 = SCALE, 13 = NORM_EPS (f32).
// Dispatch: HK workgroups.

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

layout(set = 0, binding = 0, std430) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1, std430) buffer CS { float cs[]; };
layout(set = 0, binding = 2, std430) buffer S { float st[]; };
layout(set = 0, binding = 3, std430) readonly buffer X { float x[]; };
layout(set = 0, binding = 4, std430) readonly buffer CW { uint cw[]; };
layout(set = 0, binding = 5, std430) readonly buffer NW { uint nw[]; };

const uint RDV = R * DV;
shared float q_s[DK];
shared float k_s[DK];
shared float v_s[RDV];
shared float o_s[RDV];
shared float g_s[R];
shared float b_s[R];

void main() {
    uint kh = group_id();
    if (kh >= HK) {
        return;
    }
    uint t = gl_LocalInvocationID.x;
    uint wg = gl_WorkGroupSize.x;
    uint key = HK * DK;
    uint row = kh * W;

    // 1. The conv of the head's channels, its state shifted in place, silu.
    for (uint i = t; i < 2u * DK + RDV; i += wg) {
        uint c;
        uint xi;
        if (i < DK) {
            c = kh * DK + i;
            xi = row + QO + i;
        } else if (i < 2u * DK) {
            c = key + kh * DK + (i - DK);
            xi = row + KO + (i - DK);
        } else {
            c = 2u * key + kh * RDV + (i - 2u * DK);
            xi = row + VO + (i - 2u * DK);
        }
        float xv = x[xi];
        uint k = KM1 + 1u;
        float acc = LOAD(CW_DTYPE, cw, c * k + KM1) * xv;
        for (uint j = 0u; j < KM1; j++) {
            acc += LOAD(CW_DTYPE, cw, c * k + j) * cs[c * KM1 + j];
        }
        for (uint j = 0u; j < KM1; j++) {
            cs[c * KM1 + j] = j + 1u < KM1 ? cs[c * KM1 + j + 1u] : xv;
        }
        float a = silu(acc);
        if (i < DK) {
            q_s[i] = a;
        } else if (i < 2u * DK) {
            k_s[i - DK] = a;
        } else {
            v_s[i - 2u * DK] = a;
        }
    }
    barrier();

    // 2. l2 norms of q and k; the gates.
    float pq = 0.0;
    float pk = 0.0;
    for (uint i = t; i < DK; i += wg) {
        pq += q_s[i] * q_s[i];
        pk += k_s[i] * k_s[i];
    }
    float sq = inversesqrt(wg_sum(pq) + L2_EPS);
    float sk = inversesqrt(wg_sum(pk) + L2_EPS);
    for (uint i = t; i < DK; i += wg) {
        q_s[i] *= sq;
        k_s[i] *= sk;
    }
    for (uint i = t; i < R; i += wg) {
        g_s[i] = gate_g(kh * R + i);
        b_s[i] = gate_beta(kh * R + i);
    }
    barrier();

    // 3. The delta rule on each owned state column, then its readout.
    for (uint i = t; i < RDV; i += wg) {
        uint hh = i / DV;
        uint j = i - hh * DV;
        uint base = (kh * R + hh) * DK * DV + j;
        float decay = exp(g_s[hh]);
        float mem = 0.0;
        for (uint d = 0u; d < DK; d++) {
            mem += (st[base + d * DV] * decay) * k_s[d];
        }
        float delta = (v_s[i] - mem) * b_s[hh];
        float o = 0.0;
        for (uint d = 0u; d < DK; d++) {
            float s = st[base + d * DV] * decay + k_s[d] * delta;
            st[base + d * DV] = s;
            o += s * q_s[d];
        }
        o_s[i] = o * SCALE;
    }
    barrier();

    // 4. The gated rms norm of each value head.
    for (uint hh = 0u; hh < R; hh++) {
        float p = 0.0;
        for (uint j = t; j < DV; j += wg) {
            float o = o_s[hh * DV + j];
            p += o * o;
        }
        float inv = inversesqrt(wg_sum(p) / float(DV) + NORM_EPS);
        for (uint j = t; j < DV; j += wg) {
            float z = x[row + ZO + hh * DV + j];
            y[(kh * R + hh) * DV + j] = o_s[hh * DV + j] * inv * LOAD(NW_DTYPE, nw, j) * silu(z);
        }
    }
}
