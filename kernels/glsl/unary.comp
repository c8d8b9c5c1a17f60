#version 450
#extension GL_GOOGLE_include_directive : require
// unary (silu, sigmoid, softplus, exp, neg by OP): y[i] = f(x[i]).
// softplus is torch's (beta 1, threshold 20): x > 20 ? x : log1p(exp(x)).
// Bindings: 0 = y f32[NUMEL], 1 = x of DTYPE_1.
// Defines: OP = SILU | SIGMOID | SOFTPLUS | EXP | NEG, DTYPE_1.
// Spec constants: 0 = workgroup size, 1 = NUMEL.
// Dispatch: ceil(NUMEL / workgroup size).
#include "common.glsl"

#define SILU 1
#define SIGMOID 2
#define SOFTPLUS 3
#define EXP 4
#define NEG 5

layout(constant_id = 1) const uint NUMEL = 1;

layout(set = 0, binding = 0, std430) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1, std430) readonly buffer X { uint x[]; };

// log(1 + e) without losing e when it is small (Goldberg's log1p: the rounding error of 1 + e
// cancels in log(u) / (u - 1)).
float log1p_(float e) {
    float u = 1.0 + e;
    return u == 1.0 ? e : log(u) * (e / (u - 1.0));
}

void main() {
    uint i = global_id();
    if (i >= NUMEL) {
        return;
    }
    float v = LOAD(DTYPE_1, x, i);
#if OP == SILU
    y[i] = silu(v);
#elif OP == SIGMOID
    y[i] = 1.0 / (1.0 + exp(-v));
#elif OP == SOFTPLUS
    y[i] = v > 20.0 ? v : log1p_(exp(v));
#elif OP == EXP
    y[i] = exp(v);
#elif OP == NEG
    y[i] = -v;
#else
#error "OP must be SILU, SIGMOID, SOFTPLUS, EXP or NEG"
#endif
}
