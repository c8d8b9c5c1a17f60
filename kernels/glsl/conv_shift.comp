#version 450
#extension GL_GOOGLE_include_directive : require
// conv_shift: the conv window without its oldest column, x appended:
//   y[c, j] = j + 1 < KM1 ? state[c, j + 1] : x[c].
// Bindings: 0 = y f32[C, KM1], 1 = state f32[C, KM1], 2 = x f32[C].
// Spec constants: 0 = workgroup size, 1 = C, 2 = KM1.
// Dispatch: ceil(C*KM1 / workgroup size), one invocation per element.
#include "common.glsl"

layout(constant_id = 1) const uint C = 1;
layout(constant_id = 2) const uint KM1 = 1;

layout(set = 0, binding = 0, std430) writeonly buffer Y { uint y[]; };
layout(set = 0, binding = 1, std430) readonly buffer S { uint state[]; };
layout(set = 0, binding = 2, std430) readonly buffer X { uint x[]; };

void main() {
    uint i = global_id();
    if (i >= C * KM1) {
        return;
    }
    uint c = i / KM1;
    uint j = i - c * KM1;
    y[i] = j + 1u < KM1 ? state[i + 1u] : x[c];
}
