// The attention-block anchor (vkfuse fuse::codegen generates the including source): per query
// head h, of kv head g = h / (HQ / HKV): optional rms norm over the head (QK_NORM) and rope of
// the first ROT dims at the position read from its buffer, for h's q row and g's fresh k row;
// the first query head of each group writes K and V at that position of the caches; then
// decode attention of h over slots 0..=pos, split over the context (flash-decoding).
//
// Workgroups: HQ x SPLITS, (h, s) at h * SPLITS + s. The slots 0..n-1 (n = pos + 1, at most CAP)
// are cut into chunks of max(MIN_CHUNK, ceil(n / SPLITS)) slots; split s attends its chunk,
// splits past the last chunk exit at once (the chunk adapts to the position: at short
// positions few splits work, none of them on a sliver). With one chunk, split 0 writes the
// output itself, exactly as an unsplit kernel does. Otherwise each split writes its partial
// (running max m, weight sum l, unnormalised output o[D]) to scratch and adds one to its head's
// arrival counter; the split that arrives last combines the partials in a fixed order (so the
// result does not depend on which one is last) and sets the counter back to 0, so the counter
// is zero at the next dispatch without any host or in-between work. A kernel compiled with
// POLLED_COMBINE (the bands' grids) whose dispatch runs with handoffs has the highest used split
// wait for the others' partials in device memory instead (polled()).
//
// The fresh row is shared without sharing memory: every workgroup computes it beside its q
// row (the same code on the same inputs, so the same bits; split 0 of the group's first query
// head writes it to the caches) into shared memory, and the split holding slot pos attends to
// slot pos from that copy, never from the cache another workgroup of this dispatch is
// writing; slots before pos were written by earlier dispatches.
//
// The including source defines QK_NORM (0/1), QN_DTYPE and KN_DTYPE (norm weights' dtypes),
// KV_DTYPE (the caches', F32 or F16),
// NORM_ZC, ROT (rotary dims, even), SPLITS (>= 1), MIN_CHUNK (>= 1), PREFETCH (0/1: D % 16 == 0,
// the first tile's K and V rows loaded before the q/k/v words are waited for: they depend on
// none of them), EARLY_TILE (0/1: see EARLY below), ATTN_SG (0/1: the subgroup walk of
// attend_subgroups.glsl in place of attend() where the device's subgroups fit it),
// `float inv_freq(uint i)` for i < ROT/2 and, when SPLITS > 1, PART_BINDING and COUNT_BINDING;
// GATED (0/1): binding 1 holds each query head's q row and then its output gate's row,
// f32[HQ, 2D] (Qwen3-Next's q projection as it comes out of the matvec), and y is the attention
// output times sigmoid(gate), so that neither the slices of q and the gate nor the gate's
// multiply takes a level of its own.
// Bindings: 0 = y f32[HQ, D], 1 = q f32[HQ, D] (GATED: [HQ, 2D]), 2 = k f32[HKV, D], 3 = v f32[HKV, D],
// 4 = k cache [HKV, CAP, D], 5 = v cache [HKV, CAP, D] (f32, or f16 with KV_DTYPE F16, the
// fresh rows rounded as stored: fresh_round), 6 = pos i32[1],
// 7 = q norm weight [D], 8 = k norm weight [D] (when QK_NORM); when SPLITS > 1:
// PART_BINDING = partials f32[HQ, SPLITS, D + 2] (scratch), COUNT_BINDING = arrival counters
// u32[HQ], for a block with bands then the polled partials' words u32[HQ, the block's splits,
// D + 2] (all zero before the dispatch, zero again after it).
// Spec constants: 0 = workgroup size (power of two, >= 4 and >= D), 1 = HQ, 2 = HKV, 3 = CAP,
// 4 = D, 5 = SCALE (f32), 6 = EPS (f32).
// Dispatch: HQ * SPLITS workgroups.

// Handoffs (handoff.glsl): q, k and v (bindings 1-3) can be read as handoff words, and y is
// published (the wide o_proj reads it: fused_chain.glsl's INNER_ONLY; each element has one
// writer, the head's last split or its only one).
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require
#define HANDOFF_ROLE (0x80000000u | (1u << 1) | (1u << 2) | (1u << 3))
#include "handoff.glsl"
#include "reduce.glsl"
#include "fused_rope.glsl"

layout(constant_id = 1) const uint HQ = 1;
layout(constant_id = 2) const uint HKV = 1;
layout(constant_id = 3) const uint CAP = 1;
layout(constant_id = 4) const uint D = 64;
layout(constant_id = 5) const float SCALE = 1.0;
layout(constant_id = 6) const float EPS = 0.0;

