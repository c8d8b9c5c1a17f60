#version 450
#extension GL_GOOGLE_include_directive : require
// rope: transformers' rotate-half rotation of the first ROT dims of each head at position pos:
//   y[i]        = x[i] cos(a_i) - x[i + ROT/2] sin(a_i)
//   y[i + ROT/2] = x[i + ROT/2] cos(a_i) + x[i] sin(a_i),   a_i = f32(inv_freq[i] * f32(pos)),
// dims ROT..D are copied. The position is read from its buffer.
// inv_freq[i] = 1 / theta^(2i/ROT) comes from the host as spec constants, computed in f32 as the
// reference does (bit-identical angles; GPU pow is far less exact). sin and cos use our own
// Cody-Waite range reduction and minimax polynomials (Cephes' sinf/cosf, ~1 ulp for |a| < 8192
// and slowly degrading past ~5e4 rad), so drivers with coarse built-in sin/cos agree too.
// Bindings: 0 = y f32[HEADS, D], 1 = x f32[HEADS, D], 2 = pos i32[1].
// Spec constants: 0 = workgroup size, 1 = HEADS, 2 = D, 3 = ROT, 4 + i = inv_freq[i] (f32) for
// i < ROT/2 (ROT <= 256).
// Dispatch: ceil(HEADS*D / workgroup size), one invocation per output element.
#include "common.glsl"

