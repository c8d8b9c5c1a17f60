// The frame of a persistent region (fuse::persistent generates the including source): one
// dispatch standing for several dependency levels. Its workgroups stride over each level's
// virtual workgroups, then meet at a grid barrier in device memory before the next level,
// where a plain schedule has a pipeline barrier (~2.3 µs of idle GPU each on an H100).
//
// The grid barrier waits for every workgroup of the dispatch, so the runtime dispatches no
// more workgroups than the device keeps resident at once (one per compute unit), and never
// on lavapipe unless a test asks for one workgroup.
//
// Binding 0: the barrier's two counters, zero before the dispatch and zero again after each
// barrier (sense reversal: the last to arrive resets the count and advances the generation
// the others wait on), so nothing resets them between dispatches or steps.
// Buffers the levels write and read are declared `coherent`: a value written by one workgroup
// is read by another in the same dispatch, past the caches of its unit.

#extension GL_KHR_memory_scope_semantics : require

layout(set = 0, binding = 0, std430) coherent buffer GridSync {
    uint grid_count;
    uint grid_generation;
};

// A level's input (times its norm weight), staged once per workgroup (persistent_matvec.glsl);
// the including source defines PM_MAX_I, the longest input of its levels.
shared float pm_x[PM_MAX_I];

void grid_barrier() {
    // Release: every store of this workgroup's level happens before its arrival.
    controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                   gl_SemanticsAcquireRelease);
    if (gl_LocalInvocationIndex == 0u) {
        // Read before arriving: the generation cannot advance until this workgroup arrives.
        uint gen = atomicLoad(grid_generation, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                              gl_SemanticsAcquire);
        uint arrived = atomicAdd(grid_count, 1u, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                                 gl_SemanticsAcquireRelease);
        if (arrived + 1u == gl_NumWorkGroups.x) {
            atomicStore(grid_count, 0u, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                        gl_SemanticsRelaxed);
            atomicAdd(grid_generation, 1u, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                      gl_SemanticsRelease);
        } else {
            while (atomicLoad(grid_generation, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                              gl_SemanticsAcquire) == gen) {
            }
        }
    }
    // Acquire: what every workgroup wrote before arriving is visible to all invocations here.
    controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                   gl_SemanticsAcquireRelease);
}
