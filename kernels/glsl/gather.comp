#version 450
#extension GL_GOOGLE_include_directive : require
// gather: y[j] = x[idx[j]] (the index clamped into 0..N, as the reference does).
// Bindings: 0 = y f32[K], 1 = x f32[N], 2 = idx i32[K].
// Spec constants: 0 = workgroup size, 1 = N, 2 = K.
// Dispatch: ceil(K / workgroup size).
#include "common.glsl"

layout(constant_id = 1) const uint N = 1;
layout(constant_id = 2) const uint K = 1;

layout(set = 0, binding = 0, std430) writeonly buffer Y { uint y[]; };
layout(set = 0, binding = 1, std430) readonly buffer X { uint x[]; };
layout(set = 0, binding = 2, std430) readonly buffer Idx { int idx[]; };

void main() {
    uint j = global_id();
    if (j >= K) {
        return;
    }
    y[j] = x[uint(clamp(idx[j], 0, int(N) - 1))];
}
