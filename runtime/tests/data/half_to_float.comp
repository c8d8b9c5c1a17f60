// y[i] = 2 * float(x[i]) for f16 x: needs storageBuffer16BitAccess enabled on the device.
// Compile: glslc -O --target-env=vulkan1.1 half_to_float.comp -o half_to_float.spv
#version 450
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

layout(local_size_x = 64) in;

layout(set = 0, binding = 0) readonly buffer Input { float16_t x[]; };
layout(set = 0, binding = 1) writeonly buffer Output { float y[]; };

layout(push_constant) uniform Push {
    uint n;
} pc;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < pc.n) {
        y[i] = 2.0 * float(x[i]);
    }
}
