// The workgroup-wide best (key, index) pair: the largest `order_key`, ties to the lower index
// (`before`, common.glsl); index NONE means "no candidate". Used by argmax and top_k. Uniform
// control flow required.

shared uint best_key[gl_WorkGroupSize.x];
shared uint best_idx[gl_WorkGroupSize.x];

// Returns the best (key, index) (index NONE when no invocation had a candidate).
uvec2 wg_best(uint key, uint idx) {
    uint t = gl_LocalInvocationID.x;
    best_key[t] = key;
    best_idx[t] = idx;
    barrier();
    for (uint s = gl_WorkGroupSize.x / 2u; s > 0u; s >>= 1u) {
        if (t < s && before(best_key[t + s], best_idx[t + s], best_key[t], best_idx[t])) {
            best_key[t] = best_key[t + s];
            best_idx[t] = best_idx[t + s];
        }
        barrier();
    }
    uvec2 r = uvec2(best_key[0], best_idx[0]);
    barrier();
    return r;
}

// Returns the best index (NONE when no invocation had a candidate).
uint wg_argbest(uint key, uint idx) {
    return wg_best(key, idx).y;
}