layout(set = 0, binding = 0, std430) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1, std430) readonly buffer Q { float q[]; };
layout(set = 0, binding = 2, std430) readonly buffer Kn { float k_new[]; };
layout(set = 0, binding = 3, std430) readonly buffer Vn { float v_new[]; };
#define KV_K_BINDING 4
#define KV_V_BINDING 5
#define KV_WRITABLE 1
#include "kv_cache.glsl"
layout(set = 0, binding = 6, std430) readonly buffer Pos { int pos[]; };
#if QK_NORM
layout(set = 0, binding = 7, std430) readonly buffer QN { uint qn[]; };
layout(set = 0, binding = 8, std430) readonly buffer KN { uint kn[]; };
#endif
#if SPLITS > 1
// Coherent: the last split reads what other workgroups wrote in this dispatch.
layout(set = 0, binding = PART_BINDING, std430) coherent buffer Part { float partial[]; };
layout(set = 0, binding = COUNT_BINDING, std430) coherent buffer Count { uint arrived[]; };
shared uint last_s;
#endif

#ifndef GATED
#define GATED 0
#endif
// A query head's row in binding 1: its q, then (GATED) its gate; an output element as stored.
#if GATED
#define QROW (2u * D)
// sigmoid(gate) of this invocation's output element, read with q.
float out_gate = 1.0;
#define GATE_OUT(v) ((v) * out_gate)
#else
#define QROW D
#define GATE_OUT(v) (v)
#endif

// Splits per head as an unsigned constant (SPLITS is a plain integer for #if).
const uint NSPLITS = uint(SPLITS);
// Invocations per position in the score phase.
const uint P = 4u;
const uint T = gl_WorkGroupSize.x / P;
const uint G = gl_WorkGroupSize.x / D;
// The values phase: VW elements of a V row per invocation (f16 caches: two, one word, so each
// load serves two outputs; a load per element cost more than the halved bytes saved at long
// contexts: docs/perf.md), in GV groups of DV invocations.
#if KV_DTYPE == F16
const uint VW = 2u;
#else
const uint VW = 1u;
#endif
const uint DV = (D + VW - 1u) / VW;
const uint GV = gl_WorkGroupSize.x / DV;
// Rope pairs element t < HALF_ROT with t + HALF_ROT.
const uint HALF_ROT = ROT / 2u;

shared float q_s[D];
shared vec2 red2_s[gl_WorkGroupSize.x];
// The fresh k (after norm and rope) and v rows of the group, for slot `fresh`.
shared float kf_s[D];
shared float vf_s[D];
shared float part[gl_WorkGroupSize.x];
shared float w_s[T];
// Each slot group's weight sum (attend()), each invocation group's in the combine.
shared float l_s[GV > G ? GV : G];
#if SPLITS > 1
// Each invocation group's max in the combine, and the splits each group loads.
shared float m_s[G];
const uint SPG = (NSPLITS + G - 1u) / G;
#endif

// A score-phase lane loads KC elements of a K row at once, 16 bytes (KC_RAW as loaded): f16
// caches eight, half the loads per position of four, the f32 width.
#if KV_DTYPE == F16
#define KC_RAW uvec4
const uint KC = 8u;
#else
#define KC_RAW vec4
const uint KC = 4u;
#endif

#if PREFETCH
// Per invocation, the first tile's share: KC-element chunks lane + i * P of its slot's K row, and
// the V elements of slots gv + i * GV for i < VP (see attend()). VP covers the first 8 GV slots
// only, a short position's whole chunk: prefetching a whole tile's V (32 registers more) made
// long contexts slower on the H100 (1024 tokens: 819.7 -> 776.1 tokens/s), likely fewer
// resident workgroups. As it is: 256 tokens 854.0 -> 873.0, 1024 819.3 -> 826.0, 4000
// 710.9 -> 701.3 (docs/perf.md).
const uint KP = (D / KC + P - 1u) / P;
const uint VP_TILE = (T + GV - 1u) / GV;
const uint VP = VP_TILE < 8u ? VP_TILE : 8u;
#endif

// EARLY (EARLY_TILE from the including source, with PREFETCH and splits): the rope's sines and
// cosines are taken before the wait for the q/k/v words, and the first tile's K and V words
// consumed right after the first polls (consume_tile()), so that those loads are done when the
// words come. On an H200 with the Qwen3-0.6B shape at 256 tokens: q8_0 +1.6%, q4_0 +2.0% with
// the block formats' f16 dots; bf16 -2.5..-2.9% (the block's registers 50-52 -> 58-64), so the
// compiler sets it for block-format schedules with f16 dots only (docs/perf.md, session 39).
// Either half alone: -0.3..+0.4%.
// NO_EARLY_TILE (a probe define) turns it off for an A/B.
#if EARLY_TILE && PREFETCH && SPLITS > 1 && !defined(NO_EARLY_TILE)
#define EARLY 1
#else
#define EARLY 0
#endif

#ifndef ATTN_SG
#define ATTN_SG 0
#endif

#if EARLY
// consume_tile()'s store (and sg_consume()'s, attend_subgroups.glsl): where the hash of the
// first tile's words matches a constant, to the split's own partial slot, which no other
// invocation writes and nothing reads before this invocation's combine() rewrites it (or, where
// its split publishes by polling or works alone, never reads).
void consume_hash(uint hx, uint slot_at) {
#ifdef EARLY_TILE_STORE_ALWAYS
    // Test only (tests/handoff.rs): the store every time, to show that no result depends on it.
    partial[slot_at] = 0.0;
#else
    if (hx == 0x7f3a5c11u) {
        partial[slot_at] = 0.0;
    }
#endif
}
#endif

