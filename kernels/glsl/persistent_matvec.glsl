// A matvec level of a persistent region (fuse::persistent generates the including source, one
// inclusion per level): the same rows, epilogue and prologue as fused_matvec.glsl, shaped for
// workgroups that stay resident. fused_matvec.glsl hides memory latency with many short-lived
// workgroups cooperating on a few rows each (a workgroup barrier per reduction); a persistent
// region has about one workgroup per SM, so here every SUBGROUP owns whole rows: it streams a
// row's weights with 16-byte loads, two rows in turn, and reduces with one subgroupAdd, no
// workgroup barrier. The input (times the norm weight) is staged once per level in shared
// memory, and the norm's scale is computed once per workgroup.
//
// The including source defines, per inclusion: W_DTYPE (F16 or BF16), NORM, NW_DTYPE, NORM_ZC,
// PARTS, ZIPPED, O, I (a multiple of 8, at most PM_MAX_I), EPS, END0..7, SHIFT0..7 (as in
// fused_matvec.glsl), EPILOGUE(row, a) and IN<k>(row), MV_BINDING (the first binding), MV_MAIN
// (the level's function) and renames every file-scope name below and in matvec_rows.glsl
// per inclusion. persistent.glsl
// declares pm_x (PM_MAX_I floats of shared memory).

layout(set = 0, binding = MV_BINDING + 0, std430) coherent writeonly buffer MvY { float mv_y[]; };
layout(set = 0, binding = MV_BINDING + 1, std430) readonly buffer MvW4 { uvec4 mv_w4[]; };
layout(set = 0, binding = MV_BINDING + 2, std430) coherent readonly buffer MvX { float mv_x[]; };
#if NORM
layout(set = 0, binding = MV_BINDING + 3, std430) readonly buffer NW { uint nw[]; };
#endif

#include "matvec_rows.glsl"

// This lane's share of the dot of weight row `wrow` with the staged input. (Measured on the
// H100, regions at 132 workgroups: this loop, one row after the other, 696 tokens/s; both rows
// in one loop 585; four loads of each row issued before any arithmetic 628.)
float mv_lane_dot(uint wrow, uint lane, uint S) {
    const uint n8 = I / 8u;
    float acc = 0.0;
    for (uint c = lane; c < n8; c += S) {
        uvec4 wv = mv_w4[wrow * n8 + c];
        uint e = 8u * c;
        acc += dot(vec4(PAIR(W_DTYPE, wv.x), PAIR(W_DTYPE, wv.y)),
                   vec4(pm_x[e], pm_x[e + 1u], pm_x[e + 2u], pm_x[e + 3u]))
             + dot(vec4(PAIR(W_DTYPE, wv.z), PAIR(W_DTYPE, wv.w)),
                   vec4(pm_x[e + 4u], pm_x[e + 5u], pm_x[e + 6u], pm_x[e + 7u]));
    }
    return acc;
}

void MV_MAIN() {
    uint t = gl_LocalInvocationIndex;
    float scale = 1.0;
#if NORM
    float ss = 0.0;
    for (uint i = t; i < I; i += gl_WorkGroupSize.x) {
        float v = mv_x[i];
        ss += v * v;
    }
    ss = wg_sum(ss);
    scale = inversesqrt(ss / float(I) + EPS);
#endif
    for (uint i = t; i < I; i += gl_WorkGroupSize.x) {
        pm_x[i] = mv_x[i] * nw_at(i);
    }
    barrier();

    uint lane = gl_SubgroupInvocationID;
    uint S = gl_SubgroupSize;
    uint sg = gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID;
    uint nsg = gl_NumWorkGroups.x * gl_NumSubgroups;
    // Rows r and r + nsg by one subgroup, one after the other.
    for (uint r = sg; r < O; r += 2u * nsg) {
        bool two = r + nsg < O;
        float a[PER_ROW];
        float b[PER_ROW];
        for (uint k = 0u; k < PER_ROW; k++) {
            a[k] = subgroupAdd(mv_lane_dot(k * O + r, lane, S)) * scale;
            b[k] = two ? subgroupAdd(mv_lane_dot(k * O + r + nsg, lane, S)) * scale : 0.0;
        }
        if (subgroupElect()) {
            uint row = r;
            mv_y[out_index(row)] = EPILOGUE(row, a);
            if (two) {
                row = r + nsg;
                mv_y[out_index(row)] = EPILOGUE(row, b);
            }
        }
    }
    // The next level stages its input over pm_x.
    barrier();
}
