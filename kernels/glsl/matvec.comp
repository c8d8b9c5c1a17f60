#version 450
#extension GL_GOOGLE_include_directive : require
// matvec: y[o] = sum_i w[o, i] * x[i]  (w row-major [O, I] of DTYPE_1, accumulated in f32).
// Bindings: 0 = y f32[O], 1 = w [O, I] of DTYPE_1, 2 = x f32[I].
// Spec constants: 0 = workgroup size (power of two), 1 = O, 2 = I, 3 = ROWS (rows per
// workgroup, 1..=8), 4 = VEC4 (see matvec_core.glsl).
// Dispatch: ceil(O / ROWS) workgroups; the workgroup strides the row with 16-byte loads and
// reduces with subgroup arithmetic.
#include "common.glsl"

layout(set = 0, binding = 0, std430) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1, std430) readonly buffer W { uint w[]; };
layout(set = 0, binding = 1, std430) readonly buffer W4 { uvec4 w4[]; };
layout(set = 0, binding = 1, std430) readonly buffer WPair { uvec2 w_pair[]; };
layout(set = 0, binding = 2, std430) readonly buffer X { float x[]; };
layout(set = 0, binding = 2, std430) readonly buffer X4 { vec4 x4[]; };

#include "matvec_core.glsl"

void main() {
    uint row0 = group_id() * ROWS;
    if (row0 >= O) {
        return;
    }
    float dot_t = matvec_rows(row0, O - 1u, 0u);
    uint t = gl_LocalInvocationID.x;
    if (t < ROWS && row0 + t < O) {
        y[row0 + t] = dot_t;
    }
}
