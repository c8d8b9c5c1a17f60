// The step's tail inside the matvec that computes the logits (lm_head), included by
// fused_matvec.glsl when STEP: the argmax of the kernel's output rows (the largest in total
// order, ties to the lower index, as fused_argmax.glsl) written into the token state, and the
// position advanced in its state, with no dispatch and no dependency level of their own.
//
// The token state holds the argmax's key (the schedule's `TokenEncoding::Key`): each workgroup
// folds its rows' best into one 64-bit key, (order_key << 32) | ~row, so that the largest key
// is the best row (the larger value; the lower row among equal values), and adds it to the
// state with one atomicMax whose result it does not wait for. Nobody counts arrivals and nobody
// combines: the barrier after the step's last level makes the final key visible to its readers
// (the next step's embedding, the host), which take the token as the low word's complement. A
// dispatch of zeroes in the step's level 1 sets the key back below every logit's once they have
// read it (fuse::zeros::reset_token_key). On an H100 this beat an arrival counted per workgroup
// (a fence, then an atomicAdd it waited for, in 64 buckets; the last to arrive wrote the token)
// by 3.5-4.3 µs per token: ~38k workgroups each held their slot for two L2 round trips.
// Workgroup 0 advances the position (no workgroup here reads it).
//
// STEP_FILTER (the compiler sets it for f32, f16, bf16 and q8_0 weights): each workgroup reads
// the key as it begins (step_begin), a lower bound of the state's for the rest of the dispatch
// (the level-1 reset is behind a barrier, and after it only atomicMax writes the key), and a
// workgroup whose best is not above that leaves the state alone: the first wave's workgroups
// still fold theirs, the later ones seldom. On an H200 bf16 +0.7% (its ~19k atomicMax on one
// address held lm_head's last workgroups); q8_0 -0.1% and q4_0 -0.9% in workgroups of one
// subgroup, for reasons not known (fewer reads lost alike: docs/perf.md, session 56). In
// workgroups of two subgroups (session 57) q8_0 +0.6% with it, q4_0 still -0.4%.
//
// The including source defines STEP_BINDING: the token state (u64), then the position state
// and the position (i32 each; they may be one buffer).

#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_shader_atomic_int64 : require

#ifndef STEP_FILTER
#define STEP_FILTER 0
#endif

// 1: always fold the rows through shared memory (the path of subgroups narrower than ROWS;
// the tests set it to reach that path on devices whose subgroups are wide enough).
#ifndef STEP_FOLD_SHARED
#define STEP_FOLD_SHARED 0
#endif

layout(set = 0, binding = STEP_BINDING, std430) buffer StepKey { uint64_t step_key[]; };
layout(set = 0, binding = STEP_BINDING + 1, std430) writeonly buffer StepPosOut { int step_pos_out[]; };
layout(set = 0, binding = STEP_BINDING + 2, std430) readonly buffer StepPosIn { int step_pos_in[]; };

// The rows' (order key, row) for the fold through shared memory (argbest.glsl's wg_best would
// hold a pair per invocation: 1 KB that cost bf16's lm_head 0.3% on an H100).
shared uint step_key_s[8];
shared uint step_row_s[8];

// Called by every invocation as the workgroup begins. STEP_FILTER: the key then, read by
// subgroup 0, which folds the rows (step_arrive). On the shared-memory path invocation 0 folds
// them: in subgroup 0 on the devices measured, and where it is not, step_seen stays 0 and every
// workgroup folds (the filter off, not wrong).
#if STEP_FILTER
uint64_t step_seen = 0ul;
#endif

void step_begin() {
#if STEP_FILTER
    if (gl_SubgroupID == 0u) {
        step_seen = atomicLoad(step_key[0], gl_ScopeDevice, gl_StorageSemanticsBuffer,
                               gl_SemanticsRelaxed);
    }
#endif
}

// Called by every invocation of a workgroup that computes rows, after its row values: (key,
// row) is invocation t's row for t < ROWS (rows <= 8), row NONE for the others.
void step_arrive(uint key, uint row) {
    uint bk;
    uint br;
    if (STEP_FOLD_SHARED == 0 && gl_SubgroupSize >= ROWS) {
        // The rows' invocations are lanes of subgroup 0: no workgroup barrier. Lanes without a
        // row offer key 0 and row NONE, which no row loses to (the lowest row wins ties).
        if (gl_SubgroupID != 0u) {
            return;
        }
        bk = subgroupMax(key);
        br = subgroupMin(key == bk ? row : NONE);
        if (!subgroupElect()) {
            return;
        }
    } else {
        uint t = gl_LocalInvocationID.x;
        if (t < ROWS) {
            step_key_s[t] = key;
            step_row_s[t] = row;
        }
        barrier();
        if (t != 0u) {
            return;
        }
        bk = 0u;
        br = NONE;
        for (uint j = 0u; j < ROWS; j++) {
            if (before(step_key_s[j], step_row_s[j], bk, br)) {
                bk = step_key_s[j];
                br = step_row_s[j];
            }
        }
    }
    uint64_t best = (uint64_t(bk) << 32) | uint64_t(~br);
#if STEP_FILTER
    if (best > step_seen)
#endif
    atomicMax(step_key[0], best);
    if (group_id() == 0u) {
        // The position state and the position may be one buffer: read, then write.
        step_pos_out[0] = step_pos_in[0] + 1;
    }
}
