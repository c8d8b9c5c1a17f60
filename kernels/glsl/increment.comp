#version 450
#extension GL_GOOGLE_include_directive : require
// increment: y[0] = x[0] + 1 (the position advance, on the device).
// Bindings: 0 = y i32[1], 1 = x i32[1].
// Spec constants: 0 = workgroup size (1).
// Dispatch: one workgroup.
#include "common.glsl"

layout(set = 0, binding = 0, std430) writeonly buffer Y { int y[]; };
layout(set = 0, binding = 1, std430) readonly buffer X { int x[]; };

void main() {
    if (gl_LocalInvocationID.x == 0u) {
        y[0] = x[0] + 1;
    }
}
