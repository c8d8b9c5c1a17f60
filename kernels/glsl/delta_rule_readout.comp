#version 450
#extension GL_GOOGLE_include_directive : require
// delta_rule_readout: y[h, j] = SCALE * sum_i s[h, i, j] * q[h / (HV / HK), i].
// Bindings: 0 = y f32[HV, DV], 1 = s f32[HV, DK, DV], 2 = q f32[HK, DK].
// Spec constants: 0 = workgroup size, 1 = HV, 2 = HK, 3 = DK, 4 = DV, 5 = SCALE (f32).
// Dispatch: HV * ceil(DV / workgroup size) workgroups, one invocation per output; q of the head
// is staged in shared memory.
#include "common.glsl"

layout(constant_id = 1) const uint HV = 1;
layout(constant_id = 2) const uint HK = 1;
layout(constant_id = 3) const uint DK = 1;
layout(constant_id = 4) const uint DV = 1;
layout(constant_id = 5) const float SCALE = 1.0;

layout(set = 0, binding = 0, std430) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1, std430) readonly buffer S { float s[]; };
layout(set = 0, binding = 2, std430) readonly buffer Q { float q[]; };

shared float q_s[DK];

void main() {
    uint blocks = (DV + gl_WorkGroupSize.x - 1u) / gl_WorkGroupSize.x;
    uint grp = group_id();
    uint h = grp / blocks;
    if (h >= HV) {
        return;
    }
    uint t = gl_LocalInvocationID.x;
    uint j = (grp - h * blocks) * gl_WorkGroupSize.x + t;
    uint qh = h / (HV / HK);
    for (uint i = t; i < DK; i += gl_WorkGroupSize.x) {
        q_s[i] = q[qh * DK + i];
    }
    barrier();
    if (j >= DV) {
        return;
    }
    uint base = h * DK * DV + j;
    float acc = 0.0;
    for (uint i = 0u; i < DK; i++) {
        acc += s[base + i * DV] * q_s[i];
    }
    y[h * DV + j] = acc * SCALE;
}
