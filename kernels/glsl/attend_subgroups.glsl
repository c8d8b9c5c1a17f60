// The attention block's decode attention (fused_attention.glsl's attend()) with no workgroup
// barrier inside its walk: each subgroup keeps its own online softmax over its slots, and the
// subgroups' partials meet once, in shared memory, at the end.
//
// Why: at the positions a decode spends most of its steps in, a split walks one tile of a few
// dozen slots, and attend()'s score and value phases exchange through shared memory with five
// workgroup barriers per tile, each waiting for the slowest of 16 subgroups. Here a subgroup
// takes NO = subgroup size / 8 slots per pass, one per octet of lanes (LPS below):
// - scores: lane i of an octet dots 4-element chunks i * KL .. i * KL + KL - 1 of the query (from
//   q_s) with those of its slot's K row, and three shuffles within the octet sum them;
// - the softmax: the octets' scores broadcast to the whole subgroup (NO shuffles), every lane
//   takes the max, the weights and their sum itself;
// - values: lane l accumulates output chunks l + i * subgroup size (VCH of them) over the NO
//   slots, rescaled by the running max as it moves, so the output, the max and the weight sum
//   live in registers from pass to pass.
// At the end each of the first SGU subgroups writes (m, l, o[D]) to shared memory and, after the
// one barrier, invocations t < D fold them in subgroup order (a fixed order: the result does not
// depend on timing). The first pass's K and V are loaded before the wait for the q/k/v words
// (the caller's sg_load), a later pass's at its start: loaded a pass ahead, q4_0 gained 0.8%
// instead of 1.4%.
//
// Measured on an H200 with Qwen3-0.6B's shape at 256 tokens (docs/perf.md, session 40): q4_0
// +1.4% (three calls), but q8_0 -6.5% and bf16 -2.5%: the block takes 71-74 registers here
// against attend()'s 58-64, and beside q8_0's 1024 q/k/v workgroups (4096 registers each, about
// eight an SM) a 512-invocation block of more than 64 no longer fits an SM's 64K, so it starts
// only as they leave. With only 8 subgroups walking it took 40 registers (why was not found)
// and lost 1% in q8_0, 0.3% in q4_0. With bf16's q/k/v in 8 rows a workgroup, half the
// workgroups, bf16 gains 1.7-2.5% with it (session 41; that fit is not the whole story: at 4
// rows bf16's attend() block did not fit beside q/k/v either, and q8_0 lost 2.2% with 8 rows).
// The first pass's K and V held in shared memory across the wait instead of registers (probe,
// branch experiment/s41-sg-stage) brought the block to 40-43 registers and q8_0's loss to
// 0.5-0.8% against attend(), but cost q4_0 8-10% (bf16 +1%, with 32 KiB more shared memory
// than lavapipe offers at heads of 128): registers were most of q8_0's loss, not all of it.
// The compiler takes it for q4_0 and 16-bit float schedules, and there for the grids of
// positions below 384 whose chunks take one pass (`AttnSpec::subgroup_walk`,
// `codegen::subgroup_walk_fits`): on every grid q4_0 lost 8.3% at 2048 tokens, on the bands
// below 768 2.1%, and as kept it is level there (+0.03%).
//
// Layout constraints (checked at run time by attend_sg_fits(), uniform, so a device the path
// does not fit takes attend() instead): the subgroup at least 8 wide, D a multiple of 32 and
// D / 4 a multiple of the subgroup size. So 8-wide subgroups (lavapipe) fit heads of 32, 64, 128
// and 256, 32-wide ones (NVIDIA) 128 and 256, 64-wide ones none below 256. The compiler asks for
// it only for heads of 32 to 128 (`fuse::program::subgroup_walk`: the fold's array is 64 D bytes
// of shared memory, which attend() also declares beside it). Only the first SGU subgroups work
// (the fold's array is sized for them).
//
// The including source provides q_s, kf_s, vf_s (the query, fresh K and V rows, after the norms
// and rope, as the cache holds them), the caches (kv_cache.glsl), D, SCALE and NEG_BIG.

