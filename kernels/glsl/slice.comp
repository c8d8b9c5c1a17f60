#version 450
#extension GL_GOOGLE_include_directive : require
// slice: y = x[.., START..START+COUNT, ..] along one axis, any dtype (bits are copied).
// Viewing x as [OUTER, LEN, INNER]: y[o, a, i] = x[o, START + a, i].
// Bindings: 0 = y [OUTER, COUNT, INNER], 1 = x [OUTER, LEN, INNER], both of DTYPE_1.
// Defines: DTYPE_1 (F32, F16, BF16 or I32; 16-bit dtypes are handled a word, two elements, per
// invocation, and the pad half of an odd-sized result is written as 0).
// Spec constants: 0 = workgroup size, 1 = OUTER, 2 = LEN, 3 = START, 4 = COUNT, 5 = INNER.
// Dispatch: ceil(output words / workgroup size).
#include "common.glsl"

#if DTYPE_1 != F32 && DTYPE_1 != F16 && DTYPE_1 != BF16 && DTYPE_1 != I32
#error "DTYPE_1 must be F32, F16, BF16 or I32"
#endif

layout(constant_id = 1) const uint OUTER = 1;
layout(constant_id = 2) const uint LEN = 1;
layout(constant_id = 3) const uint START = 0;
layout(constant_id = 4) const uint COUNT = 1;
layout(constant_id = 5) const uint INNER = 1;

layout(set = 0, binding = 0, std430) writeonly buffer Y { uint y[]; };
layout(set = 0, binding = 1, std430) readonly buffer X { uint x[]; };

uint source(uint e) {
    uint per_outer = COUNT * INNER;
    uint o = e / per_outer;
    uint r = e - o * per_outer;
    return o * LEN * INNER + START * INNER + r;
}

void main() {
    uint w = global_id();
    uint n = OUTER * COUNT * INNER;
#if DTYPE_1 == F16 || DTYPE_1 == BF16
    if (2u * w >= n) {
        return;
    }
    uint lo = HALF_BITS(x, source(2u * w));
    uint hi = 2u * w + 1u < n ? HALF_BITS(x, source(2u * w + 1u)) : 0u;
    y[w] = lo | (hi << 16);
#else
    if (w >= n) {
        return;
    }
    y[w] = x[source(w)];
#endif
}
