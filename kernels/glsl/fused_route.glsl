// The router anchor (vkfuse fuse::codegen generates the including source): the indices of the
// K largest of softmax(logits) (largest first, ties to the lower index, as top_k.comp picks
// them) and their probabilities renormalised to sum 1 (gather, sum and div), in one workgroup,
// by route_pick.glsl, as the expert kernels that route for themselves compute them.
// Bindings: 0 = out: weights f32[K] at element 0, indices i32[K] at element IDS (the same
// buffer seen as ints), 1 = logits f32[N].
// Spec constants: 0 = workgroup size, 1 = N, 2 = K, 3 = IDS.
// Dispatch: one workgroup.

layout(constant_id = 1) const uint N = 1;
layout(constant_id = 2) const uint K = 1;
layout(constant_id = 3) const uint IDS = 64;

layout(set = 0, binding = 0, std430) writeonly buffer OutF { float wts[]; };
layout(set = 0, binding = 0, std430) writeonly buffer OutI { int ids[]; };
layout(set = 0, binding = 1, std430) readonly buffer X { float x[]; };

#define ROUTE_LOGIT(i) x[i]
#include "route_pick.glsl"

void main() {
    route_pick();
    for (uint r = gl_LocalInvocationID.x; r < K; r += gl_WorkGroupSize.x) {
        ids[IDS + r] = int(route_id[r]);
        wts[r] = route_w[r];
    }
}
