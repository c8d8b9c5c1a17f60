#version 450
#extension GL_GOOGLE_include_directive : require
// top_k: the indices of the K largest of x[N], largest first, ties to the lower index (the
// order is Rust's total_cmp on values, then the index). K rounds; round r picks the best
// element strictly after round r-1's pick in that order, so no element needs marking.
// Bindings: 0 = y i32[K], 1 = x f32[N].
// Spec constants: 0 = workgroup size (power of two), 1 = N, 2 = K.
// Dispatch: one workgroup.
#include "common.glsl"
#include "argbest.glsl"

layout(constant_id = 1) const uint N = 1;
layout(constant_id = 2) const uint K = 1;

layout(set = 0, binding = 0, std430) writeonly buffer Y { int y[]; };
layout(set = 0, binding = 1, std430) readonly buffer X { float x[]; };

void main() {
    uint t = gl_LocalInvocationID.x;
    uint prev_key = 0u;
    uint prev_idx = NONE;
    for (uint r = 0u; r < K; r++) {
        uint bk = 0u;
        uint bi = NONE;
        for (uint i = t; i < N; i += gl_WorkGroupSize.x) {
            uint key = order_key(x[i]);
            bool after_prev = prev_idx == NONE || before(prev_key, prev_idx, key, i);
            if (after_prev && before(key, i, bk, bi)) {
                bk = key;
                bi = i;
            }
        }
        uint best = wg_argbest(bk, bi);
        if (t == 0u) {
            y[r] = int(best);
        }
        prev_idx = best;
        prev_key = order_key(x[best]);
    }
}
