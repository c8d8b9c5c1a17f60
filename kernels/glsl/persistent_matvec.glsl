// A matvec level of a persistent region (fuse::persistent generates the including source, one
// inclusion per level): the same rows, epilogue and prologue as fused_matvec.glsl, shaped so
// that the weights of a level stream from memory WHILE the region waits at the grid barrier
// before it. Weights do not depend on the level's input, so each workgroup loads its share of
// them into registers (MV_PREFETCH: PM_PF 16-byte chunks per invocation) between arriving at
// the barrier and waiting on it; after the barrier only the input is read (from L2) and the
// dots are taken from registers. A plain schedule pays a pipeline barrier (~2.3 µs of idle GPU
// on an H100) AND the next dispatch's first memory latency per level; here the memory never
// idles across a level boundary.
//
// Shape: workgroup g owns output rows [g·per, (g+1)·per), per = ceil(O / workgroups), in
// passes of at most PM_PF chunks per invocation (one pass at one workgroup per SM on the
// shapes of Qwen3-0.6B; lavapipe's single workgroup takes many). Chunk j of a pass is
// (row, part, column chunk) in row-major order; invocation (subgroup s, lane l) holds chunks
// (s·PM_PF + k)·S + l, k < PM_PF, so a subgroup reads S consecutive chunks (coalesced).
// Each chunk's 8-term dot is reduced over clusters of `sw` lanes (sw divides the row's chunk
// count, so a cluster never straddles two rows) into one shared slot; then a subgroup per
// output row sums its slots and writes the epilogue.
//
// The including source defines, per inclusion: W_DTYPE (F16 or BF16), NORM, NW_DTYPE, NORM_ZC,
// PARTS, ZIPPED, O, I (a multiple of 8, at most PM_MAX_I), EPS, END0..7, SHIFT0..7 (as in
// fused_matvec.glsl), EPILOGUE(row, a) and IN<k>(row), MV_BINDING (the first binding), MV_MAIN
// and MV_PREFETCH (the level's functions) and renames every file-scope name below and in
// matvec_rows.glsl per inclusion. persistent.glsl declares pm_x4 (the staged input), pm_slot
// (the per-cluster partial dots) and pm_pf (the prefetched chunks).

layout(set = 0, binding = MV_BINDING + 0, std430) coherent writeonly buffer MvY { float mv_y[]; };
layout(set = 0, binding = MV_BINDING + 1, std430) readonly buffer MvW4 { uvec4 mv_w4[]; };
layout(set = 0, binding = MV_BINDING + 2, std430) coherent readonly buffer MvX { float mv_x[]; };
#if NORM
layout(set = 0, binding = MV_BINDING + 3, std430) readonly buffer NW { uint nw[]; };
#endif

#include "matvec_rows.glsl"

const uint N8 = I / 8u;
// Chunks of one output row, all its parts.
const uint ROW_CHUNKS = PER_ROW * N8;

// This workgroup's output rows [x, y).
uvec2 mv_rows() {
    uint per = (O + gl_NumWorkGroups.x - 1u) / gl_NumWorkGroups.x;
    uint a = min(O, gl_WorkGroupID.x * per);
    return uvec2(a, min(O, a + per));
}

// Lanes per cluster: the largest power of two dividing both the subgroup size and N8.
uint mv_sw() {
    return min(gl_SubgroupSize, N8 & (~N8 + 1u));
}

// Output rows per pass: the chunks fit PM_PF per invocation and their slots fit pm_slot.
uint mv_pass_rows() {
    uint chunks = gl_WorkGroupSize.x * PM_PF;
    return min(chunks, (chunks / 4u) * mv_sw()) / ROW_CHUNKS;
}

// Chunk j of the pass: (its index in mv_w4, its column chunk).
uvec2 mv_chunk(uint row0, uint j) {
    uint q = j % ROW_CHUNKS;
    uint part = q / N8;
    uint col = q % N8;
    return uvec2((part * O + row0 + j / ROW_CHUNKS) * N8 + col, col);
}