#include "wg_sum2.glsl"

// Element t (< D) of h's q row (x) and of g's fresh k row (y) after the norm and rope, from
// their raw elements `v` and (QK_NORM) norm weights `wn`, and those of t's rope partner (`pv`,
// `pwn`: element t +- ROT / 2), which the caller loaded: nothing here waits on memory, one
// exchange serves both norms, and rope needs none (each invocation scales its
// partner's raw element exactly as the partner does); with EARLY, `sc_early` holds t's rope
// sine and cosine, taken before the wait. Every invocation must call it (uniform control flow).
vec2 prepare(vec2 v, vec2 wn, vec2 pv, vec2 pwn, float angle_pos
#if EARLY
             , vec2 sc_early
#endif
) {
    uint t = gl_LocalInvocationID.x;
#if QK_NORM
    // Only the subgroups of invocations t < D hold squares (the others' are zeros).
    vec2 ss = wg_sum2_of(t < D ? v * v : vec2(0.0), subgroups_holding(D));
    if (t < D) {
        vec2 scale = inversesqrt(ss / float(D) + EPS);
        v = v * scale * wn;
        pv = pv * scale * pwn;
    }
#endif
    if (t < ROT) {
#if EARLY
        vec2 sc = sc_early;
#else
        uint f = t < HALF_ROT ? t : t - HALF_ROT;
        vec2 sc = sin_cos(inv_freq(f) * angle_pos);
#endif
        v = t < HALF_ROT ? v * sc.y - pv * sc.x : v * sc.y + pv * sc.x;
    }
    return v;
}

// A values-phase invocation's VW elements cv * VW .. of a V row: VT as loaded (VT_RAW) and as
// floats; the fresh row's from shared memory; the groups' sums exchanged through shared memory.
#if KV_DTYPE == F16
#define VT vec2
#define VT_RAW uint
VT_RAW vt_raw(uint kv_base, uint j, uint cv) { return v[(kv_base + j * D) / 2u + cv]; }
VT vt_unpack(VT_RAW r) { return unpackHalf2x16(r); }
VT vt_fresh(uint cv) { return vec2(vf_s[2u * cv], vf_s[2u * cv + 1u]); }
// red2_s was last read in prepare(), before its closing barrier.
void vt_share(uint t, VT a) { red2_s[t] = a; }
float vt_shared(uint i, uint e) { return red2_s[i * DV + e / 2u][e & 1u]; }
#else
#define VT float
#define VT_RAW float
VT_RAW vt_raw(uint kv_base, uint j, uint cv) { return v[kv_base + j * D + cv]; }
VT vt_unpack(VT_RAW r) { return r; }
VT vt_fresh(uint cv) { return vf_s[cv]; }
void vt_share(uint t, VT a) { part[t] = a; }
float vt_shared(uint i, uint e) { return part[i * DV + e]; }
#endif

// `x` as the cache holds it, so that the fresh slot attends to what later steps read back, and
// the writer packs exactly what was attended to. f16 caches: the hardware's conversion there
// and back, with a shuffle to the lane itself between them, because NVIDIA's compiler folds
// unpackHalf2x16(packHalf2x16(x)) to x (the block then attended to its fresh key and value
// unrounded while the cache held them rounded: tests/kv_cache.rs's fused logits 2.8e-4..3.9e-4
// off on an H100; that test, run there, is the guard against a compiler that folds the shuffle
// too: lavapipe cannot tell). On the H100 the shuffle costs ±0.1%; rounding in integer arithmetic instead
// (common.glsl's f16_round) cost bf16 0.8%, and the f16 bits through shared memory q4_0 2.3%
// (docs/perf.md, session 20).
#if KV_DTYPE == F16
float fresh_round(float x) {
    return unpackHalf2x16(subgroupShuffle(packHalf2x16(vec2(x, 0.0)), gl_SubgroupInvocationID)).x;
}
#else
float fresh_round(float x) { return x; }
#endif

// Elements e .. e + 3 of the query row.
vec4 q4(uint e) { return vec4(q_s[e], q_s[e + 1u], q_s[e + 2u], q_s[e + 3u]); }

// A score-phase lane's K loads (KC elements, see above) and their dot products with q.
#if KV_DTYPE == F16
KC_RAW kc_raw(uint i) { return k8[i]; }
float kc_dot(uint e, KC_RAW r) {
    return dot(q4(e), vec4(unpackHalf2x16(r.x), unpackHalf2x16(r.y)))
         + dot(q4(e + 4u), vec4(unpackHalf2x16(r.z), unpackHalf2x16(r.w)));
}
#else
KC_RAW kc_raw(uint i) { return kv_k4(i); }
float kc_dot(uint e, KC_RAW r) { return dot(q4(e), r); }
#endif

