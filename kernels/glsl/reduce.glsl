// Included once per shader (a persistent region includes several kernels' bodies).
#ifndef REDUCE_GLSL
#define REDUCE_GLSL
// Workgroup-wide reductions: subgroup arithmetic inside each subgroup, then one exchange of
// the per-subgroup partials through shared memory (two barriers, where a shared-memory tree
// costs log2(workgroup size)). Every invocation of the workgroup must call them (uniform
// control flow); each ends with a barrier, so the shared arrays can be reused at once and
// anything written to shared memory before the call is visible after it. The partials are
// summed in subgroup order by every invocation, so every invocation gets the same value.

shared float red_f[gl_WorkGroupSize.x];

// The subgroups that hold invocations 0 .. n - 1 (the n of the _of and _open reductions below,
// where only those invocations hold values). Invocation t sits in subgroup t / gl_SubgroupSize:
// Vulkan does not promise that layout; NVIDIA, AMD and lavapipe lay a one-dimensional
// workgroup's invocations out so, and the int8 chain's staging relies on it too (neighbours
// agreeing by shuffles).
uint subgroups_holding(uint n) {
    return (n + gl_SubgroupSize - 1u) / gl_SubgroupSize;
}

// wg_sum where only the first n subgroups hold anything but zeros (see wg_max_open below).
float wg_sum_of(float v, uint n) {
    v = subgroupAdd(v);
    if (subgroupElect()) {
        red_f[gl_SubgroupID] = v;
    }
    barrier();
    float r = 0.0;
    for (uint g = 0u; g < min(n, gl_NumSubgroups); g++) {
        r += red_f[g];
    }
    barrier();
    return r;
}

float wg_sum(float v) {
    return wg_sum_of(v, gl_NumSubgroups);
}

// wg_max without its closing barrier (the caller has one of its own before anything writes
// red_f again), where the subgroups past the first n hold nothing larger than the first n do:
// their partials are not read, fewer dependent shared loads (as wg_published_sum_of below).
float wg_max_open(float v, uint n) {
    v = subgroupMax(v);
    if (subgroupElect()) {
        red_f[gl_SubgroupID] = v;
    }
    barrier();
    float r = red_f[0];
    for (uint g = 1u; g < min(n, gl_NumSubgroups); g++) {
        r = max(r, red_f[g]);
    }
    return r;
}

float wg_max(float v) {
    float r = wg_max_open(v, gl_NumSubgroups);
    barrier();
    return r;
}

// Several sums over a subgroup at once, transposed: SUBGROUP_SUMS(acc, n, span) with acc an
// array variable of at least n floats and n a power of two, 2 <= n <= 8 and <= the subgroup
// size (the caller checks: subgroup_sums_fit). In round r the lanes exchange half of their
// remaining sums with the lane gl_SubgroupSize >> (r + 1) away, each keeping the half its lane
// bit names; after log2(n) rounds lane l holds sum l / span alone (span = gl_SubgroupSize / n,
// set by the macro), and a butterfly over those span lanes finishes it in acc[0] of every one
// of them. n - 1 + log2(span) shuffles for the n sums instead of n log2(size) in n
// subgroupAdds. The rounds have constant widths, so that acc is indexed by constants only (a
// loop over the widths, in the chained kernel's first version, ran 11% slower on the H100 and
// changed its greedy ids, which lavapipe did not; the loop computes the same sums, and why the
// H100 disagreed was not found). In the matvecs' dots (wg_share_dots) on the H100: +1.8% bf16,
// +3.2% q8_0, +5.9% q4_0 (lm_head's 8 rows per subgroup); in the
// chained kernel's +1.2% bf16 and q8_0, +0.4% q4_0 (docs/perf.md, session 24).
// Every lane of the subgroup must be active (a workgroup of whole subgroups, uniform control
// flow): the shuffles read any of them, where subgroupAdd skips the inactive ones.
bool subgroup_sums_fit(uint n) {
    return n >= 2u && n <= 8u && (n & (n - 1u)) == 0u && gl_SubgroupSize >= n &&
           gl_WorkGroupSize.x % gl_SubgroupSize == 0u;
}
#define SUBGROUP_SUMS_ROUND(acc, n, span, H) \
    if ((n) >= 2u * (H)) { \
        span /= 2u; \
        bool hi_ = (gl_SubgroupInvocationID & span) != 0u; \
        [[unroll]] for (uint i_ = 0u; i_ < (H); i_++) { \
            float send_ = hi_ ? acc[i_] : acc[i_ + (H)]; \
            float keep_ = hi_ ? acc[i_ + (H)] : acc[i_]; \
            acc[i_] = keep_ + subgroupShuffleXor(send_, span); \
        } \
    }
