// The attention-block anchor (vkfuse fuse::codegen generates the including source): per kv
// head g (one workgroup), for the group's k row and each of its query heads: optional rms norm
// over the head (QK_NORM), rope of the first ROT dims at the position read from its buffer;
// K and V written at that position of the caches; then decode attention of every query head of
// the group over slots 0..=pos, exactly as attention.comp computes it.
//
// Visibility: the caches are `coherent`; after writing its head's fresh rows the workgroup runs
// memoryBarrierBuffer() then barrier(), so every invocation of the workgroup sees them before
// reading; no other workgroup touches head g's rows in this dispatch.
//
// The including source defines QK_NORM (0/1), QN_DTYPE and KN_DTYPE (norm weights' dtypes),
// NORM_ZC, ROT (rotary dims, even) and `float inv_freq(uint i)` for i < ROT/2.
// Bindings: 0 = y f32[HQ, D], 1 = q f32[HQ, D], 2 = k f32[HKV, D], 3 = v f32[HKV, D],
// 4 = k cache f32[HKV, CAP, D], 5 = v cache f32[HKV, CAP, D], 6 = pos i32[1],
// 7 = q norm weight [D], 8 = k norm weight [D] (when QK_NORM).
// Spec constants: 0 = workgroup size (power of two, >= 4 and >= D), 1 = HQ, 2 = HKV, 3 = CAP,
// 4 = D, 5 = SCALE (f32), 6 = EPS (f32).
// Dispatch: HKV workgroups.

#include "reduce.glsl"
#include "fused_rope.glsl"

layout(constant_id = 1) const uint HQ = 1;
layout(constant_id = 2) const uint HKV = 1;
layout(constant_id = 3) const uint CAP = 1;
layout(constant_id = 4) const uint D = 64;
layout(constant_id = 5) const float SCALE = 1.0;
layout(constant_id = 6) const float EPS = 0.0;

layout(set = 0, binding = 0, std430) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1, std430) readonly buffer Q { float q[]; };
layout(set = 0, binding = 2, std430) readonly buffer Kn { float k_new[]; };
layout(set = 0, binding = 3, std430) readonly buffer Vn { float v_new[]; };
layout(set = 0, binding = 4, std430) coherent buffer K { float k[]; };
layout(set = 0, binding = 4, std430) coherent buffer K4 { vec4 k4[]; };
layout(set = 0, binding = 5, std430) coherent buffer V { float v[]; };
layout(set = 0, binding = 6, std430) readonly buffer Pos { int pos[]; };
#if QK_NORM
layout(set = 0, binding = 7, std430) readonly buffer QN { uint qn[]; };
layout(set = 0, binding = 8, std430) readonly buffer KN { uint kn[]; };
#endif

// Invocations per position in the score phase.
const uint P = 4u;
const uint T = gl_WorkGroupSize.x / P;
const uint G = gl_WorkGroupSize.x / D;

shared float q_s[D];
shared float row_s[D];
shared float part[gl_WorkGroupSize.x];
shared float w_s[T];
shared float max_s[T];

// Element t (< D) of a head row after the norm and rope; every invocation must call it
// (uniform control flow). `is_q` picks the norm weight.
float prepare(float v, bool is_q, float angle_pos) {
    uint t = gl_LocalInvocationID.x;
#if QK_NORM
    float ss = wg_sum(t < D ? v * v : 0.0);
    if (t < D) {
        float wn = is_q ? LOAD(QN_DTYPE, qn, t) : LOAD(KN_DTYPE, kn, t);
        if (NORM_ZC != 0) {
            wn += 1.0;
        }
        v = v * inversesqrt(ss / float(D) + EPS) * wn;
    }
#endif
    if (t < D) {
        row_s[t] = v;
    }
    barrier();
    const uint half_rot = ROT / 2u;
    if (t < ROT) {
        uint f = t < half_rot ? t : t - half_rot;
        vec2 sc = sin_cos(inv_freq(f) * angle_pos);
        float a = row_s[f];
        float b = row_s[f + half_rot];
        v = t < half_rot ? a * sc.y - b * sc.x : b * sc.y + a * sc.x;
    }
    barrier();
    return v;
}

// Decode attention of query head h (its row in q_s) over slots 0..n-1 of kv head base kv_base.
void attend(uint h, uint kv_base, uint n) {
    uint t = gl_LocalInvocationID.x;
    uint lane = t % P;
    uint slot = t / P;
    uint g = t / D;
    uint c = t - g * D;
    float m = NEG_BIG;
    float l = 0.0;
    float acc = 0.0;
    for (uint tile = 0u; tile < n; tile += T) {
        uint j = tile + slot;
        float d = 0.0;
        if (j < n) {
            uint row = kv_base + j * D;
            if (D % 4u == 0u) {
                for (uint c4 = lane; c4 < D / 4u; c4 += P) {
                    uint e = 4u * c4;
                    d += dot(vec4(q_s[e], q_s[e + 1u], q_s[e + 2u], q_s[e + 3u]), k4[row / 4u + c4]);
                }
            } else {
                for (uint e = lane; e < D; e += P) {
                    d += q_s[e] * k[row + e];
                }
            }
        }
        part[t] = d;
        barrier();
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
        if (g < G) {
            uint count = min(T, n - tile);
            uint vrow = kv_base + tile * D + c;
            float a = acc * alpha;
            float ws = 0.0;
            for (uint jj = g; jj < count; jj += G) {
                float w = w_s[jj];
                a += w * v[vrow + jj * D];
                ws += w;
            }
            acc = a;
            l = l * alpha + ws;
        }
        barrier();
    }
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
    barrier();
}

void main() {
    uint g = group_id();
    if (g >= HKV) {
        return;
    }
    uint t = gl_LocalInvocationID.x;
    int p = pos[0];
    float angle_pos = float(p);
    uint kv_base = g * CAP * D;

    // The fresh K and V rows of this kv head, written at the position.
    float kv = prepare(t < D ? k_new[g * D + t] : 0.0, false, angle_pos);
    if (t < D && p >= 0 && uint(p) < CAP) {
        k[kv_base + uint(p) * D + t] = kv;
        v[kv_base + uint(p) * D + t] = v_new[g * D + t];
    }
    memoryBarrierBuffer();
    barrier();

    uint n = uint(clamp(p, 0, int(CAP) - 1)) + 1u;
    uint group = HQ / HKV;
    for (uint j = 0u; j < group; j++) {
        uint h = g * group + j;
        float qv = prepare(t < D ? q[h * D + t] : 0.0, true, angle_pos);
        if (t < D) {
            q_s[t] = qv;
        }
        barrier();
        attend(h, kv_base, n);
    }
}