// The values of slot j for invocation cv: the fresh row for the slot being written, else the
// cache.
VT v_at(uint kv_base, uint j, uint cv, uint fresh) {
    return j == fresh ? vt_fresh(cv) : vt_unpack(vt_raw(kv_base, j, cv));
}

// Decode attention of the query row in q_s over slots lo..hi-1 of kv head base kv_base; slot
// `fresh` comes from kf_s / vf_s (see the top). Leaves the running max in `m` (the same in
// every invocation) and, in invocations t < D, the unnormalised output element t in `total`
// and the sum of the weights in `lsum`.
void attend(uint kv_base, uint lo, uint hi, uint fresh,
#if PREFETCH
            in KC_RAW kp[KP], in VT_RAW vp[VP],
#endif
            out float m, out float total, out float lsum) {
    uint t = gl_LocalInvocationID.x;
    uint lane = t % P;
    uint slot = t / P;
    uint gv = t / DV;
    uint cv = t - gv * DV;
    m = NEG_BIG;
    float l = 0.0;
    VT acc = VT(0.0);
    for (uint tile = lo; tile < hi; tile += T) {
        uint j = tile + slot;
        float d = 0.0;
        if (j < hi && j == fresh) {
            for (uint e = lane; e < D; e += P) {
                d += q_s[e] * kf_s[e];
            }
        } else if (j < hi) {
            uint row = kv_base + j * D;
#if PREFETCH
            if (tile == lo) {
                for (uint i = 0u; i < KP; i++) {
                    uint c = lane + i * P;
                    if (c < D / KC) {
                        d += kc_dot(KC * c, kp[i]);
                    }
                }
            } else
#endif
            if (D % KC == 0u) {
                for (uint c = lane; c < D / KC; c += P) {
                    d += kc_dot(KC * c, kc_raw(row / KC + c));
                }
            } else if (D % 4u == 0u) {
                for (uint c4 = lane; c4 < D / 4u; c4 += P) {
                    d += dot(q4(4u * c4), kv_k4(row / 4u + c4));
                }
            } else {
                for (uint e = lane; e < D; e += P) {
                    d += q_s[e] * kv_k(row + e);
                }
            }
        }
        part[t] = d;
        barrier();
        float s = NEG_BIG;
        if (t < T) {
            if (tile + t < hi) {
                float sum = 0.0;
                for (uint i = 0u; i < P; i++) {
                    sum += part[t * P + i];
                }
                s = sum * SCALE;
            }
            w_s[t] = s;
        }
        // The tile's max over the subgroups of invocations t < T only (the others hold
        // NEG_BIG). red_f is next written by the next tile's, after the barrier below.
        float m_new = max(m, wg_max_open(s, subgroups_holding(T)));
        float alpha = exp(m - m_new);
        m = m_new;
        if (t < T) {
            w_s[t] = tile + t < hi ? exp(w_s[t] - m_new) : 0.0;
        }
        barrier();
        if (gv < GV) {
            uint count = min(T, hi - tile);
            VT a = acc * alpha;
            float ws = 0.0;
            // Four independent loads in flight per step: this loop is latency-bound.
            uint jj = gv;
#if PREFETCH
            if (tile == lo) {
                // The first tile's V, loaded at the start (same order of the sums).
                for (uint i = 0u; i < VP; i++) {
                    uint at = gv + i * GV;
                    if (at < count) {
                        float w = w_s[at];
                        a += w * (tile + at == fresh ? vt_fresh(cv) : vt_unpack(vp[i]));
                        ws += w;
                    }
                }
                jj = gv + VP * GV;
            }
#endif
            for (; jj + 3u * GV < count; jj += 4u * GV) {
                VT v0 = v_at(kv_base, tile + jj, cv, fresh);
                VT v1 = v_at(kv_base, tile + jj + GV, cv, fresh);
                VT v2 = v_at(kv_base, tile + jj + 2u * GV, cv, fresh);
                VT v3 = v_at(kv_base, tile + jj + 3u * GV, cv, fresh);
                float w0 = w_s[jj], w1 = w_s[jj + GV], w2 = w_s[jj + 2u * GV], w3 = w_s[jj + 3u * GV];
                a += w0 * v0;
                a += w1 * v1;
                a += w2 * v2;
                a += w3 * v3;
                ws += w0;
                ws += w1;
                ws += w2;
                ws += w3;
            }
            for (; jj < count; jj += GV) {
                float w = w_s[jj];
                a += w * v_at(kv_base, tile + jj, cv, fresh);
                ws += w;
            }
            acc = a;
            l = l * alpha + ws;
        }
        // The next tile rewrites part and w_s: it waits for this one's readers. After the last
        // tile nothing does (part was last read before wg_max_open's barrier, w_s is not written).
        if (tile + T < hi) {
            barrier();
        }
    }
    // The slot groups' outputs and weight sums, in one exchange.
    vt_share(t, gv < GV ? acc : VT(0.0));
    if (gv < GV && cv == 0u) {
        l_s[gv] = l;
    }
    barrier();
    total = 0.0;
    lsum = 0.0;
    if (t < D) {
        for (uint i = 0u; i < GV; i++) {
            total += vt_shared(i, t);
            lsum += l_s[i];
        }
    }
}

