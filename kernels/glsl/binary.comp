#version 450
#extension GL_GOOGLE_include_directive : require
// binary (add, mul, div by OP): y = a OP b with numpy broadcasting, rank up to 4 (the host
// merges dims where it can and pads with leading 1s).
// Bindings: 0 = y f32[D0, D1, D2, D3], 1 = a of DTYPE_1, 2 = b of DTYPE_2.
// Defines: OP = ADD | MUL | DIV, DTYPE_1, DTYPE_2.
// Spec constants: 0 = workgroup size, 1 = NUMEL, 2..=5 = output dims D0..D3, 6..=9 = element
// strides of a per output dim (0 where a broadcasts), 10..=13 = the same for b.
// Dispatch: ceil(NUMEL / workgroup size).
#include "common.glsl"

#define ADD 1
#define MUL 2
#define DIV 3

layout(constant_id = 1) const uint NUMEL = 1;
layout(constant_id = 2) const uint D0 = 1;
layout(constant_id = 3) const uint D1 = 1;
layout(constant_id = 4) const uint D2 = 1;
layout(constant_id = 5) const uint D3 = 1;
layout(constant_id = 6) const uint SA0 = 0;
layout(constant_id = 7) const uint SA1 = 0;
layout(constant_id = 8) const uint SA2 = 0;
layout(constant_id = 9) const uint SA3 = 0;
layout(constant_id = 10) const uint SB0 = 0;
layout(constant_id = 11) const uint SB1 = 0;
layout(constant_id = 12) const uint SB2 = 0;
layout(constant_id = 13) const uint SB3 = 0;

layout(set = 0, binding = 0, std430) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1, std430) readonly buffer A { uint a[]; };
layout(set = 0, binding = 2, std430) readonly buffer B { uint b[]; };

void main() {
    uint i = global_id();
    if (i >= NUMEL) {
        return;
    }
    uint r = i;
    uint c3 = r % D3;
    r /= D3;
    uint c2 = r % D2;
    r /= D2;
    uint c1 = r % D1;
    uint c0 = r / D1;
    uint ia = c0 * SA0 + c1 * SA1 + c2 * SA2 + c3 * SA3;
    uint ib = c0 * SB0 + c1 * SB1 + c2 * SB2 + c3 * SB3;
    float va = LOAD(DTYPE_1, a, ia);
    float vb = LOAD(DTYPE_2, b, ib);
#if OP == ADD
    y[i] = va + vb;
#elif OP == MUL
    y[i] = va * vb;
#elif OP == DIV
    y[i] = va / vb;
#else
#error "OP must be ADD, MUL or DIV"
#endif
}
