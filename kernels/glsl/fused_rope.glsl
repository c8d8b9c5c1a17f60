// sin and cos for fused kernels that apply rope, as rope.comp computes them (Cephes'
// sinf/cosf: reduce by multiples of pi/4 in three parts, then the octant's polynomial), so a
// fused rope gives the unfused kernel's angles bit for bit.

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
