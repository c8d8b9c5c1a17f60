// Burns `pc.iterations` steps of an LCG per invocation: a dispatch that takes long enough to
// test fence timeouts. Compile: glslc -O --target-env=vulkan1.1 spin.comp -o spin.spv
#version 450

layout(local_size_x = 64) in;

layout(set = 0, binding = 0) buffer State { uint v[]; };

layout(push_constant) uniform Push {
    uint iterations;
} pc;

void main() {
    uint i = gl_GlobalInvocationID.x;
    uint x = v[i];
    for (uint k = 0u; k < pc.iterations; k++) {
        x = x * 1664525u + 1013904223u;
    }
    v[i] = x;
}
