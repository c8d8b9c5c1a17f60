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
// Each logit's key, order_key(e), in shared memory: every logit is read from device memory and
// exponentiated once, where the rounds below read and exponentiated all of them in each of the
// K rounds (docs/perf.md, session 47).
shared uint route_key[N];

// Comparisons a lane makes to rank its logits against all N: the rank path's cost (a define, so
// that routing.rs can force either path and compare their bits).
#ifndef ROUTE_RANK_BUDGET
#define ROUTE_RANK_BUDGET 1024u
#endif

// Fills route_id (indices, largest first) and route_w (their weights); ends with a barrier.
// Every workgroup of the expert kernels routes for itself, and the picking is on its critical
// path (between the router's logits and the first expert weight load). Two ways to the same
// picks, chosen by the subgroup's width (each yields the one total order, so kernels of either
// way agree bit for bit):
// - rank (where a lane's logits times N fit RANK_BUDGET: Qwen3-Next-small's 64 experts on
//   32-wide subgroups): each lane counts, for each of its logits, the logits before it in the
//   order; those of rank < K are the picks. Independent comparisons, no serial chain;
// - K rounds, each the best candidate after the previous pick (two subgroup reductions a round):
//   a serial chain, but N comparisons a lane in all instead of N per logit (Qwen3-Next's 512).
void route_pick() {
    if (gl_SubgroupID == 0u) {
        uint lane = gl_SubgroupInvocationID;
        // A workgroup narrower than the subgroup (32 invocations on a 64-wide device) fills
        // only part of it: stride by the lanes that are there.
        uint width = min(gl_SubgroupSize, gl_WorkGroupSize.x);
        // The max as the largest order key: exact and the same in any order, NaN included
        // (a float max() of a NaN depends on the order, and so would the picks).
        uint mk = 0u;
        for (uint i = lane; i < N; i += width) {
            float l = ROUTE_LOGIT(i);
            route_key[i] = floatBitsToUint(l);
            mk = max(mk, order_key(l));
        }
        mk = subgroupMax(mk);
        float m = uintBitsToFloat((mk & 0x80000000u) != 0u ? mk & 0x7fffffffu : ~mk);
        for (uint i = lane; i < N; i += width) {
            route_key[i] = order_key(exp(uintBitsToFloat(route_key[i]) - m));
        }
        if ((N + width - 1u) / width * N <= ROUTE_RANK_BUDGET) {
            // Every lane reads every key: the writes above made visible to the subgroup.
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            for (uint i = lane; i < N; i += width) {
                uint key = route_key[i];
                uint rank = 0u;
                for (uint j = 0u; j < N; j++) {
                    uint kj = route_key[j];
                    rank += kj > key || (kj == key && j < i) ? 1u : 0u;
                }
                if (rank < K) {
                    route_id[rank] = i;
                    // e >= 0, so its order key is its bits with the sign bit set.
                    route_w[rank] = uintBitsToFloat(key & 0x7fffffffu);
                }
            }
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            if (lane == 0u) {
                float total = 0.0;
                for (uint r = 0u; r < K; r++) {
                    total += route_w[r];
                }
                for (uint r = 0u; r < K; r++) {
                    route_w[r] /= total;
                }
            }
        } else {
            uint prev_key = 0u;
            uint prev_idx = NONE;
            float total = 0.0;
            for (uint r = 0u; r < K; r++) {
                // This lane's best candidate after the previous pick.
                uint bk = 0u;
                uint bi = NONE;
                for (uint i = lane; i < N; i += width) {
                    uint key = route_key[i];
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
    }
    barrier();
}

#endif // ROUTE_PICK_GLSL
