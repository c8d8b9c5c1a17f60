#version 450
#extension GL_GOOGLE_include_directive : require
// concat: y = [a | b] along one axis, any dtype (bits are copied). Viewing a as [OUTER, NA]
// and b as [OUTER, NB] (NA, NB: the axis length times the inner size), y[o] = a[o] ++ b[o].
// Bindings: 0 = y [OUTER, NA + NB], 1 = a, 2 = b, all of DTYPE_1 (= DTYPE_2).
// Defines: DTYPE_1, DTYPE_2 (F32, F16, BF16 or I32; 16-bit dtypes are handled a word per
// invocation, the pad half of an odd-sized result written as 0).
// Spec constants: 0 = workgroup size, 1 = OUTER, 2 = NA, 3 = NB.
// Dispatch: ceil(output words / workgroup size), one dispatch reading both inputs.
#include "common.glsl"

#if DTYPE_1 != F32 && DTYPE_1 != F16 && DTYPE_1 != BF16 && DTYPE_1 != I32
#error "DTYPE_1 must be F32, F16, BF16 or I32"
#endif

layout(constant_id = 1) const uint OUTER = 1;
layout(constant_id = 2) const uint NA = 1;
layout(constant_id = 3) const uint NB = 1;

layout(set = 0, binding = 0, std430) writeonly buffer Y { uint y[]; };
layout(set = 0, binding = 1, std430) readonly buffer A { uint a[]; };
layout(set = 0, binding = 2, std430) readonly buffer B { uint b[]; };

#if DTYPE_1 == F16 || DTYPE_1 == BF16
uint element(uint e) {
    uint o = e / (NA + NB);
    uint r = e - o * (NA + NB);
    return r < NA ? HALF_BITS(a, o * NA + r) : HALF_BITS(b, o * NB + r - NA);
}
#else
uint element(uint e) {
    uint o = e / (NA + NB);
    uint r = e - o * (NA + NB);
    return r < NA ? a[o * NA + r] : b[o * NB + r - NA];
}
#endif

void main() {
    uint w = global_id();
    uint n = OUTER * (NA + NB);
#if DTYPE_1 == F16 || DTYPE_1 == BF16
    if (2u * w >= n) {
        return;
    }
    uint hi = 2u * w + 1u < n ? element(2u * w + 1u) : 0u;
    y[w] = element(2u * w) | (hi << 16);
#else
    if (w >= n) {
        return;
    }
    y[w] = element(w);
#endif
}
