#version 450
#extension GL_GOOGLE_include_directive : require
// causal_conv1d: depthwise convolution of each channel over the window [state | x] (oldest
// first): y[c] = w[c, KM1] * x[c] + sum_j w[c, j] * state[c, j].
// Bindings: 0 = y f32[C], 1 = state f32[C, KM1], 2 = x f32[C], 3 = w [C, KM1 + 1] of DTYPE_3.
// Spec constants: 0 = workgroup size, 1 = C, 2 = KM1 (kernel size - 1).
// Dispatch: ceil(C / workgroup size), one invocation per channel.
#include "common.glsl"

layout(constant_id = 1) const uint C = 1;
layout(constant_id = 2) const uint KM1 = 1;

layout(set = 0, binding = 0, std430) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1, std430) readonly buffer S { float state[]; };
layout(set = 0, binding = 2, std430) readonly buffer X { float x[]; };
layout(set = 0, binding = 3, std430) readonly buffer W { uint w[]; };

void main() {
    uint c = global_id();
    if (c >= C) {
        return;
    }
    uint k = KM1 + 1u;
    float acc = LOAD(DTYPE_3, w, c * k + KM1) * x[c];
    for (uint j = 0u; j < KM1; j++) {
        acc += LOAD(DTYPE_3, w, c * k + j) * state[c * KM1 + j];
    }
    y[c] = acc;
}