#if ATTN_SG
#include "attend_subgroups.glsl"
#endif

#if SPLITS > 1
// Polled partials (POLLED_COMBINE kernels, where the dispatch runs with handoffs: it publishes
// y). A head's highest used split waits for the others in device memory: they publish their
// partials as flagged words (as handoffs do: the value and its readiness in one word, 0 meaning
// not yet, a published +0.0 sent as -0.0) after the arrival counters in the counters' slice,
// and the highest folds them in as they come. That saves the fence and the counted arrival, two
// round trips through L2, on the block's critical path; the waiter sets the words back to 0, so
// the slice is zero again after the dispatch, as the counters are. The waiters are one per head
// and the splits they wait for wait on nothing in this dispatch, so this is sound where the
// device holds more of the dispatch's workgroups at once than there are heads, or hands them
// out in index order (handoff.glsl). Without handoffs the last split to arrive combines, as
// below.
bool polled() {
    return handoff.out_at != HANDOFF_NONE;
}

// Word i (m, l, o[0..D)) of split s of head h's polled partial.
uint part_word(uint h, uint s, uint i) {
    return HQ + (h * NSPLITS + s) * (D + 2u) + i;
}

void part_publish(uint at, float f) {
    uint v = floatBitsToUint(f);
    atomicStore(arrived[at], v == 0u ? 0x80000000u : v, gl_ScopeDevice,
                gl_StorageSemanticsBuffer, gl_SemanticsRelaxed);
}

uint part_poll(uint at) {
    return atomicLoad(arrived[at], gl_ScopeDevice, gl_StorageSemanticsBuffer,
                      gl_SemanticsRelaxed);
}

// The partials of splits gg, gg + G, ... of element c (ms, ls, os; invocation group gg of G
// groups of D, c = t - gg * D; empty entries NEG_BIG, 0, 0) folded under the group's max into
// part, m_s and l_s, in a fixed order of the sums, so the result does not depend on which split
// came last. Every invocation must call it.
void fold(uint gg, uint c, float ms[SPG], float ls[SPG], float os[SPG]) {
    uint t = gl_LocalInvocationID.x;
    float mg = NEG_BIG;
    for (uint i = 0u; i < SPG; i++) {
        mg = max(mg, ms[i]);
    }
    float og = 0.0;
    float lg = 0.0;
    for (uint i = 0u; i < SPG; i++) {
        float w = exp(ms[i] - mg);
        og += os[i] * w;
        lg += ls[i] * w;
    }
    part[t] = gg < G ? og : 0.0;
    if (gg < G && c == 0u) {
        m_s[gg] = mg;
        l_s[gg] = lg;
    }
    barrier();
}

// y from the groups' folds in part, m_s and l_s, published.
void write_head(uint h) {
    uint t = gl_LocalInvocationID.x;
    if (t < D) {
        float mm = NEG_BIG;
        for (uint i = 0u; i < G; i++) {
            mm = max(mm, m_s[i]);
        }
        float o = 0.0;
        float l = 0.0;
        for (uint i = 0u; i < G; i++) {
            float w = exp(m_s[i] - mm);
            l += l_s[i] * w;
            o += part[i * D + t] * w;
        }
        y[h * D + t] = GATE_OUT(o / l);
        handoff_store(h * D + t, GATE_OUT(o / l));
    }
}

// Split `split` of head h publishes its partial as flagged words.
void publish_partial(uint h, uint split, float m, float total, float lsum) {
    uint t = gl_LocalInvocationID.x;
    if (t < D) {
        part_publish(part_word(h, split, 2u + t), total);
    }
    if (t == 0u) {
        part_publish(part_word(h, split, 0u), m);
        part_publish(part_word(h, split, 1u), lsum);
    }
}

