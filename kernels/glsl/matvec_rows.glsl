// Row helpers of the matvec-family anchors (fused_matvec.glsl, persistent_matvec.glsl): dots
// per output row, the norm prologue's weight and where a stacked weight row lands in y. The
// including file declares the norm weight buffer `nw` (when NORM) and defines NORM, NW_DTYPE,
// NORM_ZC, PARTS, ZIPPED, END0..7 and SHIFT0..7; a persistent region includes it once per level,
// with these names renamed per level (no include guard on purpose).

#if ZIPPED
const uint PER_ROW = PARTS;
#else
const uint PER_ROW = 1u;
#endif

// The norm weight of element i (1 without a norm).
float nw_at(uint i) {
#if NORM && NW_ONES
    return 1.0;
#elif NORM
    float v = LOAD(NW_DTYPE, nw, i);
    return NORM_ZC != 0 ? v + 1.0 : v;
#else
    return 1.0;
#endif
}

// Where stacked weight row r goes in y.
uint out_index(uint r) {
#if ZIPPED
    return r;
#else
    if (PARTS <= 1 || r < END0) return r + SHIFT0;
    if (PARTS <= 2 || r < END1) return r + SHIFT1;
    if (PARTS <= 3 || r < END2) return r + SHIFT2;
    if (PARTS <= 4 || r < END3) return r + SHIFT3;
    if (PARTS <= 5 || r < END4) return r + SHIFT4;
    if (PARTS <= 6 || r < END5) return r + SHIFT5;
    if (PARTS <= 7 || r < END6) return r + SHIFT6;
    return r + SHIFT7;
#endif
}
