#ifndef EXPERT_DOTS_GLSL
#define EXPERT_DOTS_GLSL
// The expert kernels' dots: nd rows of an expert stack, each with its own input row, in one
// pass (every invocation issues its loads for all nd dots together, then one exchange for all),
// where matvec_core.glsl's matvec_rows takes consecutive rows of one input, and a caller looping
// over experts with it waits for each expert's loads and exchange before the next (the weighted
// sum's eight experts were eight round trips in a row). Stacks in the block formats
// (`--weights q8_0|q4_0`, each expert's matrix converted as one) take matvec_core.glsl's step:
// 8 weights of each row and their block's scale per invocation and step, in f32 arithmetic (the
// exact dequantisation), or with F16_MV (`--dots f16`, the default for those formats) in the
// matvecs' packed f16 products (quant.glsl's QH_STEP_DOT). The weighted sum's input, the
// SwiGLU's output, comes to it unnormed: its f16 pairs overflow only past |x| ~ 32768, as
// quant.glsl says of the matvecs' x.
//
// The including kernel declares W / WPair / W4 on the weight binding (DTYPE_1), X / X4 on the
// input binding, and includes matvec_core.glsl (the constants I and VEC4, reduce.glsl) first.

// Dot d < nd of weight row wrow[d] with x[xoff[d] .. xoff[d] + I]; afterwards (a barrier ends
// the exchange) wg_dot_total(d) is dot d's total in any invocation. nd <= MAX_DOTS is a
// constant at every call (a spec-constant expression), so that the driver unrolls the loops
// and issues the loads together. Uniform control flow required.
void expert_dots(uint wrow[MAX_DOTS], uint xoff[MAX_DOTS], uint nd) {
    uint t = gl_LocalInvocationID.x;
    float acc[MAX_DOTS];
    for (uint d = 0u; d < MAX_DOTS; d++) {
        acc[d] = 0.0;
    }
#if DTYPE_1 == Q8_0 || DTYPE_1 == Q4_0
    uint rb = q_row_bytes(DTYPE_1, I);
    for (uint c = t; c < I / 8u; c += gl_WorkGroupSize.x) {
        for (uint d = 0u; d < nd; d++) {
            vec4 xa = x4[xoff[d] / 4u + 2u * c];
            vec4 xb = x4[xoff[d] / 4u + 2u * c + 1u];
            uint at = wrow[d] * rb;
#ifdef F16_MV
            acc[d] += Q_SCALE(DTYPE_1, w, at, I, c / 4u) *
                      QH_STEP_DOT(DTYPE_1, w, at / 4u, c, QH_X(xa, xb));
#else
            acc[d] += Q_SCALE(DTYPE_1, w, at, I, c / 4u) *
                      Q_STEP_DOT(DTYPE_1, w, at / 4u, c, xa, xb);
#endif
        }
    }
#ifdef F16_MV
    // The f16 codes carry 1/16 (q4_0) or 1/256 (q8_0), undone once.
    for (uint d = 0u; d < nd; d++) {
        acc[d] *= QH_UNSCALE(DTYPE_1);
    }
#endif
#else
    if (VEC4 != 0u) {
#if DTYPE_1 == F32
        uint n4 = I / 4u;
        for (uint c = t; c < n4; c += gl_WorkGroupSize.x) {
            for (uint d = 0u; d < nd; d++) {
                acc[d] += dot(uintBitsToFloat(w4[wrow[d] * n4 + c]), x4[xoff[d] / 4u + c]);
            }
        }
#else
        uint n8 = I / 8u;
        for (uint c = t; c < n8; c += gl_WorkGroupSize.x) {
            for (uint d = 0u; d < nd; d++) {
                uvec4 wv = w4[wrow[d] * n8 + c];
                vec4 xa = x4[xoff[d] / 4u + 2u * c];
                vec4 xb = x4[xoff[d] / 4u + 2u * c + 1u];
                acc[d] += dot(vec4(PAIR(DTYPE_1, wv.x), PAIR(DTYPE_1, wv.y)), xa) +
                          dot(vec4(PAIR(DTYPE_1, wv.z), PAIR(DTYPE_1, wv.w)), xb);
            }
        }
#endif
    } else {
        for (uint c = t; c < I; c += gl_WorkGroupSize.x) {
            for (uint d = 0u; d < nd; d++) {
                acc[d] += LOAD(DTYPE_1, w, wrow[d] * I + c) * x[xoff[d] + c];
            }
        }
    }
#endif
    wg_share_dots(acc, nd);
}

