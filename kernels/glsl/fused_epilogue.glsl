#ifndef FUSED_EPILOGUE_GLSL
#define FUSED_EPILOGUE_GLSL
// Functions generated epilogue expressions call, computed exactly as the unfused kernels
// compute them (unary.comp).

// log(1 + e) without losing e when it is small (Goldberg's log1p).
float fused_log1p(float e) {
    float u = 1.0 + e;
    return u == 1.0 ? e : log(u) * (e / (u - 1.0));
}

// torch's softplus (beta 1, threshold 20).
float fused_softplus(float v) {
    return v > 20.0 ? v : fused_log1p(exp(v));
}

float fused_sigmoid(float v) {
    return 1.0 / (1.0 + exp(-v));
}

#endif // FUSED_EPILOGUE_GLSL
