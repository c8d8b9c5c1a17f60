#version 450
#extension GL_GOOGLE_include_directive : require
// expert_matvec: y[j, o] = sum_i w[idx[j], o, i] * x[j?, i] for j < K; the expert index is read
// on the device (clamped into 0..E, as the reference does).
// Bindings: 0 = y f32[K, O], 1 = w [E, O, I] of DTYPE_1, 2 = idx i32[K], 3 = x f32[I] or
// f32[K, I].
// Spec constants: 0 = workgroup size (power of two), 1 = O, 2 = I, 3 = ROWS (rows per
// workgroup, 1..=8), 4 = VEC4 (see matvec_core.glsl), 5 = E, 6 = K, 7 = X_PER_ROW (1 when x
// is [K, I]).
// Dispatch: K * ceil(O / ROWS) workgroups.
#include "common.glsl"

layout(set = 0, binding = 0, std430) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1, std430) readonly buffer W { uint w[]; };
layout(set = 0, binding = 1, std430) readonly buffer W4 { uvec4 w4[]; };
layout(set = 0, binding = 1, std430) readonly buffer WPair { uvec2 w_pair[]; };
layout(set = 0, binding = 2, std430) readonly buffer Idx { int idx[]; };
layout(set = 0, binding = 3, std430) readonly buffer X { float x[]; };
layout(set = 0, binding = 3, std430) readonly buffer X4 { vec4 x4[]; };

#include "matvec_core.glsl"

layout(constant_id = 5) const uint E = 1;
layout(constant_id = 6) const uint K = 1;
layout(constant_id = 7) const uint X_PER_ROW = 0;

void main() {
    uint per_expert = (O + ROWS - 1u) / ROWS;
    uint g = group_id();
    uint j = g / per_expert;
    if (j >= K) {
        return;
    }
    uint row0 = (g - j * per_expert) * ROWS;
    uint e = uint(clamp(idx[j], 0, int(E) - 1));
    uint xoff = X_PER_ROW != 0u ? j * I : 0u;
    float dot_t = matvec_rows(e * O + row0, e * O + O - 1u, xoff);
    uint t = gl_LocalInvocationID.x;
    if (t < ROWS && row0 + t < O) {
        y[j * O + row0 + t] = dot_t;
    }
}
