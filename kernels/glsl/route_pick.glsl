#ifndef ROUTE_PICK_GLSL
#define ROUTE_PICK_GLSL
// The MoE router's choice from its N logits, computed the same way by every kernel that needs
// it: the router kernel (fused_route.glsl) and the expert kernels that route for themselves
// (fused_expert_glu.glsl and fused_expert_sum.glsl with ROUTED), so that a layer's kernels
// agree bit for bit on the experts and their weights whatever their workgroup sizes.
//
// What it computes is the renormalised top K of softmax(logits): the experts ranked by
// e = exp(logit - max) (softmax's order; ties to the lower index, as top_k.comp picks them),
// each weight e / (the sum of the K picked e, in pick order). Softmax's normaliser cancels in
// the renormalisation, so no sum over all N is taken: the max is exact in any order, the
// comparisons are exact, and the only sum has a fixed order. One subgroup does it all with
// subgroup operations (no barrier per pick); its lanes own logits i = lane, lane + width, ...
// Against the unfused ops (softmax.comp, then top_k.comp over p = e * (1/s)) the picks differ
// only where rounding that product makes two different e equal: top_k then takes the lower
// index, this the larger e (the order of exact softmax).
//
// The including source declares the spec constants N and K (K <= N) and defines
// ROUTE_LOGIT(i), logit i as a float. The caller is in uniform control flow.

shared uint route_id[K];
shared float route_w[K];

// Fills route_id (indices, largest first) and route_w (their weights); ends with a barrier.
void route_pick() {
    if (gl_SubgroupID == 0u) {
        uint lane = gl_SubgroupInvocationID;
        // A workgroup narrower than the subgroup (32 invocations on a 64-wide device) fills
        // only part of it: stride by the lanes that are there.
        uint width = min(gl_SubgroupSize, gl_WorkGroupSize.x);
        float m = NEG_BIG;
        for (uint i = lane; i < N; i += width) {
            m = max(m, ROUTE_LOGIT(i));
        }
        m = subgroupMax(m);
        uint prev_key = 0u;
        uint prev_idx = NONE;
        float total = 0.0;
        for (uint r = 0u; r < K; r++) {
            // This lane's best candidate after the previous pick.
            uint bk = 0u;
            uint bi = NONE;
            for (uint i = lane; i < N; i += width) {
                uint key = order_key(exp(ROUTE_LOGIT(i) - m));
                bool after_prev = prev_idx == NONE || before(prev_key, prev_idx, key, i);
                if (after_prev && before(key, i, bk, bi)) {
                    bk = key;
                    bi = i;
                }
            }
            // The largest key, then the lowest index holding it.
            uint key = subgroupMax(bi == NONE ? 0u : bk);
            uint best = subgroupMin(bi != NONE && bk == key ? bi : NONE);
            prev_key = key;
            prev_idx = best;
            // e >= 0, so its order key is its bits with the sign bit set.
            float e = uintBitsToFloat(key & 0x7fffffffu);
            total += e;
            if (lane == 0u) {
                route_id[r] = best;
                route_w[r] = e;
            }
        }
        if (lane == 0u) {
            for (uint r = 0u; r < K; r++) {
                route_w[r] /= total;
            }
        }
    }
    barrier();
}

#endif // ROUTE_PICK_GLSL
