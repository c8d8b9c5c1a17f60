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
// comparisons are exact, and the only sum has a fixed order. Picks are made with subgroup
// operations (no barrier per pick): by one subgroup where ranking fits, else by a tournament
// of the workgroup's subgroups (route_pick below).
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
// that routing.rs can force either path and compare their bits). lavapipe also ends a shader's
// loops after 65535 iterations in all (gallivm's loop limiter, LP_MAX_TGSI_LOOP_ITERATIONS):
// the rank path forced at 768 logits on its 8-wide subgroups (96 x 768 comparisons a lane)
// silently missed picks there; the budget keeps it far below.
#ifndef ROUTE_RANK_BUDGET
#define ROUTE_RANK_BUDGET 1024u
#endif

// The tournament's candidates: the best K of each of the first ROUTE_GROUPS subgroups' share
// of the logits, as (order key, index); key 0 and index NONE where a share has fewer than K.
#ifndef ROUTE_GROUPS
#define ROUTE_GROUPS 16u
#endif
shared uint route_ck[ROUTE_GROUPS * K];
shared uint route_ci[ROUTE_GROUPS * K];
// The largest logit's order key, over the workgroup.
shared uint route_mk;

// The K best of one share of the logits, by one subgroup of `width` lanes (every subgroup of
// the workgroup full, or a single one narrower: a partly filled last subgroup would skip the
// logits of its missing lanes; codegen sizes the router's workgroups in multiples of 64): lane `lane` owns
// logits base + t for t = lane, lane + width, ... < count (keys in route_key). Each lane keeps
// its best logit not yet taken (its head); a round takes the best head (a max and a min over
// the subgroup, no barrier), and only the lane it came from looks for its next. The share's K
// best go to route_ck/route_ci at `out_at`, in order. Uniform control flow in the subgroup.
void route_share(uint base, uint count, uint lane, uint width, uint out_at) {
    uint hk = 0u;
    uint hi = NONE;
    for (uint t = lane; t < count; t += width) {
        if (before(route_key[base + t], base + t, hk, hi)) {
            hk = route_key[base + t];
            hi = base + t;
        }
    }
    for (uint r = 0u; r < K; r++) {
        // The largest key, then the lowest index holding it (a real key is never 0: e >= 0,
        // so its order key has the sign bit set).
        uint key = subgroupMax(hi == NONE ? 0u : hk);
        uint best = subgroupMin(hi != NONE && hk == key ? hi : NONE);
        if (lane == 0u) {
            route_ck[out_at + r] = best == NONE ? 0u : key;
            route_ci[out_at + r] = best;
        }
        if (best != NONE && hi == best) {
            // This lane's next head: its best logit after the one just taken (every logit of
            // its own before that one is taken already).
            uint nk = 0u;
            uint ni = NONE;
            for (uint t = lane; t < count; t += width) {
                uint k2 = route_key[base + t];
                if (before(key, best, k2, base + t) && before(k2, base + t, nk, ni)) {
                    nk = k2;
                    ni = base + t;
                }
            }
            hk = nk;
            hi = ni;
        }
    }
}

// The K best of the `groups` shares' lists (each sorted, at most one a lane), merged by one
// subgroup: lane s holds list s's first item not yet taken; a round takes the best of them,
// and the lane it came from steps to its list's next. Fills route_id and route_w (e,
// renormalised in pick order).
void route_merge(uint groups, uint lane) {
    uint at = 0u;
    uint hk = 0u;
    uint hi = NONE;
    if (lane < groups) {
        hk = route_ck[lane * K];
        hi = route_ci[lane * K];
    }
    float total = 0.0;
    for (uint r = 0u; r < K; r++) {
        uint key = subgroupMax(hi == NONE ? 0u : hk);
        uint best = subgroupMin(hi != NONE && hk == key ? hi : NONE);
        float e = uintBitsToFloat(key & 0x7fffffffu);
        total += e;
        if (lane == 0u) {
            route_id[r] = best;
            route_w[r] = e;
        }
        if (best != NONE && hi == best) {
            at++;
            hk = at < K ? route_ck[lane * K + at] : 0u;
            hi = at < K ? route_ci[lane * K + at] : NONE;
        }
    }
    if (lane == 0u) {
        for (uint r = 0u; r < K; r++) {
            route_w[r] /= total;
        }
    }
}

// Fills route_id (indices, largest first) and route_w (their weights); ends with a barrier.
// Two ways to the same picks, chosen by the subgroup's width (each yields the one total order
// and sums the picks' e in that order, so kernels of either way agree bit for bit):
// - rank (where a lane's logits times N fit RANK_BUDGET: Qwen3-Next-small's 64 experts on
//   32-wide subgroups), by one subgroup: each lane counts, for each of its logits, the logits
//   before it in the order; those of rank < K are the picks. Independent comparisons, no
//   serial chain; every workgroup of the expert kernels that route for themselves runs it, on
//   their critical path (between the router's logits and the first expert weight load);
// - a tournament (Qwen3-Next's 512 top 10), by the whole workgroup: each of up to
//   ROUTE_GROUPS subgroups takes the K best of its share of the logits (route_share), then one
//   subgroup merges their lists (route_merge). A single subgroup's K rounds over all 512 (16 a
//   lane, each round a pass over them) took the router's level ~21 µs on an H200 (docs/perf.md,
//   session 50).
void route_pick() {
    // A workgroup narrower than the subgroup (32 invocations on a 64-wide device) fills only
    // part of it: stride by the lanes that are there.
    uint width = min(gl_SubgroupSize, gl_WorkGroupSize.x);
    uint lane = gl_SubgroupInvocationID;
    if ((N + width - 1u) / width * N <= ROUTE_RANK_BUDGET) {
        if (gl_SubgroupID == 0u) {
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
        }
    } else {
        // Every invocation loads its logits, then the max over the workgroup (as order keys,
        // as above), then each logit's key.
        uint mk = 0u;
        for (uint i = gl_LocalInvocationID.x; i < N; i += gl_WorkGroupSize.x) {
            float l = ROUTE_LOGIT(i);
            route_key[i] = floatBitsToUint(l);
            mk = max(mk, order_key(l));
        }
        if (gl_LocalInvocationID.x == 0u) {
            route_mk = 0u;
        }
        barrier();
        mk = subgroupMax(mk);
        if (subgroupElect()) {
            atomicMax(route_mk, mk);
        }
        barrier();
        mk = route_mk;
        float m = uintBitsToFloat((mk & 0x80000000u) != 0u ? mk & 0x7fffffffu : ~mk);
        for (uint i = gl_LocalInvocationID.x; i < N; i += gl_WorkGroupSize.x) {
            route_key[i] = order_key(exp(uintBitsToFloat(route_key[i]) - m));
        }
        barrier();
        // At most one share a lane of the merge.
        uint groups = min(min(gl_NumSubgroups, ROUTE_GROUPS), width);
        if (gl_SubgroupID < groups) {
            uint share = (N + groups - 1u) / groups;
            uint base = min(gl_SubgroupID * share, N);
            route_share(base, min(share, N - base), lane, width, gl_SubgroupID * K);
        }
        barrier();
        if (gl_SubgroupID == 0u) {
            route_merge(groups, lane);
        }
    }
    barrier();
}

#endif // ROUTE_PICK_GLSL
