#version 450
#extension GL_GOOGLE_include_directive : require
// prefetch: reads one word of every 32-byte sector of PF_SLICES weight slices and discards it,
// so that the memory behind them is in the L2 cache when the next levels' matvecs read it.
// The fusion compiler adds it beside a level that streams no weights of its own (the attention
// block, bound by latency, its memory otherwise idle), without a barrier between them
// (fuse::prefetch).
// Bindings: 0 = sink (one word, written never in practice: the loads' results must look used),
// 1..=PF_SLICES = the weight slices.
// Defines: PF_SLICES (1..=8).
// Spec constants: 0 = workgroup size, 1..=8 = sectors (32 bytes) of slice k.
// Dispatch: any number of workgroups; each invocation strides over the sectors.
#include "common.glsl"

layout(constant_id = 1) const uint SECTORS1 = 0;
layout(constant_id = 2) const uint SECTORS2 = 0;
layout(constant_id = 3) const uint SECTORS3 = 0;
layout(constant_id = 4) const uint SECTORS4 = 0;
layout(constant_id = 5) const uint SECTORS5 = 0;
layout(constant_id = 6) const uint SECTORS6 = 0;
layout(constant_id = 7) const uint SECTORS7 = 0;
layout(constant_id = 8) const uint SECTORS8 = 0;

layout(set = 0, binding = 0, std430) writeonly buffer Sink { uint sink[]; };

#define SLICE(k)                                                                            \
    layout(set = 0, binding = k, std430) readonly buffer P##k { uint p##k[]; };
#define READ(k)                                                                             \
    for (uint s = id; s < SECTORS##k; s += stride) {                                        \
        acc ^= p##k[8u * s];                                                                \
    }

SLICE(1)
#if PF_SLICES >= 2
SLICE(2)
#endif
#if PF_SLICES >= 3
SLICE(3)
#endif
#if PF_SLICES >= 4
SLICE(4)
#endif
#if PF_SLICES >= 5
SLICE(5)
#endif
#if PF_SLICES >= 6
SLICE(6)
#endif
#if PF_SLICES >= 7
SLICE(7)
#endif
#if PF_SLICES >= 8
SLICE(8)
#endif

void main() {
    uint id = global_id();
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_WorkGroupSize.x;
    uint acc = 0u;
    READ(1)
#if PF_SLICES >= 2
    READ(2)
#endif
#if PF_SLICES >= 3
    READ(3)
#endif
#if PF_SLICES >= 4
    READ(4)
#endif
#if PF_SLICES >= 5
    READ(5)
#endif
#if PF_SLICES >= 6
    READ(6)
#endif
#if PF_SLICES >= 7
    READ(7)
#endif
#if PF_SLICES >= 8
    READ(8)
#endif
    // Data-dependent, so the compiler keeps every load; harmless if it ever holds.
    if (acc == 0x9e3779b9u) {
        sink[0] = acc;
    }
}
