// The tail anchor (vkfuse fuse::codegen generates the including source): the argmax of the
// logits (ties to the lower index, total_cmp order, as argmax.comp) written straight into the
// token state, and/or the position advanced in its state, in one dispatch.
//
// The including source defines WRITE_TOKEN (0/1), ADVANCE (0/1) and GROUPS (>= 1, 1 without
// WRITE_TOKEN), and with GROUPS > 1 PART_BINDING and COUNT_BINDING.
// Bindings with WRITE_TOKEN and ADVANCE: 0 = token state i32[1], 1 = x f32[N],
// 2 = position state i32[1], 3 = position i32[1]; with only WRITE_TOKEN: 0 and 1; with only
// ADVANCE: 0 = position state, 1 = position; with GROUPS > 1 then PART_BINDING = scratch
// u32[GROUPS] (each slice's best index) and COUNT_BINDING = an arrival counter u32[1] (zero
// before the dispatch, zero again after it: the last workgroup to arrive resets it).
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
    // This workgroup's slice of the logits (all of them with one group); a multiple of 4 long
    // so the 16-byte loads stay aligned.
    uint chunk = ((N + NGROUPS - 1u) / NGROUPS + 3u) & ~3u;
    uint lo = min(N, group_id() * chunk);
    uint hi = min(N, lo + chunk);
    uint wg = gl_WorkGroupSize.x;
    uint bk = 0u;
    uint bi = NONE;
    if (N % 4u == 0u) {
        // 16-byte loads, eight in flight per invocation: the loop is latency-bound, and the
        // order candidates are considered in does not matter (`before` is a total order).
        uint n4 = hi / 4u;
        uint j = lo / 4u + t;
        for (; j + 7u * wg < n4; j += 8u * wg) {
            vec4 v[8];
            for (uint u = 0u; u < 8u; u++) {
                v[u] = x4[j + u * wg];
            }
            for (uint u = 0u; u < 8u; u++) {
                uint i = 4u * (j + u * wg);
                consider(v[u].x, i, bk, bi);
                consider(v[u].y, i + 1u, bk, bi);
                consider(v[u].z, i + 2u, bk, bi);
                consider(v[u].w, i + 3u, bk, bi);
            }
        }
        for (; j < n4; j += wg) {
            vec4 v = x4[j];
            consider(v.x, 4u * j, bk, bi);
            consider(v.y, 4u * j + 1u, bk, bi);
            consider(v.z, 4u * j + 2u, bk, bi);
            consider(v.w, 4u * j + 3u, bk, bi);
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
    uint best = wg_argbest(bk, bi);
#if GROUPS > 1
    // Publish this slice's best; the last workgroup to arrive picks the best of all slices
    // (keys read back from the logits) and resets the counter for the next step.
    if (t == 0u) {
        partial[group_id()] = best;
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
        uint i = partial[g];
        if (i != NONE) {
            consider(x[i], i, bk, bi);
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