#define SUBGROUP_SUMS(acc, n, span) \
    { \
        span = gl_SubgroupSize; \
        SUBGROUP_SUMS_ROUND(acc, n, span, 4u) \
        SUBGROUP_SUMS_ROUND(acc, n, span, 2u) \
        SUBGROUP_SUMS_ROUND(acc, n, span, 1u) \
        for (uint o_ = span / 2u; o_ >= 1u; o_ /= 2u) { \
            acc[0] += subgroupShuffleXor(acc[0], o_); \
        } \
    }
// Each sum j of acc[0..n) over the subgroup, stored once through STORE(j, v) (a macro of the
// caller's): transposed (SUBGROUP_SUMS) where `fit` (subgroup_sums_fit(n)), else a
// subgroupAdd per sum.
#define SUBGROUP_SUMS_STORE(acc, n, fit, STORE) \
    if (fit) { \
        uint span_; \
        SUBGROUP_SUMS(acc, n, span_) \
        if (gl_SubgroupInvocationID % span_ == 0u) { \
            STORE(gl_SubgroupInvocationID / span_, acc[0]); \
        } \
    } else { \
        for (uint j_ = 0u; j_ < (n); j_++) { \
            float v_ = subgroupAdd(acc[j_]); \
            if (subgroupElect()) { \
                STORE(j_, v_); \
            } \
        } \
    }

// Up to MAX_DOTS sums at once (the dots of a matvec workgroup) with one exchange for all:
// wg_share_dots reduces acc[j] (j < n) in each subgroup and publishes the partials, ending
// with a barrier; then wg_dot_total(j) is dot j's workgroup total, in any invocation. The
// partials stay in shared memory: a caller sharing again first needs a barrier after its reads.
// A shader that never shares dots defines REDUCE_NO_DOTS: the array is declared whether used
// or not, and at 1024 invocations it is 32 KiB, lavapipe's whole shared memory.
const uint MAX_DOTS = 8u;
#ifndef REDUCE_NO_DOTS
// Sized by invocations although only MAX_DOTS partials per subgroup are used, on purpose. With
// 128 bytes here the steps without handoffs ran as fast, but the handoffs' gain fell from +9%
// to +2% (bf16 on an H100) and from +10% to −2% (q4_0; docs/perf.md, session 15). The likely
// cause: the driver sizes
// each SM's shared-memory carveout by what the running kernel declares, and a small one leaves
// no room for the next level's workgroups to start beside the producer's, which is the point
// of a handoff.
shared float red_dots[MAX_DOTS * gl_WorkGroupSize.x];

void wg_share_dots(float acc[MAX_DOTS], uint n) {
#define RED_DOT(j, v) red_dots[(j) * gl_NumSubgroups + gl_SubgroupID] = (v)
    // NO_MATVEC_SUMS: a subgroupAdd per dot, the A/B switch of the measurement above
    // (VKFUSE_DEFINES, which reaches generated kernels only, not matvec.comp).
#ifdef NO_MATVEC_SUMS
    SUBGROUP_SUMS_STORE(acc, n, false, RED_DOT)
#else
    SUBGROUP_SUMS_STORE(acc, n, subgroup_sums_fit(n), RED_DOT)
#endif
#undef RED_DOT
    barrier();
}

float wg_dot_total(uint j) {
    float s = 0.0;
    for (uint g = 0u; g < gl_NumSubgroups; g++) {
        s += red_dots[j * gl_NumSubgroups + g];
    }
    return s;
}
#endif

// wg_published_sum (below) where only the first n subgroups published anything but zeros: the
// same sum (adding +0.0 changes nothing) in fewer dependent shared loads. The chain's x²
// partials come from the subgroups that stage x, 8 of 32 at Qwen3-0.6B's width: on an H200
// bf16 +0.2%, q8_0 +0.5%, q4_0 +0.4% (docs/perf.md, session 53).
float wg_published_sum_of(uint n) {
    float s = 0.0;
    for (uint g = 0u; g < min(n, gl_NumSubgroups); g++) {
        s += red_f[g];
    }
    return s;
}

// A sum published now and read after the caller's next barrier, for code that has a barrier
// of its own to share it at (a norm's x² summed beside a matvec's dots costs no exchange of
// its own): wg_publish_sum(v) in every invocation, a barrier, then wg_published_sum() is the
// workgroup's total in any invocation. It uses wg_sum's array: no wg_sum or wg_max between.
void wg_publish_sum(float v) {
    v = subgroupAdd(v);
    if (subgroupElect()) {
        red_f[gl_SubgroupID] = v;
    }
}

float wg_published_sum() {
    return wg_published_sum_of(gl_NumSubgroups);
}

#endif // REDUCE_GLSL