#ifdef SUM_ROWS
// The steps of a row (expert_rows_acc's unit): 8 weights in the block formats and as 16-bit
// pairs, 4 as f32 vectors, else 1.
uint expert_row_steps() {
#if DTYPE_1 == Q8_0 || DTYPE_1 == Q4_0
    return I / 8u;
#elif DTYPE_1 == F32
    return VEC4 != 0u ? I / 4u : I;
#else
    return VEC4 != 0u ? I / 8u : I;
#endif
}

// Adds `scale` times the steps c0, c0 + stride, .. (this invocation's share of a row) of the
// dots of one expert's weight rows wrow[d] (d < nr) with x[xoff .. xoff + I] to acc[d], x
// loaded once for all nr rows, and no exchange: the weighted sum over several rows a workgroup
// calls it for each of its experts, then shares acc once (wg_share_dots), so that each expert's
// input row is read once per workgroup and not once per output row. nr <= MAX_DOTS is a
// constant at every call. No subgroup operation: callers may take different experts.
void expert_rows_acc(uint wrow[MAX_DOTS], uint xoff, uint nr, float scale, uint c0, uint stride,
                     inout float acc[MAX_DOTS]) {
    float part[MAX_DOTS];
    for (uint d = 0u; d < MAX_DOTS; d++) {
        part[d] = 0.0;
    }
#if DTYPE_1 == Q8_0 || DTYPE_1 == Q4_0
    uint rb = q_row_bytes(DTYPE_1, I);
    for (uint c = c0; c < I / 8u; c += stride) {
        vec4 xa = x4[xoff / 4u + 2u * c];
        vec4 xb = x4[xoff / 4u + 2u * c + 1u];
#ifdef F16_MV
        uvec4 xh = QH_X(xa, xb);
#endif
        for (uint d = 0u; d < nr; d++) {
            uint at = wrow[d] * rb;
#ifdef F16_MV
            part[d] += Q_SCALE(DTYPE_1, w, at, I, c / 4u) *
                       QH_STEP_DOT(DTYPE_1, w, at / 4u, c, xh);
#else
            part[d] += Q_SCALE(DTYPE_1, w, at, I, c / 4u) *
                       Q_STEP_DOT(DTYPE_1, w, at / 4u, c, xa, xb);
#endif
        }
    }
#ifdef F16_MV
    for (uint d = 0u; d < nr; d++) {
        part[d] *= QH_UNSCALE(DTYPE_1);
    }
#endif
#else
    if (VEC4 != 0u) {
#if DTYPE_1 == F32
        uint n4 = I / 4u;
        for (uint c = c0; c < n4; c += stride) {
            vec4 xv = x4[xoff / 4u + c];
            for (uint d = 0u; d < nr; d++) {
                part[d] += dot(uintBitsToFloat(w4[wrow[d] * n4 + c]), xv);
            }
        }
#else
        uint n8 = I / 8u;
        for (uint c = c0; c < n8; c += stride) {
            vec4 xa = x4[xoff / 4u + 2u * c];
            vec4 xb = x4[xoff / 4u + 2u * c + 1u];
            for (uint d = 0u; d < nr; d++) {
                uvec4 wv = w4[wrow[d] * n8 + c];
                part[d] += dot(vec4(PAIR(DTYPE_1, wv.x), PAIR(DTYPE_1, wv.y)), xa) +
                           dot(vec4(PAIR(DTYPE_1, wv.z), PAIR(DTYPE_1, wv.w)), xb);
            }
        }
#endif
    } else {
        for (uint c = c0; c < I; c += stride) {
            float xv = x[xoff + c];
            for (uint d = 0u; d < nr; d++) {
                part[d] += LOAD(DTYPE_1, w, wrow[d] * I + c) * xv;
            }
        }
    }
#endif
    for (uint d = 0u; d < nr; d++) {
        acc[d] += scale * part[d];
    }
}
#endif // SUM_ROWS

#endif // EXPERT_DOTS_GLSL
