// The KV caches' elements, f32 or f16 (`compile-model --kv-cache`): the K and V bindings and
// how the attention kernels read them. f16 caches pack two elements per word (element 2i in the
// low half), the weights' layout (common.glsl), so no 16-bit storage feature is needed.
// The includer defines KV_DTYPE (F32 or F16; F32 when undefined), KV_K_BINDING and
// KV_V_BINDING, and KV_WRITABLE (1: the kernel writes the fresh row itself).
#ifndef KV_DTYPE
#define KV_DTYPE F32
#endif
#if KV_WRITABLE
#define KV_ACCESS
#else
#define KV_ACCESS readonly
#endif

#if KV_DTYPE == F16
layout(set = 0, binding = KV_K_BINDING, std430) KV_ACCESS buffer K { uint k[]; };
layout(set = 0, binding = KV_K_BINDING, std430) readonly buffer K2 { uvec2 k2[]; };
layout(set = 0, binding = KV_K_BINDING, std430) readonly buffer K8 { uvec4 k8[]; };
layout(set = 0, binding = KV_V_BINDING, std430) KV_ACCESS buffer V { uint v[]; };
// Elements 4i .. 4i + 3 of the K cache.
vec4 kv_k4(uint i) {
    uvec2 p = k2[i];
    return vec4(unpackHalf2x16(p.x), unpackHalf2x16(p.y));
}
float kv_k(uint i) { return LOAD(F16, k, i); }
float kv_v(uint i) { return LOAD(F16, v, i); }
#else
layout(set = 0, binding = KV_K_BINDING, std430) KV_ACCESS buffer K { float k[]; };
layout(set = 0, binding = KV_K_BINDING, std430) readonly buffer K4 { vec4 k4[]; };
layout(set = 0, binding = KV_V_BINDING, std430) KV_ACCESS buffer V { float v[]; };
vec4 kv_k4(uint i) { return k4[i]; }
float kv_k(uint i) { return k[i]; }
float kv_v(uint i) { return v[i]; }
#endif