// Invocation's chunk k of a pass.
uint mv_j(uint k) {
    return (gl_SubgroupID * PM_PF + k) * gl_SubgroupSize + gl_SubgroupInvocationID;
}

// Loads this invocation's chunks of the pass of `rows` output rows from row0 into pm_pf##k.
void mv_load(uint row0, uint rows) {
    uint c = rows * ROW_CHUNKS;
#define MV_LOAD(k)                                                                          \
    {                                                                                       \
        uint j = mv_j(uint(k));                                                                \
        if (j < c) {                                                                        \
            pm_pf##k = mv_w4[mv_chunk(row0, j).x];                                          \
        }                                                                                   \
    }
    PM_EACH_K(MV_LOAD)
#undef MV_LOAD
}

// Issues the loads of this workgroup's first pass (nothing here waits for them).
void MV_PREFETCH() {
    uvec2 rows = mv_rows();
    mv_load(rows.x, min(mv_pass_rows(), rows.y - rows.x));
}

void MV_MAIN() {
    uint t = gl_LocalInvocationIndex;
    uvec2 rows = mv_rows();
    // Stage the input times the norm weight; the norm's scale applies to the dots.
    float ss = 0.0;
    for (uint i = t; i < I / 4u; i += gl_WorkGroupSize.x) {
        uint e = 4u * i;
        vec4 v = vec4(mv_x[e], mv_x[e + 1u], mv_x[e + 2u], mv_x[e + 3u]);
        ss += dot(v, v);
        pm_x4[i] = v * vec4(nw_at(e), nw_at(e + 1u), nw_at(e + 2u), nw_at(e + 3u));
    }
    float scale = 1.0;
#if NORM
    scale = inversesqrt(wg_sum(ss) / float(I) + EPS);
#else
    barrier();
#endif

    uint lane = gl_SubgroupInvocationID;
    uint sw = mv_sw();
    uint per_pass = mv_pass_rows();
    for (uint r0 = rows.x; r0 < rows.y; r0 += per_pass) {
        uint n = min(per_pass, rows.y - r0);
        if (r0 != rows.x) {
            // The last pass's slots are read (by the sums below it) before this pass writes.
            barrier();
            mv_load(r0, n);
        }
        uint c = n * ROW_CHUNKS;
        // Chunk k's dot, reduced over its cluster into its slot.
#define MV_DOT(k)                                                                           \
        {                                                                                   \
            uint j = mv_j(uint(k));                                                            \
            float p = 0.0;                                                                  \
            if (j < c) {                                                                    \
                uint col = mv_chunk(r0, j).y;                                               \
                p = dot(vec4(PAIR(W_DTYPE, pm_pf##k.x), PAIR(W_DTYPE, pm_pf##k.y)),         \
                        pm_x4[2u * col])                                                    \
                  + dot(vec4(PAIR(W_DTYPE, pm_pf##k.z), PAIR(W_DTYPE, pm_pf##k.w)),         \
                        pm_x4[2u * col + 1u]);                                              \
            }                                                                               \
            for (uint off = 1u; off < sw; off <<= 1u) {                                     \
                p += subgroupShuffleXor(p, off);                                            \
            }                                                                               \
            if (j < c && lane % sw == 0u) {                                                 \
                pm_slot[j / sw] = p;                                                        \
            }                                                                               \
        }
        PM_EACH_K(MV_DOT)
#undef MV_DOT
        barrier();
        // A subgroup per output row sums the slots of each part.
        uint per_part = N8 / sw;
        for (uint rr = gl_SubgroupID; rr < n; rr += gl_NumSubgroups) {
            float a[PER_ROW];
            for (uint k = 0u; k < PER_ROW; k++) {
                uint s0 = (rr * PER_ROW + k) * per_part;
                float s = 0.0;
                for (uint i = lane; i < per_part; i += gl_SubgroupSize) {
                    s += pm_slot[s0 + i];
                }
                a[k] = subgroupAdd(s) * scale;
            }
            if (subgroupElect()) {
                uint row = r0 + rr;
                mv_y[out_index(row)] = EPILOGUE(row, a);
            }
        }
    }
    // The next level stages its input after grid_arrive's barrier.
}
