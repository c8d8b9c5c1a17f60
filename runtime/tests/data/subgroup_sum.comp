// out[i] = subgroupAdd(in[i]): each invocation gets the sum over its subgroup.
// Compile: glslc -O --target-env=vulkan1.1 subgroup_sum.comp -o subgroup_sum.spv
#version 450
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 64) in;

layout(set = 0, binding = 0) readonly buffer Input { uint x[]; };
layout(set = 0, binding = 1) writeonly buffer Output { uint y[]; };

void main() {
    uint i = gl_GlobalInvocationID.x;
    y[i] = subgroupAdd(x[i]);
}
