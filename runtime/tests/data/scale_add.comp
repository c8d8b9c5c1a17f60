// y[i] = x[i] * SCALE + OFFSET + pc.add, for i < pc.n.
// Exercises specialization constants of each kind (u32 workgroup size, f32, i32) and push
// constants. Compile: glslc -O --target-env=vulkan1.1 scale_add.comp -o scale_add.spv
#version 450

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const float SCALE = 1.0;
layout(constant_id = 2) const int OFFSET = 0;

layout(set = 0, binding = 0) readonly buffer Input { float x[]; };
layout(set = 0, binding = 1) writeonly buffer Output { float y[]; };

layout(push_constant) uniform Push {
    uint n;
    float add;
} pc;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < pc.n) {
        y[i] = x[i] * SCALE + float(OFFSET) + pc.add;
    }
}
