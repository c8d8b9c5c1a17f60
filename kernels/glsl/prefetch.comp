#version 450
#extension GL_GOOGLE_include_directive : require
// prefetch: reads one word of every 32-byte sector of PF_SLICES weight slices and discards it,
// so that the memory behind them is in the L2 cache when the next levels' matvecs read it.
// The fusion compiler adds it beside a level that streams no weights of its own (the attention
// block, bound by latency, its memory otherwise idle), without a barrier between them
// (fuse::prefetch).
// With PF_KV (and PF_SLICES 0: fuse::kv_prefetch), it reads an attention block's K and V caches
// instead, every kv head's slots 0 .. min(pos, CAP - 1), at most KV_LIMIT of them, a level or
// two before the block: the block loads its first K/V tile at its start, where that load's
// latency from DRAM is its path.
// Its accesses order nothing: it writes only the sink, which nothing reads, and what it reads
// it discards. It declares so in the default of specialization constant 191 (UNORDERED), which
// the runtime's handoff plan reads (session::handoff): a prefetch of caches a later level
// writes does not keep that level from being handed over.
// Bindings: 0 = sink (one word, written never in practice: the loads' results must look used),
// 1..=PF_SLICES = the weight slices; with PF_KV then PF_SLICES + 1 = pos i32[1],
// PF_SLICES + 2 = K cache, PF_SLICES + 3 = V cache (both [HKV, CAP, ROW_WORDS words]).
// Defines: PF_SLICES (0..=8, at least 1 without PF_KV), PF_KV (0/1).
// Spec constants: 0 = workgroup size, 1..=8 = sectors (32 bytes) of slice k; with PF_KV 9 = HKV,
// 10 = CAP, 11 = ROW_WORDS (4-byte words per cache slot), 12 = KV_LIMIT.
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
layout(constant_id = 191) const uint UNORDERED = 1;

layout(set = 0, binding = 0, std430) writeonly buffer Sink { uint sink[]; };

#define SLICE(k)                                                                            \
    layout(set = 0, binding = k, std430) readonly buffer P##k { uint p##k[]; };
#define READ(k)                                                                             \
    for (uint s = id; s < SECTORS##k; s += stride) {                                        \
        acc ^= p##k[8u * s];                                                                \
    }

#if PF_SLICES >= 1
SLICE(1)
#endif
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

#ifndef PF_KV
#define PF_KV 0
#endif
#if PF_KV
layout(constant_id = 9) const uint HKV = 1;
layout(constant_id = 10) const uint CAP = 1;
layout(constant_id = 11) const uint ROW_WORDS = 1;
layout(constant_id = 12) const uint KV_LIMIT = 1;
#define KV_BINDING(o) (PF_SLICES + o)
layout(set = 0, binding = KV_BINDING(1), std430) readonly buffer Pos { int pos[]; };
layout(set = 0, binding = KV_BINDING(2), std430) readonly buffer KC { uint kc[]; };
layout(set = 0, binding = KV_BINDING(3), std430) readonly buffer VC { uint vc[]; };
#endif

void main() {
    uint id = global_id();
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_WorkGroupSize.x;
    uint acc = 0u;
#if PF_KV
    {
        // The position this step's attention blocks read, clamped as they clamp it. A head's
        // first n slots are n * ROW_WORDS contiguous words; one word of every 8 (a sector)
        // read, the last sector's word clamped into them.
        int p = pos[0];
        uint n = min(uint(clamp(p, 0, int(CAP) - 1)) + 1u, KV_LIMIT);
        uint words = n * ROW_WORDS;
        uint per_head = (words + 7u) / 8u;
        for (uint s = id; s < HKV * per_head; s += stride) {
            uint h = s / per_head;
            uint w = h * CAP * ROW_WORDS + min(8u * (s - h * per_head), words - 1u);
            acc ^= kc[w] ^ vc[w];
        }
    }
#endif
#if PF_SLICES >= 1
    READ(1)
#endif
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
    // Data-dependent, so the compiler keeps every load; harmless if it ever holds. UNORDERED
    // read so that the module keeps it (glslang drops a specialization constant no code uses).
    if (UNORDERED != 0u && acc == 0x9e3779b9u) {
        sink[0] = acc;
    }
}