// Split `me` of head h folds its own partial and the published ones of the other used splits
// (polled as they come) into y, and sets their words back to 0.
void gather(uint h, uint me, uint used, float m, float total, float lsum) {
    uint t = gl_LocalInvocationID.x;
    // Its own partial through shared memory, for the group that folds it (lsum is invocation
    // 0's; q_s and w_s were last read in attend() or attend_sg(), before its closing barrier).
    if (t < D) {
        q_s[t] = total;
    }
    if (t == 0u) {
        w_s[0] = lsum;
    }
    uint gg = t / D;
    uint c = t - gg * D;
    // Every word polled before any is waited on: one round trip where they are published.
    uvec3 v[SPG];
    [[unroll]] for (uint i = 0u; i < SPG; i++) {
        uint s = gg + i * G;
        v[i] = uvec3(0u);
        if (gg < G && s < used && s != me) {
            v[i] = uvec3(part_poll(part_word(h, s, 0u)), part_poll(part_word(h, s, 1u)),
                         part_poll(part_word(h, s, 2u + c)));
        }
    }
    barrier();
    float ms[SPG];
    float ls[SPG];
    float os[SPG];
    [[unroll]] for (uint i = 0u; i < SPG; i++) {
        uint s = gg + i * G;
        if (gg < G && s < used && s != me) {
            // The three still empty polled again together (see the q/k/v words in main()).
            uvec3 w = v[i];
            while (any(equal(w, uvec3(0u)))) {
                w = uvec3(w.x != 0u ? w.x : part_poll(part_word(h, s, 0u)),
                          w.y != 0u ? w.y : part_poll(part_word(h, s, 1u)),
                          w.z != 0u ? w.z : part_poll(part_word(h, s, 2u + c)));
            }
            ms[i] = uintBitsToFloat(w.x);
            ls[i] = uintBitsToFloat(w.y);
            os[i] = uintBitsToFloat(w.z);
        } else if (gg < G && s == me) {
            ms[i] = m;
            ls[i] = w_s[0];
            os[i] = q_s[c];
        } else {
            ms[i] = NEG_BIG;
            ls[i] = 0.0;
            os[i] = 0.0;
        }
    }
    fold(gg, c, ms, ls, os);
    // Every invocation has its words (the barrier above): they go back to 0 for the next
    // dispatch that binds the slice.
    [[unroll]] for (uint i = 0u; i < SPG; i++) {
        uint s = gg + i * G;
        if (gg < G && s < used && s != me) {
            atomicStore(arrived[part_word(h, s, 2u + c)], 0u, gl_ScopeDevice,
                        gl_StorageSemanticsBuffer, gl_SemanticsRelaxed);
            if (c == 0u) {
                atomicStore(arrived[part_word(h, s, 0u)], 0u, gl_ScopeDevice,
                            gl_StorageSemanticsBuffer, gl_SemanticsRelaxed);
                atomicStore(arrived[part_word(h, s, 1u)], 0u, gl_ScopeDevice,
                            gl_StorageSemanticsBuffer, gl_SemanticsRelaxed);
            }
        }
    }
    write_head(h);
}

// Split `split` of query head h publishes its partial; the last of the `used` splits to arrive
// combines all of them into y and resets the head's counter (or, polled(), the highest gathers).
void combine(uint h, uint split, uint used, float m, float total, float lsum) {
    uint t = gl_LocalInvocationID.x;
#ifdef ABLATE_COMBINE
    // Timing only (compile-model --ablate attention-combine): split 0 publishes its own
    // partial as the head's output.
    if (split == 0u && t < D) {
        y[h * D + t] = GATE_OUT(total / lsum);
        handoff_store(h * D + t, GATE_OUT(total / lsum));
    }
    return;
#endif
#if POLLED_COMBINE
    if (polled()) {
        if (split == used - 1u) {
            gather(h, split, used, m, total, lsum);
        } else {
            publish_partial(h, split, m, total, lsum);
        }
        return;
    }
#endif
    const uint stride = D + 2u;
    uint head = h * NSPLITS * stride;
    uint mine = head + split * stride;
    if (t < D) {
        partial[mine + 2u + t] = total;
    }
    if (t == 0u) {
        partial[mine] = m;
        partial[mine + 1u] = lsum;
    }
    // Every invocation's partial is visible device-wide before the arrival is counted.
    memoryBarrierBuffer();
    barrier();
    if (t == 0u) {
        last_s = atomicAdd(arrived[h], 1u) == used - 1u ? 1u : 0u;
    }
    barrier();
    if (last_s == 0u) {
        return;
    }
    memoryBarrierBuffer();
    // Every partial loaded in one round trip (fold()'s groups). part and l_s were last read in
    // attend(), before the barrier ahead of the arrival.
    uint gg = t / D;
    uint c = t - gg * D;
    float ms[SPG];
    float ls[SPG];
    float os[SPG];
    for (uint i = 0u; i < SPG; i++) {
        uint s = gg + i * G;
        bool live = gg < G && s < used;
        uint b = head + min(s, used - 1u) * stride;
        ms[i] = live ? partial[b] : NEG_BIG;
        ls[i] = live ? partial[b + 1u] : 0.0;
        os[i] = live ? partial[b + 2u + c] : 0.0;
    }
    fold(gg, c, ms, ls, os);
    write_head(h);
    // Self-cleaning: every split of this head has arrived, none reads the counter again.
    if (t == 0u) {
        arrived[h] = 0u;
    }
}
#endif

// The q and k norm weights of element t (wn) and of its rope partner pt (pwn); 1 without
// QK_NORM.
void qk_norm_weights(uint t, uint pt, inout vec2 wn, inout vec2 pwn) {
#if QK_NORM
    wn = vec2(LOAD(QN_DTYPE, qn, t), LOAD(KN_DTYPE, kn, t));
    pwn = vec2(LOAD(QN_DTYPE, qn, pt), LOAD(KN_DTYPE, kn, pt));
    if (NORM_ZC != 0) {
        wn += 1.0;
        pwn += 1.0;
    }
#endif
}

