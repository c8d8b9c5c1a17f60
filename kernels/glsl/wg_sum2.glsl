#ifndef WG_SUM2_GLSL
#define WG_SUM2_GLSL
// wg_sum (reduce.glsl) of two values at once: one exchange for both. The includer declares
// `shared vec2 red2_s[gl_WorkGroupSize.x]` (its own to use between calls too) and includes
// reduce.glsl first.
vec2 wg_sum2(vec2 v) {
    v = vec2(subgroupAdd(v.x), subgroupAdd(v.y));
    if (subgroupElect()) {
        red2_s[gl_SubgroupID] = v;
    }
    barrier();
    vec2 r = vec2(0.0);
    for (uint g = 0u; g < gl_NumSubgroups; g++) {
        r += red2_s[g];
    }
    barrier();
    return r;
}
#endif // WG_SUM2_GLSL
