// Shared by every vkfuse kernel: dtype codes, element loads, and the dispatch index.
//
// Buffers are declared as `uint` (or `float`) arrays and indexed from 0 (the executor binds
// each value's slice at an aligned offset). f16 and bf16 are packed two per 32-bit word,
// element 2i in the low half, exactly the safetensors bytes, so no 16-bit storage feature is
// needed. Every float operand whose dtype can vary gets a `DTYPE_<binding>` define set to one
// of the codes below; `LOAD(DTYPE_1, arr, i)` reads element i of binding 1 as f32.
//
// Dispatch: the host splits more than 65535 workgroups over x and y (`KernelCall::workgroups`),
// so kernels use `group_id()` / `global_id()` and bounds-check.

// Subgroup operations (reduce.glsl): Vulkan 1.1 core, offered in compute by every target
// (NVIDIA subgroups of 32, AMD 32/64, lavapipe 8); the extensions must precede any code.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require

// Codes start at 1: an undefined name in `#if` reads as 0 and must match none of them.
// The workgroup size is specialization constant 0 in every kernel. Declared here, before any
// function reads gl_WorkGroupSize: glslang folds gl_WorkGroupSize to its default (1) in code
// parsed before this declaration.
layout(local_size_x_id = 0) in;

// A point of invocation 0's way that the timeline probe records (kernels/glsl/timeline.glsl:
// 0 = its input has arrived, 1 = its own work is done); nothing without the probe.
#ifndef TIMELINE_MARK
#define TIMELINE_MARK(i)
#endif

#define F32 1
#define F16 2
#define BF16 3
#define I32 4
// ggml's block formats (quant.glsl reads them; LOAD and PAIR do not).
#define Q8_0 5
#define Q4_0 6

float f16_at(uint word, uint i) {
    vec2 v = unpackHalf2x16(word);
    return (i & 1u) == 0u ? v.x : v.y;
}

float bf16_at(uint word, uint i) {
    return uintBitsToFloat((i & 1u) == 0u ? (word << 16) : (word & 0xffff0000u));
}

// x rounded to the nearest f16 (ties to even), as an f32 that f16 holds exactly, in integer
// arithmetic: Vulkan leaves packHalf2x16's rounding to the implementation, and packing the
// result is exact under any rounding mode, so kv_write stores the reference's bits on every
// device (f16 subnormals aside, which a device that does not preserve 16-bit denormals may
// flush when packing). (Not in the fused attention block, where it cost bf16 0.8% on an H100:
// fused_attention.glsl's fresh_round.)
float f16_round(float x) {
    uint b = floatBitsToUint(x);
    uint a = b & 0x7fffffffu;
    if (a >= 0x477ff000u) {
        // 65520 and above round to infinity; NaN stays NaN.
        return a > 0x7f800000u ? x : uintBitsToFloat((b & 0x80000000u) | 0x7f800000u);
    }
    if (a < 0x38800000u) {
        // Below 2^-14: f16's subnormals, multiples of 2^-24 (both scalings are exact); the
        // magnitude rounded, the sign put back (zero keeps its sign).
        float m = roundEven(uintBitsToFloat(a) * 16777216.0) * (1.0 / 16777216.0);
        return uintBitsToFloat((b & 0x80000000u) | floatBitsToUint(m));
    }
    // Drop 13 mantissa bits, rounding to nearest, ties to even (a carry moves the exponent).
    uint r = a + 0x0fffu + ((a >> 13) & 1u);
    return uintBitsToFloat((b & 0x80000000u) | (r & 0xffffe000u));
}

// Both halves of a word as f32 (element 2i, element 2i+1).
vec2 f16_pair(uint word) { return unpackHalf2x16(word); }
vec2 bf16_pair(uint word) { return vec2(uintBitsToFloat(word << 16), uintBitsToFloat(word & 0xffff0000u)); }

#define LOAD_1(A, i) uintBitsToFloat(A[i])
#define LOAD_2(A, i) f16_at(A[(i) >> 1], (i))
#define LOAD_3(A, i) bf16_at(A[(i) >> 1], (i))
#define LOAD_PASTE(DT, A, i) LOAD_##DT(A, i)
// Element i of the uint array A holding dtype DT, as f32.
#define LOAD(DT, A, i) LOAD_PASTE(DT, A, i)

#define PAIR_2(w) f16_pair(w)
#define PAIR_3(w) bf16_pair(w)
#define PAIR_PASTE(DT, w) PAIR_##DT(w)
// The two 16-bit elements of word w of dtype DT (F16 or BF16), as f32.
#define PAIR(DT, w) PAIR_PASTE(DT, w)

// The 16-bit element i of the uint array A (low half first), as the low 16 bits of a uint.
#define HALF_BITS(A, i) ((A[(i) >> 1] >> (((i) & 1u) * 16u)) & 0xffffu)

uint group_id() {
    return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
}

uint global_id() {
    return group_id() * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
}

// A key whose unsigned order is the IEEE total order of f32 (Rust's `total_cmp`):
// -NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN.
uint order_key(float f) {
    uint b = floatBitsToUint(f);
    return (b & 0x80000000u) != 0u ? ~b : (b | 0x80000000u);
}

const uint NONE = 0xffffffffu;

// Whether (k1, i1) comes before (k2, i2) among (order key, index) candidates: larger key
// first, then lower index; index NONE ("no candidate") last.
bool before(uint k1, uint i1, uint k2, uint i2) {
    if (i2 == NONE) {
        return i1 != NONE;
    }
    if (i1 == NONE) {
        return false;
    }
    return k1 > k2 || (k1 == k2 && i1 < i2);
}

float silu(float x) {
    return x / (1.0 + exp(-x));
}

const float NEG_BIG = -3.402823466e38;
