#version 450
#extension GL_GOOGLE_include_directive : require
// argmax: y[0] = the index of the largest of x[N], ties to the lower index (total_cmp order).
// Bindings: 0 = y i32[1], 1 = x f32[N].
// Spec constants: 0 = workgroup size (power of two), 1 = N.
// Dispatch: one workgroup; each invocation scans a stride, then a shared-memory reduction.
#include "common.glsl"
#include "argbest.glsl"

layout(constant_id = 1) const uint N = 1;

layout(set = 0, binding = 0, std430) writeonly buffer Y { int y[]; };
layout(set = 0, binding = 1, std430) readonly buffer X { float x[]; };

void main() {
    uint t = gl_LocalInvocationID.x;
    uint bk = 0u;
    uint bi = NONE;
    for (uint i = t; i < N; i += gl_WorkGroupSize.x) {
        uint key = order_key(x[i]);
        if (before(key, i, bk, bi)) {
            bk = key;
            bi = i;
        }
    }
    uint best = wg_argbest(bk, bi);
    if (t == 0u) {
        y[0] = int(best);
    }
}