// Lanes per slot: an octet. SG_PAIRS (test only) takes pairs, so that lavapipe's 8-wide
// subgroups walk four slots a pass, as NVIDIA's 32-wide ones do, and the paths of several
// slots per subgroup run in the suite.
#ifdef SG_PAIRS
const uint LPS = 2u;
#else
const uint LPS = 8u;
#endif
// 4-element chunks of a K row per lane of a slot's lanes, and V chunks per lane per pass (the
// subgroup's NO = width / LPS slots times its VCH = D / 4 / width output chunks per lane).
const uint SG_KL = (D + 4u * LPS - 1u) / (4u * LPS);
const uint SG_VF = SG_KL;
// Output chunks per lane (VCH), at most for 8-wide subgroups.
const uint SG_OV = (D + 31u) / 32u;
// The subgroups that walk (and whose partials the fold's array holds).
#ifdef SG_FEW
// Test only: fewer walkers than a test's workgroup has subgroups, and a part-full block of the
// fold.
const uint SGU = 5u;
#else
const uint SGU = 16u;
#endif

#if KV_DTYPE == F16
#define SG_RAW uvec2
layout(set = 0, binding = KV_V_BINDING, std430) readonly buffer VSg { uvec2 v2_sg[]; };
SG_RAW sg_k_raw(uint kv_base, uint j, uint c4) { return k2[(kv_base + j * D) / 4u + c4]; }
SG_RAW sg_v_raw(uint kv_base, uint j, uint c4) { return v2_sg[(kv_base + j * D) / 4u + c4]; }
vec4 sg_unpack(SG_RAW r) { return vec4(unpackHalf2x16(r.x), unpackHalf2x16(r.y)); }
uint sg_bits(SG_RAW r) { return r.x ^ r.y; }
#else
#define SG_RAW vec4
layout(set = 0, binding = KV_V_BINDING, std430) readonly buffer VSg { vec4 v4_sg[]; };
SG_RAW sg_k_raw(uint kv_base, uint j, uint c4) { return k4[(kv_base + j * D) / 4u + c4]; }
SG_RAW sg_v_raw(uint kv_base, uint j, uint c4) { return v4_sg[(kv_base + j * D) / 4u + c4]; }
vec4 sg_unpack(SG_RAW r) { return r; }
uint sg_bits(SG_RAW r) { return floatBitsToUint(r.x) ^ floatBitsToUint(r.w); }
#endif

shared vec2 sg_ml[SGU];
shared vec4 sg_o[SGU * ((D + 3u) / 4u)];

bool attend_sg_fits() {
    return gl_SubgroupSize >= 8u && D % (4u * LPS) == 0u && (D / 4u) % gl_SubgroupSize == 0u;
}

// The subgroups this workgroup walks with.
uint sg_walkers() { return min(gl_NumSubgroups, SGU); }

// Pass `tile`'s K chunks (of this lane's octet's slot) and V chunks (of its subgroup's NO slots),
// slots past hi clamped into the chunk: their values are never used.
void sg_load(uint kv_base, uint tile, uint hi, out SG_RAW kr[SG_KL], out SG_RAW vr[SG_VF]) {
    uint sgs = gl_SubgroupSize;
    uint lane = gl_SubgroupInvocationID;
    uint no = sgs / LPS;
    uint first = tile + gl_SubgroupID * no;
    uint j = min(first + lane / LPS, hi - 1u);
    uint li = lane % LPS;
    [[unroll]] for (uint i = 0u; i < SG_KL; i++) {
        kr[i] = sg_k_raw(kv_base, j, li * SG_KL + i);
    }
    uint vch = D / 4u / sgs;
    [[unroll]] for (uint f = 0u; f < SG_VF; f++) {
        uint k = f / vch;
        uint jk = min(first + k, hi - 1u);
        vr[f] = sg_v_raw(kv_base, jk, lane + sgs * (f - k * vch));
    }
}

