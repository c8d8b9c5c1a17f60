#version 450
#extension GL_GOOGLE_include_directive : require
// copy (write_state): dst[i] = src[i], word by word (any dtype: the words are copied as bits).
// Bindings: 0 = the state buffer (dst), 1 = the value.
// Spec constants: 0 = workgroup size, 1 = WORDS (32-bit words to copy).
// Dispatch: ceil(WORDS / workgroup size) workgroups.
#include "common.glsl"

layout(constant_id = 1) const uint WORDS = 1;

layout(set = 0, binding = 0, std430) writeonly buffer Dst { uint dst[]; };
layout(set = 0, binding = 1, std430) readonly buffer Src { uint src[]; };

void main() {
    uint i = global_id();
    if (i < WORDS) {
        dst[i] = src[i];
    }
}
