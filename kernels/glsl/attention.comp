#version 450
#extension GL_GOOGLE_include_directive : require
// attention (decode): for query head h, kv head h / (HQ / HKV) (grouped-query attention),
//   y[h] = softmax_j(SCALE * q[h] . k[j]) . v[j]  over slots j = 0..=pos,
// with the position read from its buffer (slots past CAP are never read). Online softmax over
// tiles of WG positions: each invocation scores one position of the tile (a D-long dot with
// 16-byte loads when D % 4 == 0), the tile's max and sum are shared-memory reductions, and each
// invocation accumulates output dims t, t + WG, .. (D <= 4 * WG) from the tile's weights.
// Shared memory does not depend on the capacity: q (D floats) and one tile of weights.
// Bindings: 0 = y f32[HQ, D], 1 = q f32[HQ, D], 2 = k cache f32[HKV, CAP, D],
// 3 = v cache f32[HKV, CAP, D], 4 = pos i32[1].
// Spec constants: 0 = workgroup size (power of two), 1 = HQ, 2 = HKV, 3 = CAP, 4 = D,
// 5 = SCALE (f32).
// Dispatch: HQ workgroups (one per query head).
#include "common.glsl"
#include "reduce.glsl"

layout(constant_id = 1) const uint HQ = 1;
layout(constant_id = 2) const uint HKV = 1;
layout(constant_id = 3) const uint CAP = 1;
layout(constant_id = 4) const uint D = 64;
layout(constant_id = 5) const float SCALE = 1.0;

layout(set = 0, binding = 0, std430) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1, std430) readonly buffer Q { float q[]; };
layout(set = 0, binding = 2, std430) readonly buffer K { float k[]; };
layout(set = 0, binding = 2, std430) readonly buffer K4 { vec4 k4[]; };
layout(set = 0, binding = 3, std430) readonly buffer V { float v[]; };
layout(set = 0, binding = 4, std430) readonly buffer Pos { int pos[]; };

const uint MAX_DIMS_PER_INVOCATION = 4u;

shared float q_s[D];
shared float p_s[gl_WorkGroupSize.x];

void main() {
    uint h = group_id();
    if (h >= HQ) {
        return;
    }
    uint t = gl_LocalInvocationID.x;
    uint wg = gl_WorkGroupSize.x;
    uint kv_base = (h / (HQ / HKV)) * CAP * D;
    uint n = uint(clamp(pos[0], 0, int(CAP) - 1)) + 1u;

    for (uint c = t; c < D; c += wg) {
        q_s[c] = q[h * D + c];
    }
    barrier();

    float m = NEG_BIG;
    float l = 0.0;
    float acc[MAX_DIMS_PER_INVOCATION];
    for (uint r = 0u; r < MAX_DIMS_PER_INVOCATION; r++) {
        acc[r] = 0.0;
    }

    for (uint tile = 0u; tile < n; tile += wg) {
        uint j = tile + t;
        float s = NEG_BIG;
        if (j < n) {
            float d = 0.0;
            uint row = kv_base + j * D;
            if (D % 4u == 0u) {
                for (uint c = 0u; c < D; c += 4u) {
                    d += dot(vec4(q_s[c], q_s[c + 1u], q_s[c + 2u], q_s[c + 3u]), k4[(row + c) / 4u]);
                }
            } else {
                for (uint c = 0u; c < D; c++) {
                    d += q_s[c] * k[row + c];
                }
            }
            s = d * SCALE;
        }
        float m_new = max(m, wg_max(s));
        float p = j < n ? exp(s - m_new) : 0.0;
        p_s[t] = p;
        float alpha = exp(m - m_new);
        // wg_sum's barriers also publish p_s.
        l = l * alpha + wg_sum(p);
        m = m_new;
        uint count = min(wg, n - tile);
        for (uint r = 0u; r < MAX_DIMS_PER_INVOCATION; r++) {
            uint c = t + r * wg;
            if (c < D) {
                float a = acc[r] * alpha;
                uint vrow = kv_base + tile * D + c;
                for (uint jj = 0u; jj < count; jj++) {
                    a += p_s[jj] * v[vrow + jj * D];
                }
                acc[r] = a;
            }
        }
        barrier();
    }

    float inv = 1.0 / l;
    for (uint r = 0u; r < MAX_DIMS_PER_INVOCATION; r++) {
        uint c = t + r * wg;
        if (c < D) {
            y[h * D + c] = acc[r] * inv;
        }
    }
}
