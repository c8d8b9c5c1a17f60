#version 450
#extension GL_GOOGLE_include_directive : require
// delta_rule_update (gated delta rule, one decode step), per value head h with key head
// h / (HV / HK) and each column j of the state:
//   s'[i, j]  = s[h, i, j] * exp(g[h])
//   delta_j   = beta[h] * (v[h, j] - sum_i s'[i, j] * k[i])
//   out[h, i, j] = s'[i, j] + k[i] * delta_j
// Columns are independent, so one invocation owns one column (reads it twice, writes it once);
// binding 0 may therefore alias binding 1 (an in-place update).
// Bindings: 0 = out f32[HV, DK, DV], 1 = s f32[HV, DK, DV], 2 = k f32[HK, DK], 3 = v f32[HV, DV],
// 4 = g f32[HV], 5 = beta f32[HV].
// Spec constants: 0 = workgroup size, 1 = HV, 2 = HK, 3 = DK, 4 = DV.
// Dispatch: HV * ceil(DV / workgroup size) workgroups; k of the head is staged in shared memory.
#include "common.glsl"

layout(constant_id = 1) const uint HV = 1;
layout(constant_id = 2) const uint HK = 1;
layout(constant_id = 3) const uint DK = 1;
layout(constant_id = 4) const uint DV = 1;

layout(set = 0, binding = 0, std430) buffer Out { float o[]; };
layout(set = 0, binding = 1, std430) readonly buffer S { float s[]; };
layout(set = 0, binding = 2, std430) readonly buffer Kb { float k[]; };
layout(set = 0, binding = 3, std430) readonly buffer Vb { float v[]; };
layout(set = 0, binding = 4, std430) readonly buffer G { float g[]; };
layout(set = 0, binding = 5, std430) readonly buffer Beta { float beta[]; };

shared float k_s[DK];

void main() {
    uint blocks = (DV + gl_WorkGroupSize.x - 1u) / gl_WorkGroupSize.x;
    uint grp = group_id();
    uint h = grp / blocks;
    if (h >= HV) {
        return;
    }
    uint t = gl_LocalInvocationID.x;
    uint j = (grp - h * blocks) * gl_WorkGroupSize.x + t;
    uint kh = h / (HV / HK);
    for (uint i = t; i < DK; i += gl_WorkGroupSize.x) {
        k_s[i] = k[kh * DK + i];
    }
    barrier();
    if (j >= DV) {
        return;
    }
    float decay = exp(g[h]);
    uint base = h * DK * DV + j;
    float mem = 0.0;
    for (uint i = 0u; i < DK; i++) {
        mem += (s[base + i * DV] * decay) * k_s[i];
    }
    float delta = (v[h * DV + j] - mem) * beta[h];
    for (uint i = 0u; i < DK; i++) {
        o[base + i * DV] = s[base + i * DV] * decay + k_s[i] * delta;
    }
}
