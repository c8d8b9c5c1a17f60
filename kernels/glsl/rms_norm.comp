#version 450
#extension GL_GOOGLE_include_directive : require
// rms_norm over rows of N: y = x / sqrt(mean(x^2) + EPS) * w   (or * (1 + w) when ZERO_CENTERED).
// Bindings: 0 = y f32[ROWS*N], 1 = x f32[ROWS*N], 2 = w [N] of DTYPE_2.
// Spec constants: 0 = workgroup size (power of two), 1 = N, 2 = EPS (f32), 3 = ZERO_CENTERED
// (0 or 1), 4 = ROWS.
// Dispatch: one workgroup per row (ROWS).
#include "common.glsl"
#include "reduce.glsl"

layout(constant_id = 1) const uint N = 1;
layout(constant_id = 2) const float EPS = 1e-6;
layout(constant_id = 3) const uint ZERO_CENTERED = 0;
layout(constant_id = 4) const uint ROWS = 1;

layout(set = 0, binding = 0, std430) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1, std430) readonly buffer X { float x[]; };
layout(set = 0, binding = 2, std430) readonly buffer W { uint w[]; };

void main() {
    uint row = group_id();
    if (row >= ROWS) {
        return;
    }
    uint t = gl_LocalInvocationID.x;
    uint base = row * N;
    float ss = 0.0;
    for (uint i = t; i < N; i += gl_WorkGroupSize.x) {
        float v = x[base + i];
        ss += v * v;
    }
    ss = wg_sum(ss);
    float s = inversesqrt(ss / float(N) + EPS);
    for (uint i = t; i < N; i += gl_WorkGroupSize.x) {
        float wi = LOAD(DTYPE_2, w, i);
        if (ZERO_CENTERED != 0u) {
            wi += 1.0;
        }
        y[base + i] = x[base + i] * s * wi;
    }
}
