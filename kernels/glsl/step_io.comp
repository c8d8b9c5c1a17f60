#version 450
// step_io: replay's work between two steps, the runtime's own kernel (not a schedule's: its
// SPIR-V is committed beside runtime/src/session/step_io.rs, and compiler/tests/step_io.rs
// checks it against this source). The handoff words set to HANDOFF_EMPTY for the next step
// (kernels/glsl/handoff.glsl), and up to two runs of words of the I/O buffer (the step's token,
// its logits) copied to the host's ring. A compute dispatch and not vkCmdFillBuffer and
// vkCmdCopyBuffer: on an H100 those transfers between two steps held the queue ~6 µs per
// token, and moved after the next step's first level they held it there (docs/perf.md,
// session 25).
// Bindings: 0 = the handoff words, 1 = the source words, 2 = the ring.
// Push constants: the words to fill and their value; each run's source word, ring word and
// length. Dispatch: any number of workgroups (a grid-stride loop).

// 64 invocations: within every device's limits (Vulkan guarantees 128).
layout(local_size_x = 64) in;

layout(set = 0, binding = 0, std430) writeonly buffer Words { uint words[]; };
layout(set = 0, binding = 1, std430) readonly buffer Src { uint src[]; };
layout(set = 0, binding = 2, std430) writeonly buffer Ring { uint ring[]; };

layout(push_constant) uniform StepIo {
    uint fill_words;
    uint fill_value;
    uint src0;
    uint dst0;
    uint len0;
    uint src1;
    uint dst1;
    uint len1;
} io;

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < io.fill_words; i += stride) {
        words[i] = io.fill_value;
    }
    for (uint i = gl_GlobalInvocationID.x; i < io.len0; i += stride) {
        ring[io.dst0 + i] = src[io.src0 + i];
    }
    for (uint i = gl_GlobalInvocationID.x; i < io.len1; i += stride) {
        ring[io.dst1 + i] = src[io.src1 + i];
    }
}