// attend()'s contract: the max m (the same in every invocation), and in invocations t < D the
// unnormalised output element t in `total` and the weight sum in `lsum`, over slots lo..hi-1;
// `kp0` / `vp0` are the first pass's loads (sg_load at lo). Every invocation must call it.
void attend_sg(uint kv_base, uint lo, uint hi, uint fresh, in SG_RAW kp0[SG_KL],
               in SG_RAW vp0[SG_VF], out float m, out float total, out float lsum) {
    uint t = gl_LocalInvocationID.x;
    uint sgs = gl_SubgroupSize;
    uint lane = gl_SubgroupInvocationID;
    uint sg = gl_SubgroupID;
    uint no = sgs / LPS;
    uint vch = D / 4u / sgs;
    uint walkers = sg_walkers();
    uint per = walkers * no;
    uint li = lane % LPS;
    float mm = NEG_BIG;
    float ll = 0.0;
    vec4 o[SG_OV];
    [[unroll]] for (uint i = 0u; i < SG_OV; i++) {
        o[i] = vec4(0.0);
    }
    if (sg < walkers) {
        SG_RAW kc[SG_KL];
        SG_RAW vc[SG_VF];
        [[unroll]] for (uint i = 0u; i < SG_KL; i++) {
            kc[i] = kp0[i];
        }
        [[unroll]] for (uint i = 0u; i < SG_VF; i++) {
            vc[i] = vp0[i];
        }
        for (uint tile = lo; tile < hi; tile += per) {
            if (tile != lo) {
                sg_load(kv_base, tile, hi, kc, vc);
            }
            uint first = tile + sg * no;
            uint j = first + lane / LPS;
            float d = 0.0;
            if (j < hi) {
                [[unroll]] for (uint i = 0u; i < SG_KL; i++) {
                    uint e = 4u * (li * SG_KL + i);
                    vec4 qv = vec4(q_s[e], q_s[e + 1u], q_s[e + 2u], q_s[e + 3u]);
                    vec4 kv = j == fresh ? vec4(kf_s[e], kf_s[e + 1u], kf_s[e + 2u], kf_s[e + 3u])
                                         : sg_unpack(kc[i]);
                    d += dot(qv, kv);
                }
            }
            [[unroll]] for (uint x = 1u; x < LPS; x *= 2u) {
                d += subgroupShuffleXor(d, x);
            }
            float s = j < hi ? d * SCALE : NEG_BIG;
            float m_new = mm;
            float sk[SG_VF];
            [[unroll]] for (uint k = 0u; k < SG_VF; k++) {
                // no <= SG_VF: D / 4 is a multiple of the subgroup size.
                if (k < no) {
                    sk[k] = subgroupShuffle(s, LPS * k);
                    m_new = max(m_new, sk[k]);
                }
            }
            // The pass's first slot is in the chunk (tile < hi) for subgroup 0; a later
            // subgroup's may not be, and then m_new stays mm (NEG_BIG if it had no slot in an
            // earlier pass either, where alpha = exp(0) only scales zeros) and nothing is added.
            float alpha = exp(mm - m_new);
            mm = m_new;
            ll *= alpha;
            [[unroll]] for (uint i = 0u; i < SG_OV; i++) {
                o[i] *= alpha;
            }
            [[unroll]] for (uint f = 0u; f < SG_VF; f++) {
                uint k = f / vch;
                uint i = f - k * vch;
                uint jk = first + k;
                if (k < no && jk < hi) {
                    float p = exp(sk[k] - m_new);
                    if (i == 0u) {
                        ll += p;
                    }
                    uint c4 = lane + sgs * i;
                    vec4 val = jk == fresh ? vec4(vf_s[4u * c4], vf_s[4u * c4 + 1u],
                                                  vf_s[4u * c4 + 2u], vf_s[4u * c4 + 3u])
                                           : sg_unpack(vc[f]);
                    o[i] += p * val;
                }
            }
        }
        if (lane == 0u) {
            sg_ml[sg] = vec2(mm, ll);
        }
        [[unroll]] for (uint i = 0u; i < SG_OV; i++) {
            if (i < vch) {
                sg_o[sg * (D / 4u) + lane + sgs * i] = o[i];
            }
        }
    }
    barrier();
    // The fold in blocks of four subgroups: unrolled whole, its loads took a register each
    // and the block's count rose from 40 to 72 (NVIDIA).
    m = NEG_BIG;
    [[dont_unroll]] for (uint g0 = 0u; g0 < walkers; g0 += 4u) {
        [[unroll]] for (uint i = 0u; i < 4u; i++) {
            if (g0 + i < walkers) {
                m = max(m, sg_ml[g0 + i].x);
            }
        }
    }
    total = 0.0;
    lsum = 0.0;
    if (t < D) {
        [[dont_unroll]] for (uint g0 = 0u; g0 < walkers; g0 += 4u) {
            [[unroll]] for (uint i = 0u; i < 4u; i++) {
                uint g = g0 + i;
                if (g < walkers) {
                    vec2 ml = sg_ml[g];
                    float w = exp(ml.x - m);
                    total += w * sg_o[g * (D / 4u) + t / 4u][t % 4u];
                    lsum += w * ml.y;
                }
            }
        }
    }
}

#if EARLY
// consume_tile() for this layout's first pass.
void sg_consume(SG_RAW kr[SG_KL], SG_RAW vr[SG_VF], uint slot_at) {
    uint hx = 0u;
    [[unroll]] for (uint i = 0u; i < SG_KL; i++) {
        hx ^= sg_bits(kr[i]);
    }
    [[unroll]] for (uint i = 0u; i < SG_VF; i++) {
        hx ^= sg_bits(vr[i]);
    }
    consume_hash(hx, slot_at);
}
#endif
