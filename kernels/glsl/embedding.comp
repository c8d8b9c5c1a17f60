#version 450
#extension GL_GOOGLE_include_directive : require
// embedding: y[i] = table[token, i] (the token is clamped into 0..V).
// Bindings: 0 = y f32[H], 1 = table [V, H] of DTYPE_1 (a block format: rows as quant.glsl
// lays them out, the row's element dequantised), 2 = token i32[1], or with TOKEN_KEY the
// argmax's u64 key (matvec_step.glsl), whose low word is the token's complement.
// Spec constants: 0 = workgroup size, 1 = V, 2 = H.
// Dispatch: ceil(H / workgroup size).
#include "common.glsl"
#include "quant.glsl"

#ifndef TOKEN_KEY
#define TOKEN_KEY 0
#endif

layout(constant_id = 1) const uint V = 1;
layout(constant_id = 2) const uint H = 1;

layout(set = 0, binding = 0, std430) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1, std430) readonly buffer Table { uint table[]; };
layout(set = 0, binding = 2, std430) readonly buffer Token { int token[]; };

void main() {
    uint i = global_id();
    if (i >= H) {
        return;
    }
#if TOKEN_KEY
    uint t = min(~uint(token[0]), V - 1u);
#else
    uint t = uint(clamp(token[0], 0, int(V) - 1));
#endif
#if DTYPE_1 == Q8_0 || DTYPE_1 == Q4_0
    y[i] = Q_LOAD(DTYPE_1, table, t, i, H);
#else
    y[i] = LOAD(DTYPE_1, table, t * H + i);
#endif
}
