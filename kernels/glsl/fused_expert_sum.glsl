// The weighted expert sum anchor (vkfuse fuse::codegen generates the including source):
// y[o] = sum_j (sum_i w[idx[j], o, i] * x[j, i]) * wts[j] for j < K, in that order: what
// expert_matvec (down), mul by the routing weights and sum over the experts compute, in one
// dispatch; the expert indices are read on the device (clamped into 0..E, as expert_matvec).
// The including source defines DTYPE_1 (the weights' dtype).
// With ROUTED defined, every workgroup routes for itself from the router's logits
// (route_pick.glsl) instead of reading the router kernel's indices and weights.
// Bindings: 0 = y f32[O], 1 = w [E, O, I] of DTYPE_1, 2 = idx i32[K] (ROUTED: the router
// logits f32[N]), 3 = x f32[K, I], 4 = wts f32[K] (not ROUTED).
// With EPILOGUE defined, each row's sum goes through it as it is written: the shared expert's
// output and the residual added, from the extra inputs bound after those above, loaded first.
// Spec constants: 0 = workgroup size (power of two; with SUM_ROWS, a multiple of the other
// expert kernels' for rows_main's groups), 1 = O, 2 = I, 3 = ROWS (1: a row per workgroup, its
// K dots in passes of MAX_DOTS; up to MAX_DOTS with SUM_ROWS: rows_main), 4 = VEC4 (see
// matvec_core.glsl), 5 = E, 6 = K, 7 = N (ROUTED).
// Dispatch: ceil(O / ROWS) workgroups.

layout(set = 0, binding = 0, std430) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1, std430) readonly buffer W { uint w[]; };
layout(set = 0, binding = 1, std430) readonly buffer W4 { uvec4 w4[]; };
layout(set = 0, binding = 1, std430) readonly buffer WPair { uvec2 w_pair[]; };
layout(set = 0, binding = 3, std430) readonly buffer X { float x[]; };
layout(set = 0, binding = 3, std430) readonly buffer X4 { vec4 x4[]; };

#include "matvec_core.glsl"
#include "expert_dots.glsl"
#include "fused_epilogue.glsl"

// The including source may define EPILOGUE(row, a, pre) over the row's sum a[0] and pre[k],
// the row's element of extra input k (bound after the kernel's own bindings, codegen's
// declare_inputs), with N_IN and PRELOAD_INS(row, pre), which loads them before the routing.
#ifndef EPILOGUE
#define EPILOGUE(row, a, pre) a[0]
#define N_IN 1
#define PRELOAD_INS(row, pre)
#endif

layout(constant_id = 5) const uint E = 1;
layout(constant_id = 6) const uint K = 1;

#ifdef ROUTED
layout(constant_id = 7) const uint N = 1;
layout(set = 0, binding = 2, std430) readonly buffer Logits { float logits[]; };
#define ROUTE_LOGIT(i) logits[i]
#include "route_pick.glsl"
#define EXPERT(j) min(route_id[j], E - 1u)
#define WEIGHT(j) route_w[j]
#else
layout(set = 0, binding = 2, std430) readonly buffer Idx { int idx[]; };
layout(set = 0, binding = 4, std430) readonly buffer Wts { float wts[]; };
#define EXPERT(j) uint(clamp(idx[j], 0, int(E) - 1))
#define WEIGHT(j) wts[j]
#endif

// Experts a pass takes: all K where their dots fit one exchange (expert_dots.glsl).
const uint ND = K < MAX_DOTS ? K : MAX_DOTS;

#ifdef SUM_ROWS
// SUM_ROWS (set with ROWS > 1): each workgroup takes ROWS rows, every expert's input row loaded
// once for all of them, each invocation's share weighted per expert before one exchange
// (expert_rows_acc); invocation r writes row r. The sums' order differs from the one-row path's
// (weighted, then summed over the workgroup), their terms do not.
void rows_main() {
    uint row0 = group_id() * ROWS;
    if (row0 >= O) {
        return;
    }
    uint t = gl_LocalInvocationID.x;
    // Invocation t < ROWS writes row row0 + t (rows past O: read as row O - 1, not written).
    uint mine = min(row0 + min(t, ROWS - 1u), O - 1u);
    float pre[N_IN];
    if (t < ROWS) {
        PRELOAD_INS(mine, pre)
    }
#ifdef ROUTED
    route_pick();
#endif
    float acc[MAX_DOTS];
    for (uint d = 0u; d < MAX_DOTS; d++) {
        acc[d] = 0.0;
    }
    // A row's steps take s_inv invocations (all of them, up to the workgroup's), and the
    // workgroup's groups of them each take every groups-th expert (codegen sizes the workgroup at
    // 4 times the other expert kernels', at most 256: 4 groups where a row has 32 to 64 steps):
    // 4 times the warps of a workgroup whose invocations each walk all K experts, each warp with
    // a quarter of the loads in flight. Qwen3-Next-80B's sum (2 warps a workgroup, 10 experts x
    // 4 rows of loads an invocation in 32-40 registers) had its workgroups live ~9 µs for 6 MB a
    // level on an H200; in 4 groups its widths in 4 layers ran 4.9% faster (docs/perf.md,
    // session 51).
    // Invocations past groups x s_inv (steps no power of two) take none.
    uint steps = expert_row_steps();
    uint s_inv = min(steps, gl_WorkGroupSize.x);
    uint groups = gl_WorkGroupSize.x / s_inv;
    uint group = t / s_inv;
    for (uint j = group < groups ? group : K; j < K; j += groups) {
        uint wrow[MAX_DOTS];
        for (uint d = 0u; d < MAX_DOTS; d++) {
            wrow[d] = EXPERT(j) * O + min(row0 + d, O - 1u);
        }
        expert_rows_acc(wrow, j * I, ROWS, WEIGHT(j), t - group * s_inv, s_inv, acc);
    }
    wg_share_dots(acc, ROWS);
    if (t < ROWS && row0 + t < O) {
        float a[1] = float[1](wg_dot_total(t));
        y[mine] = EPILOGUE(mine, a, pre);
    }
}

#endif // SUM_ROWS

void main() {
#ifdef SUM_ROWS
    rows_main();
    return;
#endif
    uint row = group_id();
    if (row >= O) {
        return;
    }
    float pre[N_IN];
    if (gl_LocalInvocationID.x == 0u) {
        PRELOAD_INS(row, pre)
    }
#ifdef ROUTED
    route_pick();
#endif
    // The chosen experts' rows stream together, ND per pass, and add in expert order.
    float total = 0.0;
    for (uint j0 = 0u; j0 < K; j0 += ND) {
        uint wrow[MAX_DOTS];
        uint xoff[MAX_DOTS];
        for (uint d = 0u; d < MAX_DOTS; d++) {
            // Past K (the last pass of a K that is no multiple of ND): a row read and dropped.
            uint j = min(j0 + d, K - 1u);
            wrow[d] = EXPERT(j) * O + row;
            xoff[d] = j * I;
        }
        expert_dots(wrow, xoff, ND);
        for (uint d = 0u; d < ND; d++) {
            if (j0 + d < K) {
                total += wg_dot_total(d) * WEIGHT(j0 + d);
            }
        }
        // The next pass reuses the exchange's shared memory.
        barrier();
    }
    if (gl_LocalInvocationID.x == 0u) {
        float a[1] = float[1](total);
        y[row] = EPILOGUE(row, a, pre);
    }
}
