#version 450
#extension GL_GOOGLE_include_directive : require
// kv_write: cache[h, pos, :] = x[h, :] for every kv head h; the cache is updated in place.
// Bindings: 0 = the cache state [HKV, CAP, D] (f32, or f16 with KV_DTYPE F16: two elements per
// word, rounded to nearest by common.glsl's f16_round, D even), 1 = x f32[HKV, D], 2 = pos i32[1].
// Spec constants: 0 = workgroup size, 1 = HKV, 2 = CAP, 3 = D.
// Dispatch: ceil(HKV*D / workgroup size), or ceil(HKV*D/2 / workgroup size) for f16 (one word,
// two elements, per invocation). A position outside 0..CAP writes nothing.
#include "common.glsl"

layout(constant_id = 1) const uint HKV = 1;
layout(constant_id = 2) const uint CAP = 1;
layout(constant_id = 3) const uint D = 1;

layout(set = 0, binding = 0, std430) writeonly buffer Cache { uint cache[]; };
layout(set = 0, binding = 1, std430) readonly buffer X { uint x[]; };
layout(set = 0, binding = 2, std430) readonly buffer Pos { int pos[]; };

#ifndef KV_DTYPE
#define KV_DTYPE F32
#endif

void main() {
    uint i = global_id();
    int p = pos[0];
#if KV_DTYPE == F16
    // Invocation i writes elements 2i and 2i + 1 (D is even: a pair never straddles heads).
    if (i >= HKV * D / 2u || p < 0 || uint(p) >= CAP) {
        return;
    }
    uint h = 2u * i / D;
    uint c = 2u * i - h * D;
    vec2 pair = vec2(f16_round(uintBitsToFloat(x[2u * i])), f16_round(uintBitsToFloat(x[2u * i + 1u])));
    cache[((h * CAP + uint(p)) * D + c) / 2u] = packHalf2x16(pair);
#else
    if (i >= HKV * D || p < 0 || uint(p) >= CAP) {
        return;
    }
    uint h = i / D;
    uint c = i - h * D;
    cache[(h * CAP + uint(p)) * D + c] = x[i];
#endif
}