#if EARLY
// The first tile's K and V words, consumed: a hash of them, and a store no result depends on
// where it matches a constant (the split's own partial slot, which only this invocation writes
// later, and which nothing reads before that). Consumed after the first polls of the q/k/v
// words, the loads cannot be sunk past the wait for them (see EARLY in main()).
void consume_tile(KC_RAW kp[KP], VT_RAW vp[VP], uint slot_at) {
    uint hx = 0u;
    for (uint i = 0u; i < KP; i++) {
#if KV_DTYPE == F16
        hx ^= kp[i].x ^ kp[i].w;
#else
        hx ^= floatBitsToUint(kp[i].x) ^ floatBitsToUint(kp[i].w);
#endif
    }
    for (uint i = 0u; i < VP; i++) {
#if KV_DTYPE == F16
        hx ^= vp[i];
#else
        hx ^= floatBitsToUint(vp[i]);
#endif
    }
    consume_hash(hx, slot_at);
}
#endif

void main() {
    uint wid = group_id();
    if (wid >= HQ * NSPLITS) {
        return;
    }
    uint h = wid / NSPLITS;
    uint split = wid - h * NSPLITS;
    uint t = gl_LocalInvocationID.x;
    uint group = HQ / HKV;
    uint g = h / group;
    // The position, the split's chunk and its first K/V tile depend on nothing this step's
    // q/k/v level writes: taken before the q/k/v words are waited for (handoffs launch this
    // level while q/k/v still runs), so that the tile's latency hides behind that wait and an
    // empty split leaves without polling (on the H100 +2.4% bf16, +0.9% q8_0, +2.1% q4_0
    // against loading the tile after the words: docs/perf.md, session 23).
    int p = pos[0];
    uint n = uint(clamp(p, 0, int(CAP) - 1)) + 1u;
    uint chunk = max(MIN_CHUNK, (n + NSPLITS - 1u) / NSPLITS);
    uint used = (n + chunk - 1u) / chunk;
    // Uniform in the workgroup: an empty split leaves before any barrier.
    if (split >= used) {
        return;
    }
    uint lo = split * chunk;
    uint hi = min(n, lo + chunk);
    float angle_pos = float(p);
    uint kv_base = g * CAP * D;
    bool in_cache = p >= 0 && uint(p) < CAP;
    uint fresh = in_cache ? uint(p) : 0xffffffffu;
    bool writer = split == 0u && h % group == 0u;

#if ATTN_SG
    bool sgp = attend_sg_fits();
    // The subgroups that walk load their first pass now (and consume it with the early tile).
    bool sg_loads = sgp && gl_SubgroupID < sg_walkers();
    SG_RAW skp[SG_KL];
    SG_RAW svp[SG_VF];
    if (sg_loads) {
        sg_load(kv_base, lo, hi, skp, svp);
    }
#endif
#if PREFETCH
    // The first tile's K and V rows do not depend on q or on the fresh row: loaded now, their
    // latency overlaps the wait for q/k/v and the norms and rope below. The fresh slot's
    // entries (the writer stores them after the wait) are never used (attend() and attend_sg()
    // take that slot from shared memory), so reading it while the writer stores it does not
    // matter; slots past the chunk are clamped into it and never used.
    KC_RAW kp[KP];
    VT_RAW vp[VP];
#if ATTN_SG
    if (!sgp)
#endif
    {
        uint slot = t / P;
        uint row = kv_base + min(lo + slot, hi - 1u) * D;
        for (uint i = 0u; i < KP; i++) {
            // Lanes past the row's last chunk (D / KC < KP * P) load its last, unused.
            kp[i] = kc_raw(row / KC + min(t % P + i * P, D / KC - 1u));
        }
        uint gv = t / DV;
        uint cv = t - gv * DV;
        for (uint i = 0u; i < VP; i++) {
            uint j = min(lo + gv + i * GV, hi - 1u);
            vp[i] = gv < GV ? vt_raw(kv_base, j, cv) : VT_RAW(0);
        }
    }
#endif
    // The q, fresh k and v rows depend on nothing this dispatch writes: all polled together,
    // so their latencies overlap instead of following one another; the norm weights after
    // those first polls.
    // t's rope partner (itself past the rotary dims).
    uint pt = t < HALF_ROT ? t + HALF_ROT : (t < ROT ? t - HALF_ROT : t);
#if EARLY
    vec2 sc_early = vec2(0.0);
    // The rope's sines and cosines depend on the position and t alone: taken before the wait.
    if (t < ROT) {
        sc_early = sin_cos(inv_freq(t < HALF_ROT ? t : t - HALF_ROT) * angle_pos);
    }
#endif
    vec2 raw = vec2(0.0);
    vec2 praw = vec2(0.0);
    float vv = 0.0;
    vec2 wn = vec2(1.0);
    vec2 pwn = vec2(1.0);
    if (t < D && handoff_reading()) {
        // All five polled before any is waited on, and those still empty polled again together
        // until none is: one round trip after the last lands, where waiting on each in turn
        // took one more for every word whose first poll had found it empty (on an H100 bf16
        // +0.7%, q8_0 +0.3%, q4_0 +0.3%, more beside the gather's and o_proj's the same:
        // docs/perf.md, session 29).
        uvec4 at = uvec4(handoff_at(0u, h * QROW + t), handoff_at(1u, g * D + t),
                         handoff_at(0u, h * QROW + pt), handoff_at(1u, g * D + pt));
        uint vat = handoff_at(2u, g * D + t);
        uvec4 got = uvec4(handoff_poll(at.x), handoff_poll(at.y), handoff_poll(at.z),
                          handoff_poll(at.w));
        uint pv = handoff_poll(vat);
#if GATED
        // The gate's word with the others: its value is needed only at the output, but a
        // poll now costs no round trip of its own.
        uint gat = handoff_at(0u, h * QROW + D + t);
        uint pg = handoff_poll(gat);
#endif
        // The norm weights once the first polls are out, so that their round trip overlaps
        // the wait instead of following it. Loaded before the polls (with the rope's angle)
        // they delayed them: bf16 +0.6%, q8_0 -0.7%, q4_0 -1.0% on an H100 (docs/perf.md,
        // session 28).
        qk_norm_weights(t, pt, wn, pwn);
#if EARLY
        uint slot_at = (h * NSPLITS + split) * (D + 2u) + 2u + t;
#if ATTN_SG
        if (sg_loads) {
            sg_consume(skp, svp, slot_at);
        } else if (!sgp)
#endif
        consume_tile(kp, vp, slot_at);
#endif
        while (any(equal(got, uvec4(HANDOFF_EMPTY))) || pv == HANDOFF_EMPTY) {
            got = uvec4(got.x != HANDOFF_EMPTY ? got.x : handoff_poll(at.x),
                        got.y != HANDOFF_EMPTY ? got.y : handoff_poll(at.y),
                        got.z != HANDOFF_EMPTY ? got.z : handoff_poll(at.z),
                        got.w != HANDOFF_EMPTY ? got.w : handoff_poll(at.w));
            pv = pv != HANDOFF_EMPTY ? pv : handoff_poll(vat);
        }
#if GATED
        while (pg == HANDOFF_EMPTY) {
            pg = handoff_poll(gat);
        }
        out_gate = 1.0 / (1.0 + exp(-uintBitsToFloat(pg)));
#endif
        raw = uintBitsToFloat(got.xy);
        praw = uintBitsToFloat(got.zw);
        vv = uintBitsToFloat(pv);
    } else if (t < D) {
        raw = vec2(q[h * QROW + t], k_new[g * D + t]);
        praw = vec2(q[h * QROW + pt], k_new[g * D + pt]);
        vv = v_new[g * D + t];
#if GATED
        out_gate = 1.0 / (1.0 + exp(-q[h * QROW + D + t]));
#endif
        qk_norm_weights(t, pt, wn, pwn);
    }
    TIMELINE_MARK(0);
#ifdef ABLATE_EMPTY
    // Timing only (compile-model --ablate attention): the block reduced to its handoff hop,
    // q/k/v words in, y words out.
    if (wid % NSPLITS == 0u && t < D) {
        float e = raw.x + praw.x + vv;
        y[h * D + t] = e;
        handoff_store(h * D + t, e);
    }
    return;
#endif
    // The fresh K and V rows of the group: written to the caches by the writer, attended to
    // from shared memory by the split holding the fresh slot.
    vec2 qk = prepare(raw, wn, praw, pwn, angle_pos
#if EARLY
                      , sc_early
#endif
    );
#ifdef ATTN_MARK_AFTER_PREPARE
    // Probe (timeline only): "work done" after the norms and rope, so that the rest is the
    // attention itself and the combine.
    TIMELINE_MARK(1);
#endif
    if (t < D) {
        q_s[t] = qk.x;
        kf_s[t] = fresh_round(qk.y);
        vf_s[t] = fresh_round(vv);
#if KV_DTYPE != F16
        if (in_cache && writer) {
            k[kv_base + uint(p) * D + t] = qk.y;
            v[kv_base + uint(p) * D + t] = vv;
        }
#endif
    }
    barrier();
#if KV_DTYPE == F16
    // Two elements per word, from shared memory (D is even).
    if (t < D / 2u && in_cache && writer) {
        uint at = (kv_base + uint(p) * D) / 2u + t;
        k[at] = packHalf2x16(vec2(kf_s[2u * t], kf_s[2u * t + 1u]));
        v[at] = packHalf2x16(vec2(vf_s[2u * t], vf_s[2u * t + 1u]));
    }
#endif
    float m, total, lsum;
#if ATTN_SG
    if (sgp) {
        attend_sg(kv_base, lo, hi, fresh, skp, svp, m, total, lsum);
    } else
#endif
    attend(kv_base, lo, hi, fresh,
#if PREFETCH
           kp, vp,
#endif
           m, total, lsum);
#ifndef ATTN_MARK_AFTER_PREPARE
    TIMELINE_MARK(1);
#endif
    if (used == 1u) {
        if (t < D) {
            y[h * D + t] = GATE_OUT(total / lsum);
            handoff_store(h * D + t, GATE_OUT(total / lsum));
        }
        return;
    }
#if SPLITS > 1
    combine(h, split, used, m, total, lsum);
#endif
}