layout(constant_id = 1) const uint HEADS = 1;
layout(constant_id = 2) const uint D = 2;
layout(constant_id = 3) const uint ROT = 2;
layout(constant_id = 4) const float IF0 = 0.0;
layout(constant_id = 5) const float IF1 = 0.0;
layout(constant_id = 6) const float IF2 = 0.0;
layout(constant_id = 7) const float IF3 = 0.0;
layout(constant_id = 8) const float IF4 = 0.0;
layout(constant_id = 9) const float IF5 = 0.0;
layout(constant_id = 10) const float IF6 = 0.0;
layout(constant_id = 11) const float IF7 = 0.0;
layout(constant_id = 12) const float IF8 = 0.0;
layout(constant_id = 13) const float IF9 = 0.0;
layout(constant_id = 14) const float IF10 = 0.0;
layout(constant_id = 15) const float IF11 = 0.0;
layout(constant_id = 16) const float IF12 = 0.0;
layout(constant_id = 17) const float IF13 = 0.0;
layout(constant_id = 18) const float IF14 = 0.0;
layout(constant_id = 19) const float IF15 = 0.0;
layout(constant_id = 20) const float IF16 = 0.0;
layout(constant_id = 21) const float IF17 = 0.0;
layout(constant_id = 22) const float IF18 = 0.0;
layout(constant_id = 23) const float IF19 = 0.0;
layout(constant_id = 24) const float IF20 = 0.0;
layout(constant_id = 25) const float IF21 = 0.0;
layout(constant_id = 26) const float IF22 = 0.0;
layout(constant_id = 27) const float IF23 = 0.0;
layout(constant_id = 28) const float IF24 = 0.0;
layout(constant_id = 29) const float IF25 = 0.0;
layout(constant_id = 30) const float IF26 = 0.0;
layout(constant_id = 31) const float IF27 = 0.0;
layout(constant_id = 32) const float IF28 = 0.0;
layout(constant_id = 33) const float IF29 = 0.0;
layout(constant_id = 34) const float IF30 = 0.0;
layout(constant_id = 35) const float IF31 = 0.0;
layout(constant_id = 36) const float IF32 = 0.0;
layout(constant_id = 37) const float IF33 = 0.0;
layout(constant_id = 38) const float IF34 = 0.0;
layout(constant_id = 39) const float IF35 = 0.0;
layout(constant_id = 40) const float IF36 = 0.0;
layout(constant_id = 41) const float IF37 = 0.0;
layout(constant_id = 42) const float IF38 = 0.0;
layout(constant_id = 43) const float IF39 = 0.0;
layout(constant_id = 44) const float IF40 = 0.0;
layout(constant_id = 45) const float IF41 = 0.0;
layout(constant_id = 46) const float IF42 = 0.0;
layout(constant_id = 47) const float IF43 = 0.0;
layout(constant_id = 48) const float IF44 = 0.0;
layout(constant_id = 49) const float IF45 = 0.0;
layout(constant_id = 50) const float IF46 = 0.0;
layout(constant_id = 51) const float IF47 = 0.0;
layout(constant_id = 52) const float IF48 = 0.0;
layout(constant_id = 53) const float IF49 = 0.0;
layout(constant_id = 54) const float IF50 = 0.0;
layout(constant_id = 55) const float IF51 = 0.0;
layout(constant_id = 56) const float IF52 = 0.0;
layout(constant_id = 57) const float IF53 = 0.0;
layout(constant_id = 58) const float IF54 = 0.0;
layout(constant_id = 59) const float IF55 = 0.0;
layout(constant_id = 60) const float IF56 = 0.0;
layout(constant_id = 61) const float IF57 = 0.0;
layout(constant_id = 62) const float IF58 = 0.0;
layout(constant_id = 63) const float IF59 = 0.0;
layout(constant_id = 64) const float IF60 = 0.0;
layout(constant_id = 65) const float IF61 = 0.0;
layout(constant_id = 66) const float IF62 = 0.0;
layout(constant_id = 67) const float IF63 = 0.0;
layout(constant_id = 68) const float IF64 = 0.0;
layout(constant_id = 69) const float IF65 = 0.0;
layout(constant_id = 70) const float IF66 = 0.0;
layout(constant_id = 71) const float IF67 = 0.0;
layout(constant_id = 72) const float IF68 = 0.0;
layout(constant_id = 73) const float IF69 = 0.0;
layout(constant_id = 74) const float IF70 = 0.0;
layout(constant_id = 75) const float IF71 = 0.0;
layout(constant_id = 76) const float IF72 = 0.0;
layout(constant_id = 77) const float IF73 = 0.0;
layout(constant_id = 78) const float IF74 = 0.0;
layout(constant_id = 79) const float IF75 = 0.0;
layout(constant_id = 80) const float IF76 = 0.0;
layout(constant_id = 81) const float IF77 = 0.0;
layout(constant_id = 82) const float IF78 = 0.0;
layout(constant_id = 83) const float IF79 = 0.0;
layout(constant_id = 84) const float IF80 = 0.0;
layout(constant_id = 85) const float IF81 = 0.0;
layout(constant_id = 86) const float IF82 = 0.0;
layout(constant_id = 87) const float IF83 = 0.0;
layout(constant_id = 88) const float IF84 = 0.0;
layout(constant_id = 89) const float IF85 = 0.0;
layout(constant_id = 90) const float IF86 = 0.0;
layout(constant_id = 91) const float IF87 = 0.0;
layout(constant_id = 92) const float IF88 = 0.0;
layout(constant_id = 93) const float IF89 = 0.0;
layout(constant_id = 94) const float IF90 = 0.0;
layout(constant_id = 95) const float IF91 = 0.0;
layout(constant_id = 96) const float IF92 = 0.0;
layout(constant_id = 97) const float IF93 = 0.0;
layout(constant_id = 98) const float IF94 = 0.0;
layout(constant_id = 99) const float IF95 = 0.0;
layout(constant_id = 100) const float IF96 = 0.0;
layout(constant_id = 101) const float IF97 = 0.0;
layout(constant_id = 102) const float IF98 = 0.0;
layout(constant_id = 103) const float IF99 = 0.0;
layout(constant_id = 104) const float IF100 = 0.0;
layout(constant_id = 105) const float IF101 = 0.0;
layout(constant_id = 106) const float IF102 = 0.0;
layout(constant_id = 107) const float IF103 = 0.0;
layout(constant_id = 108) const float IF104 = 0.0;
layout(constant_id = 109) const float IF105 = 0.0;
layout(constant_id = 110) const float IF106 = 0.0;
layout(constant_id = 111) const float IF107 = 0.0;
layout(constant_id = 112) const float IF108 = 0.0;
layout(constant_id = 113) const float IF109 = 0.0;
layout(constant_id = 114) const float IF110 = 0.0;
layout(constant_id = 115) const float IF111 = 0.0;
layout(constant_id = 116) const float IF112 = 0.0;
layout(constant_id = 117) const float IF113 = 0.0;
layout(constant_id = 118) const float IF114 = 0.0;
layout(constant_id = 119) const float IF115 = 0.0;
layout(constant_id = 120) const float IF116 = 0.0;
layout(constant_id = 121) const float IF117 = 0.0;
layout(constant_id = 122) const float IF118 = 0.0;
layout(constant_id = 123) const float IF119 = 0.0;
layout(constant_id = 124) const float IF120 = 0.0;
layout(constant_id = 125) const float IF121 = 0.0;
layout(constant_id = 126) const float IF122 = 0.0;
layout(constant_id = 127) const float IF123 = 0.0;
layout(constant_id = 128) const float IF124 = 0.0;
layout(constant_id = 129) const float IF125 = 0.0;
layout(constant_id = 130) const float IF126 = 0.0;
layout(constant_id = 131) const float IF127 = 0.0;

