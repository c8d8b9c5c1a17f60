// The elementwise anchor of fused kernels (vkfuse fuse::codegen generates the including
// source): y[i] = EW(i), a generated expression over element i of every input (IN<k>(i); a
// one-element input is read at 0 for every i). A chain of elementwise ops in one dispatch.
// The including source declares the inputs (bindings 1..) and defines EW.
// Bindings: 0 = y f32[N], then the inputs.
// Spec constants: 0 = workgroup size, 1 = N.
// Dispatch: ceil(N / workgroup size).

#include "fused_epilogue.glsl"

layout(constant_id = 1) const uint N = 1;

layout(set = 0, binding = 0, std430) writeonly buffer Y { float y[]; };

void main() {
    uint i = global_id();
    if (i >= N) {
        return;
    }
    y[i] = EW(i);
}
