// The timeline probe (`compile-model --timeline`; timing only, never for use): every kernel's
// own `main` is renamed `vkfuse_timed_main` (compiler/src/kernels/timeline.rs puts
// `#define main vkfuse_timed_main` after its `#version` line and includes this file at its
// end), and this `main` calls it between two reads of the device's realtime clock
// (VK_KHR_shader_clock's shaderDeviceClock). Invocation 0 of each workgroup writes when the
// workgroup began and when its invocation 0 was done, so the runtime can lay out what ran when
// inside a replayed step, handoffs included (`vkfuse timeline`, runtime/src/session/timeline.rs).
//
// The records live in a buffer the runtime allocates and passes by device address
// (VK_KHR_buffer_device_address) in specialization constants, so no kernel's bindings change:
// per probe pipeline one counter per workgroup of its largest grid, then per counter DEPTH
// records of eight words (begin and two marks, each the clock's two 32-bit halves; the end's low
// half, its high half being the begin's or one more, as a workgroup lives far less than 2^32 ns;
// and the SM the workgroup ran on, gl_SMIDNV where the kernel was wrapped with TIMELINE_SM, for
// `compile-model --timeline-sm` on NVIDIA's VK_NV_shader_sm_builtins, else ~0). A
// kernel's dispatches share a probe pipeline where barriers separate them (those that may run
// at once get their own: runtime/src/session/timeline.rs), so a counter's records, in the order
// its workgroups take them, are its dispatches in recording order. A workgroup takes its
// record's index with an atomic on its own counter, issued at its start so that its latency
// overlaps the kernel; a counter past DEPTH says how many were dropped. A kernel may mark two points of its invocation 0's way with TIMELINE_MARK(0)
// and TIMELINE_MARK(1) (common.glsl makes them nothing without the probe), for example when its
// input arrived and when its output is about to be written; an unmarked point records 0. Clock
// units are the driver's: NVIDIA's and lavapipe's count nanoseconds (`vkfuse timeline` checks
// the records' span against timestamps).

#extension GL_EXT_buffer_reference : require
#extension GL_EXT_buffer_reference_uvec2 : require

// Set by the runtime at pipeline creation (runtime/src/session/timeline.rs): the buffer's
// address, this dispatch's first counter and first record, the records per counter, and where
// the records begin (in words).
layout(constant_id = 900) const uint TIMELINE_ADDRESS_LO = 0u;
layout(constant_id = 901) const uint TIMELINE_ADDRESS_HI = 0u;
layout(constant_id = 902) const uint TIMELINE_SLOT = 0u;
layout(constant_id = 903) const uint TIMELINE_RECORD = 0u;
layout(constant_id = 904) const uint TIMELINE_DEPTH = 0u;
layout(constant_id = 905) const uint TIMELINE_RECORDS_AT = 0u;

layout(buffer_reference, std430, buffer_reference_align = 16) buffer TimelineWords {
    uint tl_words[];
};

void main() {
    uvec2 begin = clockRealtime2x32EXT();
    vkfuse_timeline_marks[0] = uvec2(0u);
    vkfuse_timeline_marks[1] = uvec2(0u);
    bool first = gl_LocalInvocationIndex == 0u;
    TimelineWords tl = TimelineWords(uvec2(TIMELINE_ADDRESS_LO, TIMELINE_ADDRESS_HI));
    uint g = gl_WorkGroupID.x +
             gl_NumWorkGroups.x * (gl_WorkGroupID.y + gl_NumWorkGroups.y * gl_WorkGroupID.z);
    uint n = 0u;
    if (first && (TIMELINE_ADDRESS_HI | TIMELINE_ADDRESS_LO) != 0u) {
        n = atomicAdd(tl.tl_words[TIMELINE_SLOT + g], 1u);
    }
    vkfuse_timed_main();
    if (first && (TIMELINE_ADDRESS_HI | TIMELINE_ADDRESS_LO) != 0u && n < TIMELINE_DEPTH) {
        uvec2 end = clockRealtime2x32EXT();
        uint at = TIMELINE_RECORDS_AT + 8u * (TIMELINE_RECORD + g * TIMELINE_DEPTH + n);
        tl.tl_words[at] = begin.x;
        tl.tl_words[at + 1u] = begin.y;
        tl.tl_words[at + 2u] = vkfuse_timeline_marks[0].x;
        tl.tl_words[at + 3u] = vkfuse_timeline_marks[0].y;
        tl.tl_words[at + 4u] = vkfuse_timeline_marks[1].x;
        tl.tl_words[at + 5u] = vkfuse_timeline_marks[1].y;
        tl.tl_words[at + 6u] = end.x;
#ifdef TIMELINE_SM
        tl.tl_words[at + 7u] = gl_SMIDNV;
#else
        tl.tl_words[at + 7u] = ~0u;
#endif
    }
}
