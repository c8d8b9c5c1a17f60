// The tail anchor (vkfuse fuse::codegen generates the including source): the argmax of the
// logits (ties to the lower index, total_cmp order, as argmax.comp) written straight into the
// token state, and/or the position advanced in its state, in one dispatch.
//
// The including source defines WRITE_TOKEN (0/1), ADVANCE (0/1) and GROUPS (>= 1, 1 without
// WRITE_TOKEN), and with GROUPS > 1 PART_BINDING and COUNT_BINDING.
// Bindings with WRITE_TOKEN and ADVANCE: 0 = token state i32[1], 1 = x f32[N],
// 2 = position state i32[1], 3 = position i32[1]; with only WRITE_TOKEN: 0 and 1; with only
// ADVANCE: 0 = position state, 1 = position; with GROUPS > 1 then PART_BINDING = scratch
// u32[2 * GROUPS] (each slice's best: order key, index) and COUNT_BINDING = an arrival counter
// u32[1] (zero before the dispatch, zero again after it: the last workgroup to arrive resets it).
// Spec constants: 0 = workgroup size (power of two), 1 = N.
// Dispatch: GROUPS workgroups, each over a slice of the logits; the last to arrive combines
// the slices' bests, writes the token and advances the position.

#include "argbest.glsl"

layout(constant_id = 1) const uint N = 1;
// GROUPS is a plain integer (for #if).
const uint NGROUPS = uint(GROUPS);

#if WRITE_TOKEN
layout(set = 0, binding = 0, std430) writeonly buffer Tok { int token[]; };
layout(set = 0, binding = 1, std430) readonly buffer X { float x[]; };
layout(set = 0, binding = 1, std430) readonly buffer X4 { vec4 x4[]; };
#endif
#if ADVANCE
layout(set = 0, binding = 2 * WRITE_TOKEN, std430) writeonly buffer PosOut { int pos_out[]; };
layout(set = 0, binding = 2 * WRITE_TOKEN + 1, std430) readonly buffer PosIn { int pos_in[]; };
#endif
#if GROUPS > 1
// Coherent: the last workgroup reads what the others wrote in this dispatch.
layout(set = 0, binding = PART_BINDING, std430) coherent buffer Part { uint partial[]; };
layout(set = 0, binding = COUNT_BINDING, std430) coherent buffer Count { uint arrived[]; };
shared uint last_g;
#endif

#if WRITE_TOKEN
// A slice's length (a multiple of 4, so the 16-byte loads stay aligned) and its vec4s per
// invocation.
const uint CHUNK = ((N + NGROUPS - 1u) / NGROUPS + 3u) & ~3u;
const uint PER_T = (CHUNK / 4u + gl_WorkGroupSize.x - 1u) / gl_WorkGroupSize.x;

void consider(float v, uint i, inout uint bk, inout uint bi) {
    uint key = order_key(v);
    if (before(key, i, bk, bi)) {
        bk = key;
        bi = i;
    }
}
#endif

void main() {
    uint t = gl_LocalInvocationID.x;
#if WRITE_TOKEN
    // This workgroup's slice of the logits (all of them with one group).
    uint lo = min(N, group_id() * CHUNK);
    uint hi = min(N, lo + CHUNK);
    uint wg = gl_WorkGroupSize.x;
    uint bk = 0u;
    uint bi = NONE;
    if (N % 4u == 0u) {
        // 16-byte loads, all of an invocation's in flight at once (PER_T is a constant once
        // specialised, so the loop unrolls): the walk is latency-bound, and the order the
        // candidates are considered in does not matter (`before` is a total order).
        uint n4 = hi / 4u;
        uint j0 = lo / 4u + t;
        vec4 v[PER_T];
        for (uint u = 0u; u < PER_T; u++) {
            uint j = j0 + u * wg;
            v[u] = j < n4 ? x4[j] : vec4(0.0);
        }
        for (uint u = 0u; u < PER_T; u++) {
            uint j = j0 + u * wg;
            if (j < n4) {
                consider(v[u].x, 4u * j, bk, bi);
                consider(v[u].y, 4u * j + 1u, bk, bi);
                consider(v[u].z, 4u * j + 2u, bk, bi);
                consider(v[u].w, 4u * j + 3u, bk, bi);
            }
        }
    } else {
        uint i = lo + t;
        for (; i + 3u * wg < hi; i += 4u * wg) {
            float a = x[i];
            float b = x[i + wg];
            float c = x[i + 2u * wg];
            float d = x[i + 3u * wg];
            consider(a, i, bk, bi);
            consider(b, i + wg, bk, bi);
            consider(c, i + 2u * wg, bk, bi);
            consider(d, i + 3u * wg, bk, bi);
        }
        for (; i < hi; i += wg) {
            consider(x[i], i, bk, bi);
        }
    }
    uvec2 kb = wg_best(bk, bi);
    uint best = kb.y;
#if GROUPS > 1
    // Publish this slice's best (its order key beside its index, so the last workgroup reads
    // nothing back from the logits); the last workgroup to arrive picks the best of all slices
    // and resets the counter for the next step.
    if (t == 0u) {
        partial[2u * group_id()] = kb.x;
        partial[2u * group_id() + 1u] = best;
    }
    memoryBarrierBuffer();
    barrier();
    if (t == 0u) {
        last_g = atomicAdd(arrived[0], 1u) == NGROUPS - 1u ? 1u : 0u;
    }
    barrier();
    if (last_g == 0u) {
        return;
    }
    memoryBarrierBuffer();
    bk = 0u;
    bi = NONE;
    for (uint g = t; g < NGROUPS; g += wg) {
        uint key = partial[2u * g];
        uint i = partial[2u * g + 1u];
        if (before(key, i, bk, bi)) {
            bk = key;
            bi = i;
        }
    }
    best = wg_argbest(bk, bi);
    if (t == 0u) {
        arrived[0] = 0u;
    }
#endif
    if (t == 0u) {
        token[0] = int(best);
    }
#endif
#if ADVANCE
    // Only invocation 0 (of the last workgroup) reads and writes the position (the state and
    // the value may be one buffer), in that order.
    if (t == 0u) {
        pos_out[0] = pos_in[0] + 1;
    }
#endif
}
