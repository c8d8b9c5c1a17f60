// The frame of a persistent region (fuse::persistent generates the including source): one
// dispatch standing for several dependency levels. Its workgroups each own a share of every
// level's rows and meet at a grid barrier in device memory before the next level, where a plain
// schedule has a pipeline barrier (~2.3 µs of idle GPU each on an H100).
//
// The grid barrier waits for every workgroup of the dispatch, so the runtime dispatches no
// more workgroups than the device keeps resident at once (one per compute unit), and never
// on lavapipe unless a test asks for one workgroup.
//
// Binding 0: two counters, zero before the dispatch and zero again after it. `grid_count`
// counts arrivals over the whole dispatch: barrier k (k = 1, 2, ...) is passed once it reaches
// k x workgroups, so an arrival is ONE atomic add whose result nobody waits for, and a waiter
// polls one word (a sense-reversing barrier costs a load, an add and, for the last arrival, a
// store and a second add, each a round trip to L2, per level). `grid_exits` counts workgroups
// done with their last level: the last one out zeroes both, when every workgroup has passed
// every wait, so nothing resets them between dispatches or steps.
// Buffers the levels write and read are declared `coherent`: a value written by one workgroup
// is read by another in the same dispatch, past the caches of its unit.

#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_shuffle : require

layout(set = 0, binding = 0, std430) coherent buffer GridSync {
    uint grid_count;
    uint grid_exits;
};

// A level's input (times its norm weight), staged once per workgroup, the partial dots of its
// lane clusters and the weight chunks each invocation holds (persistent_matvec.glsl); the
// including source defines PM_MAX_I (the longest input of its levels, a multiple of 8), PM_PF
// and PM_EACH_K(X), X(0) X(1) ... X(PM_PF - 1): the chunks are separate variables, not an
// array, so that they stay in registers (an array indexed in a loop may live in local memory,
// where storing a loaded chunk waits for the load).
shared vec4 pm_x4[PM_MAX_I / 4];
shared float pm_slot[gl_WorkGroupSize.x * PM_PF / 4];
#define PM_DECLARE(k) uvec4 pm_pf##k;
PM_EACH_K(PM_DECLARE)
#undef PM_DECLARE

// Barriers this workgroup has arrived at.
uint pm_arrivals = 0u;

// The grid barrier in two halves, so that loads issued between them (the next level's
// weights) are in flight while the workgroup waits. grid_arrive publishes this workgroup's
// level; grid_wait returns once every workgroup has arrived.
void grid_arrive() {
    // Release: every store of this workgroup's level happens before its arrival.
    controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                   gl_SemanticsAcquireRelease);
    if (gl_LocalInvocationIndex == 0u) {
        atomicAdd(grid_count, 1u, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                  gl_SemanticsRelease);
    }
    pm_arrivals += 1u;
}

void grid_wait() {
    if (gl_LocalInvocationIndex == 0u) {
        uint target = pm_arrivals * gl_NumWorkGroups.x;
        while (atomicLoad(grid_count, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                          gl_SemanticsAcquire) < target) {
        }
    }
    // Acquire: what every workgroup wrote before arriving is visible to all invocations here.
    controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                   gl_SemanticsAcquireRelease);
}

// After the workgroup's last level: the last workgroup out zeroes the counters.
void grid_exit() {
    if (gl_LocalInvocationIndex == 0u) {
        uint done = atomicAdd(grid_exits, 1u, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                             gl_SemanticsAcquireRelease);
        if (done + 1u == gl_NumWorkGroups.x) {
            atomicStore(grid_count, 0u, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                        gl_SemanticsRelaxed);
            atomicStore(grid_exits, 0u, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                        gl_SemanticsRelaxed);
        }
    }
}
