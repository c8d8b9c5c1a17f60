#version 450
#extension GL_GOOGLE_include_directive : require
// argmax: y[0] = the index of the largest of x[N], ties to the lower index (total_cmp order).
// Bindings: 0 = y i32[1], 1 = x f32[N].
// Spec constants: 0 = workgroup size (power of two), 1 = N.
// Dispatch: one workgroup (up to 1024 invocations); each invocation scans a stride with four
// loads in flight, then a shared-memory reduction.
#include "common.glsl"
#include "argbest.glsl"

layout(constant_id = 1) const uint N = 1;

layout(set = 0, binding = 0, std430) writeonly buffer Y { int y[]; };
layout(set = 0, binding = 1, std430) readonly buffer X { float x[]; };

void consider(float v, uint i, inout uint bk, inout uint bi) {
    uint key = order_key(v);
    if (before(key, i, bk, bi)) {
        bk = key;
        bi = i;
    }
}

void main() {
    uint t = gl_LocalInvocationID.x;
    uint wg = gl_WorkGroupSize.x;
    uint bk = 0u;
    uint bi = NONE;
    uint i = t;
    // Four independent loads in flight per invocation (one workgroup reads the whole vector).
    for (; i + 3u * wg < N; i += 4u * wg) {
        float a = x[i];
        float b = x[i + wg];
        float c = x[i + 2u * wg];
        float d = x[i + 3u * wg];
        consider(a, i, bk, bi);
        consider(b, i + wg, bk, bi);
        consider(c, i + 2u * wg, bk, bi);
        consider(d, i + 3u * wg, bk, bi);
    }
    for (; i < N; i += wg) {
        consider(x[i], i, bk, bi);
    }
    uint best = wg_argbest(bk, bi);
    if (t == 0u) {
        y[0] = int(best);
    }
}
