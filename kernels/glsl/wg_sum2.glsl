#ifndef WG_SUM2_GLSL
#define WG_SUM2_GLSL
// reduce.glsl's wg_sum_of for two values at once: one exchange for both, where only the first
// n subgroups hold anything but zeros (their partials alone: the same sum in fewer dependent
// shared loads). The includer declares `shared vec2 red2_s[gl_WorkGroupSize.x]` (its own to use
// between calls too) and includes reduce.glsl first.
vec2 wg_sum2_of(vec2 v, uint n) {
    v = vec2(subgroupAdd(v.x), subgroupAdd(v.y));
    if (subgroupElect()) {
        red2_s[gl_SubgroupID] = v;
    }
    barrier();
    vec2 r = vec2(0.0);
    for (uint g = 0u; g < min(n, gl_NumSubgroups); g++) {
        r += red2_s[g];
    }
    barrier();
    return r;
}
#endif // WG_SUM2_GLSL
