#version 450
#extension GL_GOOGLE_include_directive : require
// sum over one axis: viewing x as [OUTER, LEN, INNER], y[o, i] = sum_a x[o, a, i].
// Bindings: 0 = y f32[OUTER * INNER], 1 = x f32[OUTER, LEN, INNER].
// Spec constants: 0 = workgroup size (power of two), 1 = OUTER, 2 = LEN, 3 = INNER,
// 4 = ROWWISE (1: one workgroup per output reduces its row in shared memory, chosen when
// INNER == 1; 0: one invocation per output walks the axis).
// Dispatch: ROWWISE ? OUTER : ceil(OUTER*INNER / workgroup size).
#include "common.glsl"
#include "reduce.glsl"

layout(constant_id = 1) const uint OUTER = 1;
layout(constant_id = 2) const uint LEN = 1;
layout(constant_id = 3) const uint INNER = 1;
layout(constant_id = 4) const uint ROWWISE = 0;

layout(set = 0, binding = 0, std430) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1, std430) readonly buffer X { float x[]; };

void main() {
    if (ROWWISE != 0u) {
        uint o = group_id();
        if (o >= OUTER) {
            return;
        }
        float acc = 0.0;
        for (uint a = gl_LocalInvocationID.x; a < LEN; a += gl_WorkGroupSize.x) {
            acc += x[o * LEN + a];
        }
        acc = wg_sum(acc);
        if (gl_LocalInvocationID.x == 0u) {
            y[o] = acc;
        }
    } else {
        uint e = global_id();
        if (e >= OUTER * INNER) {
            return;
        }
        uint o = e / INNER;
        uint i = e - o * INNER;
        float acc = 0.0;
        for (uint a = 0u; a < LEN; a++) {
            acc += x[(o * LEN + a) * INNER + i];
        }
        y[e] = acc;
    }
}