layout(set = 0, binding = 0, std430) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1, std430) readonly buffer X { float x[]; };
layout(set = 0, binding = 2, std430) readonly buffer Pos { int pos[]; };

// inv_freq[i], as a lookup table built from the spec constants (global const arrays cannot be
// initialized from spec constants in GLSL; after specialization this is a constant table).
float inv_freq(uint i) {
    const float table[128] = float[](
        IF0, IF1, IF2, IF3, IF4, IF5, IF6, IF7,
        IF8, IF9, IF10, IF11, IF12, IF13, IF14, IF15,
        IF16, IF17, IF18, IF19, IF20, IF21, IF22, IF23,
        IF24, IF25, IF26, IF27, IF28, IF29, IF30, IF31,
        IF32, IF33, IF34, IF35, IF36, IF37, IF38, IF39,
        IF40, IF41, IF42, IF43, IF44, IF45, IF46, IF47,
        IF48, IF49, IF50, IF51, IF52, IF53, IF54, IF55,
        IF56, IF57, IF58, IF59, IF60, IF61, IF62, IF63,
        IF64, IF65, IF66, IF67, IF68, IF69, IF70, IF71,
        IF72, IF73, IF74, IF75, IF76, IF77, IF78, IF79,
        IF80, IF81, IF82, IF83, IF84, IF85, IF86, IF87,
        IF88, IF89, IF90, IF91, IF92, IF93, IF94, IF95,
        IF96, IF97, IF98, IF99, IF100, IF101, IF102, IF103,
        IF104, IF105, IF106, IF107, IF108, IF109, IF110, IF111,
        IF112, IF113, IF114, IF115, IF116, IF117, IF118, IF119,
        IF120, IF121, IF122, IF123, IF124, IF125, IF126, IF127);
    return table[i];
}

// sin and cos of a, as Cephes' sinf/cosf: reduce by multiples of pi/4 in three parts, then
// evaluate the polynomial of the octant.
vec2 sin_cos(float a) {
    const float FOPI = 1.27323954473516;
    const float DP1 = 0.78515625;
    const float DP2 = 2.4187564849853515625e-4;
    const float DP3 = 3.77489497744594108e-8;
    float s_sign = a < 0.0 ? -1.0 : 1.0;
    float c_sign = 1.0;
    float xa = abs(a);
    uint j = uint(FOPI * xa);
    float q = float(j);
    if ((j & 1u) != 0u) {
        j += 1u;
        q += 1.0;
    }
    j &= 7u;
    if (j > 3u) {
        j -= 4u;
        s_sign = -s_sign;
        c_sign = -c_sign;
    }
    if (j > 1u) {
        c_sign = -c_sign;
    }
    float r = ((xa - q * DP1) - q * DP2) - q * DP3;
    float z = r * r;
    float sp = ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1) * z * r + r;
    float cp = ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2) * z * z
        - 0.5 * z + 1.0;
    bool swap = j == 1u || j == 2u;
    return vec2(s_sign * (swap ? cp : sp), c_sign * (swap ? sp : cp));
}

void main() {
    uint i = global_id();
    if (i >= HEADS * D) {
        return;
    }
    uint j = i % D;
    uint base = i - j;
    if (j >= ROT) {
        y[i] = x[i];
        return;
    }
    uint half_rot = ROT / 2u;
    uint f = j < half_rot ? j : j - half_rot;
    float angle = inv_freq(f) * float(pos[0]);
    vec2 sc = sin_cos(angle);
    float a = x[base + f];
    float b = x[base + f + half_rot];
    y[i] = j < half_rot ? a * sc.y - b * sc.x : b * sc.y + a * sc.x;
}
