// The router anchor (vkfuse fuse::codegen generates the including source): softmax over the N
// router logits, the indices of the K largest probabilities (largest first, ties to the lower
// index, as top_k.comp picks them), and their probabilities renormalised to sum 1 (gather, sum
// and div), in one workgroup.
// Bindings: 0 = out: weights f32[K] at element 0, indices i32[K] at element IDS (the same
// buffer seen as ints), 1 = logits f32[N].
// Spec constants: 0 = workgroup size (power of two), 1 = N, 2 = K, 3 = IDS.
// Dispatch: one workgroup.

#include "reduce.glsl"
#include "argbest.glsl"

layout(constant_id = 1) const uint N = 1;
layout(constant_id = 2) const uint K = 1;
layout(constant_id = 3) const uint IDS = 64;

layout(set = 0, binding = 0, std430) writeonly buffer OutF { float wts[]; };
layout(set = 0, binding = 0, std430) writeonly buffer OutI { int ids[]; };
layout(set = 0, binding = 1, std430) readonly buffer X { float x[]; };

shared float p[N];
shared float picked[K];

void main() {
    uint t = gl_LocalInvocationID.x;
    // Softmax, as softmax.comp computes it.
    float m = NEG_BIG;
    for (uint i = t; i < N; i += gl_WorkGroupSize.x) {
        m = max(m, x[i]);
    }
    m = wg_max(m);
    float s = 0.0;
    for (uint i = t; i < N; i += gl_WorkGroupSize.x) {
        float e = exp(x[i] - m);
        p[i] = e;
        s += e;
    }
    s = wg_sum(s);
    float inv = 1.0 / s;
    for (uint i = t; i < N; i += gl_WorkGroupSize.x) {
        p[i] *= inv;
    }
    barrier();
    // Top K of the probabilities, as top_k.comp picks them.
    uint prev_key = 0u;
    uint prev_idx = NONE;
    for (uint r = 0u; r < K; r++) {
        uint bk = 0u;
        uint bi = NONE;
        for (uint i = t; i < N; i += gl_WorkGroupSize.x) {
            uint key = order_key(p[i]);
            bool after_prev = prev_idx == NONE || before(prev_key, prev_idx, key, i);
            if (after_prev && before(key, i, bk, bi)) {
                bk = key;
                bi = i;
            }
        }
        uint best = wg_argbest(bk, bi);
        if (t == 0u) {
            ids[IDS + r] = int(best);
            picked[r] = p[best];
        }
        prev_idx = best;
        prev_key = order_key(p[best]);
    }
    barrier();
    // Renormalised: w / sum(w), summed in pick order.
    if (t == 0u) {
        float total = 0.0;
        for (uint r = 0u; r < K; r++) {
            total += picked[r];
        }
        for (uint r = 0u; r < K; r++) {
            wts[r] = picked[r] / total;
        }
    }
}
