// An rms-norm prologue's weights (binding 3, NW_DTYPE; NORM_ZC: stored as w - 1) for the fused
// kernels with a norm prologue (fused_matvec.glsl, fused_chain.glsl): `nw` as words, and four
// at a time.
// Eight scalar loads per step, as LOAD reads them, cost q4_0's lm_head 2.5 µs on an H100
// (docs/perf.md, session 10). Every binding starts at a multiple of 256 bytes (the lowering's
// slices), so the 8- and 16-byte views are aligned.
layout(set = 0, binding = 3, std430) readonly buffer NW { uint nw[]; };
layout(set = 0, binding = 3, std430) readonly buffer NW2 { uvec2 nw2[]; };
layout(set = 0, binding = 3, std430) readonly buffer NW4 { uvec4 nw4v[]; };

// NW_ONES (1: the weight is ones, folded into the matrices after the norm at compile time:
// compile-model --fold-norms, the default for q8_0 and q4_0) reads nothing. On an H200 the
// folded q/k/v and gate/up were q8_0 +3.8%, q4_0 +1.0% (docs/perf.md, session 36).
#ifndef NW_ONES
#define NW_ONES 0
#endif

// Norm weights 4v .. 4v + 3.
vec4 nw4_at(uint v) {
#if NW_ONES
    return vec4(1.0);
#else
#if NW_DTYPE == F32
    vec4 n = uintBitsToFloat(nw4v[v]);
#else
    uvec2 p = nw2[v];
    vec4 n = vec4(PAIR(NW_DTYPE, p.x), PAIR(NW_DTYPE, p.y));
#endif
    return NORM_ZC != 0 ? n + 1.0 : n;
#endif
}
