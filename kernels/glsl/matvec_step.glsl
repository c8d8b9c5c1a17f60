// The step's tail inside the matvec that computes the logits (lm_head), included by
// fused_matvec.glsl when STEP: the argmax of the kernel's output rows (the largest in total
// order, ties to the lower index, as fused_argmax.glsl) written into the token state, and the
// position advanced in its state, with no dispatch and no dependency level of their own.
//
// Each workgroup folds its rows' best into one 64-bit key, (order_key << 32) | ~row, so that
// the largest key is the best row (the larger value; the lower row among equal values), and
// adds it to its bucket's best with one atomicMax, then counts itself in the bucket. Atomics on
// one address serialise in the L2 (tens of thousands of workgroups on one counter cost ~50 µs on
// an H100), so the workgroups spread over STEP_BUCKETS buckets, each on a line of its own; the
// last workgroup to arrive in a bucket adds the bucket's best to the dispatch's and counts the
// bucket, and the last bucket writes the token and the position. Each last arrival sets its
// counters back to zero for the next step. Nobody waits: the others leave after counting.
//
// The including source defines STEP_BINDING (the token state; then the position state, the
// position, and the counters: 1 + STEP_BUCKETS slots of STEP_SLOT bytes, each a u64 best then a
// u32 arrival count, zero before the dispatch and zero again after it), STEP_BUCKETS and
// STEP_SLOT (codegen's constants, which size the counters).

#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_shader_atomic_int64 : require

// 1: always fold the rows through shared memory (the path of subgroups narrower than ROWS;
// the tests set it to reach that path on devices whose subgroups are wide enough).
#ifndef STEP_FOLD_SHARED
#define STEP_FOLD_SHARED 0
#endif

layout(set = 0, binding = STEP_BINDING, std430) writeonly buffer StepTok { int step_token[]; };
layout(set = 0, binding = STEP_BINDING + 1, std430) writeonly buffer StepPosOut { int step_pos_out[]; };
layout(set = 0, binding = STEP_BINDING + 2, std430) readonly buffer StepPosIn { int step_pos_in[]; };
// Slot 0 is the dispatch's, slot 1 + b bucket b's.
layout(set = 0, binding = STEP_BINDING + 3, std430) coherent buffer StepBest { uint64_t step_c64[]; };
layout(set = 0, binding = STEP_BINDING + 3, std430) coherent buffer StepCount { uint step_c32[]; };

// The workgroups that compute rows (the others leave at once and never arrive).
const uint STEP_GROUPS = (O + ROWS - 1u) / ROWS;
const uint STEP_USED = STEP_GROUPS < STEP_BUCKETS ? STEP_GROUPS : STEP_BUCKETS;
// The rows' (order key, row) for the fold through shared memory (argbest.glsl's wg_best would
// hold a pair per invocation: 1 KB that cost bf16's lm_head 0.3% on an H100).
shared uint step_key_s[8];
shared uint step_row_s[8];

// Adds `key` to slot s's best and counts one arrival there; true for the last of `arrivals`,
// which takes the slot's best into `best` and sets the slot back to zero.
bool step_count(uint s, uint64_t key, uint arrivals, out uint64_t best) {
    uint b64 = s * (STEP_SLOT / 8u);
    uint c32 = s * (STEP_SLOT / 4u) + 2u;
    atomicMax(step_c64[b64], key);
    // The best above is performed before this arrival is counted.
    memoryBarrierBuffer();
    if (atomicAdd(step_c32[c32], 1u) != arrivals - 1u) {
        return false;
    }
    memoryBarrierBuffer();
    best = atomicExchange(step_c64[b64], uint64_t(0));
    atomicExchange(step_c32[c32], 0u);
    return true;
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
    uint g = group_id();
    uint b = g % STEP_USED;
    uint in_bucket = STEP_GROUPS / STEP_USED + (b < STEP_GROUPS % STEP_USED ? 1u : 0u);
    uint64_t best;
    if (!step_count(1u + b, (uint64_t(bk) << 32) | uint64_t(~br), in_bucket, best)) {
        return;
    }
    if (!step_count(0u, best, STEP_USED, best)) {
        return;
    }
    step_token[0] = int(~uint(best & uint64_t(0xffffffffu)));
    // The position state and the position may be one buffer: read, then write.
    step_pos_out[0] = step_pos_in[0] + 1;
}
