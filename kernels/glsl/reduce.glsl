// Workgroup-wide reductions through shared memory (no subgroup operations, so they run
// everywhere). The workgroup size must be a power of two. Every invocation of the workgroup
// must call them (uniform control flow); each ends with a barrier, so the shared array can be
// reused at once and anything written to shared memory before the call is visible after it.

shared float red_f[gl_WorkGroupSize.x];

float wg_sum(float v) {
    uint t = gl_LocalInvocationID.x;
    red_f[t] = v;
    barrier();
    for (uint s = gl_WorkGroupSize.x / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            red_f[t] += red_f[t + s];
        }
        barrier();
    }
    float r = red_f[0];
    barrier();
    return r;
}

float wg_max(float v) {
    uint t = gl_LocalInvocationID.x;
    red_f[t] = v;
    barrier();
    for (uint s = gl_WorkGroupSize.x / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            red_f[t] = max(red_f[t], red_f[t + s]);
        }
        barrier();
    }
    float r = red_f[0];
    barrier();
    return r;
}
