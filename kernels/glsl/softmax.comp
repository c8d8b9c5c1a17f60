#version 450
#extension GL_GOOGLE_include_directive : require
// softmax over rows of N: y = exp(x - max) / sum(exp(x - max)).
// Bindings: 0 = y f32[ROWS*N], 1 = x f32[ROWS*N].
// Spec constants: 0 = workgroup size (power of two), 1 = N, 2 = ROWS.
// Dispatch: one workgroup per row (ROWS).
#include "common.glsl"
#include "reduce.glsl"

layout(constant_id = 1) const uint N = 1;
layout(constant_id = 2) const uint ROWS = 1;

layout(set = 0, binding = 0, std430) buffer Y { float y[]; };
layout(set = 0, binding = 1, std430) readonly buffer X { float x[]; };

void main() {
    uint row = group_id();
    if (row >= ROWS) {
        return;
    }
    uint t = gl_LocalInvocationID.x;
    uint base = row * N;
    float m = NEG_BIG;
    for (uint i = t; i < N; i += gl_WorkGroupSize.x) {
        m = max(m, x[base + i]);
    }
    m = wg_max(m);
    float s = 0.0;
    for (uint i = t; i < N; i += gl_WorkGroupSize.x) {
        float e = exp(x[base + i] - m);
        y[base + i] = e;
        s += e;
    }
    s = wg_sum(s);
    float inv = 1.0 / s;
    for (uint i = t; i < N; i += gl_WorkGroupSize.x) {
        y[base + i] *= inv;
    }
}
