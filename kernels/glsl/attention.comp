#version 450
#extension GL_GOOGLE_include_directive : require
// attention (decode): for query head h, kv head h / (HQ / HKV) (grouped-query attention),
//   y[h] = softmax_j(SCALE * q[h] . k[j]) . v[j]  over slots j = 0..=pos,
// with the position read from its buffer (a position past CAP attends all CAP slots).
// One workgroup per query head, online softmax over tiles of T = WG / P positions:
//   scores:  P invocations per position each dot a strided part of the row (16-byte loads when
//            D % 4 == 0, P lanes reading adjacent vectors), partials summed in shared memory;
//   softmax: the tile's max by a shared-memory tree over T, weights exp(s - m) kept in shared;
//   values:  the workgroup is G = WG / D groups of D invocations; group g accumulates
//            positions g, g + G, .. of the tile for its output dim (coalesced rows of v), with
//            its own running sum of weights; groups are summed at the end.
// Shared memory depends on D and WG only, never on the capacity.
// Bindings: 0 = y f32[HQ, D], 1 = q f32[HQ, D], 2 = k cache [HKV, CAP, D], 3 = v cache
// [HKV, CAP, D] (f32, or f16 with KV_DTYPE F16: kv_cache.glsl), 4 = pos i32[1].
// Spec constants: 0 = workgroup size (power of two, >= 4 and >= D), 1 = HQ, 2 = HKV, 3 = CAP,
// 4 = D, 5 = SCALE (f32).
// Dispatch: HQ workgroups (one per query head).
#include "common.glsl"

layout(constant_id = 1) const uint HQ = 1;
layout(constant_id = 2) const uint HKV = 1;
layout(constant_id = 3) const uint CAP = 1;
layout(constant_id = 4) const uint D = 64;
layout(constant_id = 5) const float SCALE = 1.0;

layout(set = 0, binding = 0, std430) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1, std430) readonly buffer Q { float q[]; };
#define KV_K_BINDING 2
#define KV_V_BINDING 3
#define KV_WRITABLE 0
#include "kv_cache.glsl"
layout(set = 0, binding = 4, std430) readonly buffer Pos { int pos[]; };

// Invocations per position in the score phase.
const uint P = 4u;
const uint T = gl_WorkGroupSize.x / P;
const uint G = gl_WorkGroupSize.x / D;

shared float q_s[D];
shared float part[gl_WorkGroupSize.x];
shared float w_s[T];
shared float max_s[T];

void main() {
    uint h = group_id();
    if (h >= HQ) {
        return;
    }
    uint t = gl_LocalInvocationID.x;
    uint kv_base = (h / (HQ / HKV)) * CAP * D;
    uint n = uint(clamp(pos[0], 0, int(CAP) - 1)) + 1u;
    uint lane = t % P;
    uint slot = t / P;
    uint g = t / D;
    uint c = t - g * D;

    for (uint i = t; i < D; i += gl_WorkGroupSize.x) {
        q_s[i] = q[h * D + i];
    }
    barrier();

    float m = NEG_BIG;
    float l = 0.0;
    float acc = 0.0;
    for (uint tile = 0u; tile < n; tile += T) {
        // Scores: P partial dots per position.
        uint j = tile + slot;
        float d = 0.0;
        if (j < n) {
            uint row = kv_base + j * D;
            if (D % 4u == 0u) {
                for (uint c4 = lane; c4 < D / 4u; c4 += P) {
                    uint e = 4u * c4;
                    d += dot(vec4(q_s[e], q_s[e + 1u], q_s[e + 2u], q_s[e + 3u]), kv_k4(row / 4u + c4));
                }
            } else {
                for (uint e = lane; e < D; e += P) {
                    d += q_s[e] * kv_k(row + e);
                }
            }
        }
        part[t] = d;
        barrier();
        // The tile's scores and their max.
        if (t < T) {
            float s = NEG_BIG;
            if (tile + t < n) {
                float sum = 0.0;
                for (uint i = 0u; i < P; i++) {
                    sum += part[t * P + i];
                }
                s = sum * SCALE;
            }
            w_s[t] = s;
            max_s[t] = s;
        }
        barrier();
        for (uint stride = T / 2u; stride > 0u; stride >>= 1u) {
            if (t < stride) {
                max_s[t] = max(max_s[t], max_s[t + stride]);
            }
            barrier();
        }
        float m_new = max(m, max_s[0]);
        float alpha = exp(m - m_new);
        m = m_new;
        if (t < T) {
            w_s[t] = tile + t < n ? exp(w_s[t] - m_new) : 0.0;
        }
        barrier();
        // Values: group g takes positions g, g + G, .. of the tile.
        if (g < G) {
            uint count = min(T, n - tile);
            uint vrow = kv_base + tile * D + c;
            float a = acc * alpha;
            float ws = 0.0;
            for (uint jj = g; jj < count; jj += G) {
                float w = w_s[jj];
                a += w * kv_v(vrow + jj * D);
                ws += w;
            }
            acc = a;
            l = l * alpha + ws;
        }
        barrier();
    }

    // Sum the groups: outputs, then weight totals.
    part[t] = g < G ? acc : 0.0;
    barrier();
    float total = 0.0;
    if (t < D) {
        for (uint i = 0u; i < G; i++) {
            total += part[i * D + t];
        }
    }
    barrier();
    if (g < G && c == 0u) {
        part[g] = l;
    }
    barrier();
    if (t < D) {
        float lsum = 0.0;
        for (uint i = 0u; i < G; i++) {
            lsum += part[i];
        }
        y[h * D + t] = total / lsum;
    }
}
