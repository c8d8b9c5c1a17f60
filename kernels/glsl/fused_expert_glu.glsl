// The expert SwiGLU anchor (vkfuse fuse::codegen generates the including source): for each
// chosen expert j and row o, y[j, o] = silu(gate[idx[j], o] . x) * (up[idx[j], o] . x): what the
// two expert_matvec kernels (gate, up), silu and mul compute, in one dispatch. The gate and up
// stacks are packed one after the other at compile time ([2E, O, I]: gate experts, then up).
// The including source defines DTYPE_1 (the weights' dtype).
// With ROUTED defined, every workgroup routes for itself from the router's logits
// (route_pick.glsl) instead of reading the router kernel's indices: the router's own level
// and barrier go.
// Bindings: 0 = y f32[K, O], 1 = w [2E, O, I] of DTYPE_1, 2 = idx i32[K] (ROUTED: the router
// logits f32[N]), 3 = x f32[I].
// Spec constants: 0 = workgroup size (power of two), 1 = O, 2 = I, 3 = ROWS (rows per
// workgroup, 1..=4: the gate's and the up's rows are one pass of 2 ROWS dots), 4 = VEC4 (see
// matvec_core.glsl), 5 = E, 6 = K, 7 = N (ROUTED).
// Dispatch: K * ceil(O / ROWS) workgroups.

layout(set = 0, binding = 0, std430) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1, std430) readonly buffer W { uint w[]; };
layout(set = 0, binding = 1, std430) readonly buffer W4 { uvec4 w4[]; };
layout(set = 0, binding = 1, std430) readonly buffer WPair { uvec2 w_pair[]; };
layout(set = 0, binding = 3, std430) readonly buffer X { float x[]; };
layout(set = 0, binding = 3, std430) readonly buffer X4 { vec4 x4[]; };

#include "matvec_core.glsl"
#include "expert_dots.glsl"

layout(constant_id = 5) const uint E = 1;
layout(constant_id = 6) const uint K = 1;

#ifdef ROUTED
layout(constant_id = 7) const uint N = 1;
layout(set = 0, binding = 2, std430) readonly buffer Logits { float logits[]; };
#define ROUTE_LOGIT(i) logits[i]
#include "route_pick.glsl"
#define EXPERT(j) min(route_id[j], E - 1u)
#else
layout(set = 0, binding = 2, std430) readonly buffer Idx { int idx[]; };
#define EXPERT(j) uint(clamp(idx[j], 0, int(E) - 1))
#endif

void main() {
    uint per_expert = (O + ROWS - 1u) / ROWS;
    uint g = group_id();
    uint j = g / per_expert;
    if (j >= K) {
        return;
    }
    uint row0 = (g - j * per_expert) * ROWS;
#ifdef ROUTED
    route_pick();
#endif
    uint e = EXPERT(j);
    // The gate's ROWS rows then the up's, one pass (rows past O repeat row O - 1, dropped).
    uint wrow[MAX_DOTS];
    uint xoff[MAX_DOTS];
    for (uint d = 0u; d < MAX_DOTS; d++) {
        uint r = min(row0 + d % ROWS, O - 1u);
        wrow[d] = (d < ROWS ? e : E + e) * O + r;
        xoff[d] = 0u;
    }
    expert_dots(wrow, xoff, 2u * ROWS);
    uint t = gl_LocalInvocationID.x;
    if (t < ROWS && row0 + t < O) {
        y[j * O + row0 + t] = silu(wg_dot_total(t)) * wg_dot_total(ROWS + t);
    }
}
