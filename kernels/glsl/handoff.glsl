#ifndef HANDOFF_GLSL
#define HANDOFF_GLSL
// Handoffs: a level's output handed to the next level through flagged words in device memory
// instead of a pipeline barrier between the two (docs/architecture.md, "Handoffs").
//
// A pipeline barrier waits for every workgroup of the level before it to finish and only then
// launches the next level: on an H100 that drain and ramp cost ~3-4 µs per level
// (docs/perf.md). With a handoff, replay records the next level with no barrier before it: its
// workgroups launch while the producer's last ones still run, issue their weight loads at once,
// and wait only for the words they read. The producer writes each output element twice, to its
// binding and, with an atomic store, as a word of the runtime's handoff buffer (set 1); the
// consumer reads those words until none is HANDOFF_EMPTY (the runtime fills the buffer with it
// before each step). One word carries both the value and its readiness, so no fence and no
// counter stand between them. The reads are atomic loads, or, four words at a time,
// `coherent volatile` 16-byte loads (handoff_load4); either bypasses the compute unit's L1,
// whose stale lines a pipeline barrier would otherwise have invalidated. The 16-byte load is
// not atomic: under the Vulkan memory model it races the producer's atomic stores, and it is
// correct because the devices handoffs run on read each aligned 4-byte word of it whole
// (NVIDIA: a volatile vector load is a relaxed load per element; lavapipe: an aligned SSE
// load). A device that tore a word would need the two 64-bit atomic loads instead (three
// quarters of the gain on an H100, docs/perf.md session 29). The two views of set 1 binding 0
// are not decorated Aliased; nothing that reads the words writes them.
//
// Sound where the driver launches a dispatch's workgroups only after every workgroup of the
// dispatches recorded before it (a waiting consumer then waits only on resident producers):
// the runtime turns handoffs on by itself only where that was measured (NVIDIA). One waiter
// with handoffs on waits inside its own dispatch: the attention bands' polled combine
// (fused_attention.glsl's polled()), one workgroup per head, on splits of its head that wait on
// nothing in the dispatch. With the rule above (no later dispatch's workgroup takes a slot
// before all of this one's have launched), it needs the device to hold more of the dispatch's
// workgroups at once than it has heads (the compiler emits polled bands only where its
// device has more compute units than heads: an H100's 132 against 16), or to hand them out
// in increasing index order with each executor running its own in order (lavapipe: each
// thread takes the next contiguous run of workgroups and runs it to its end).
//
// lavapipe ends every loop after 65535 iterations (llvmpipe's loop limiter), so there a reader
// that polls longer takes the empty word as its value (a NaN). Its handoffs (the tests',
// `--handoffs on`) hold only while no reader waits that long: across dispatches none waits
// (lavapipe runs one dispatch after another), and the polled combine's waiter waits on splits
// of its own head, which its thread's contiguous run has mostly finished before it. A reader
// made to wait on another thread's workgroup (branch experiment/late-words) read NaNs after
// exactly 65535 polls, and nesting the poll loop does not lift the bound: a nest gave up after
// 66 outer rounds and 65405 inner polls, one budget for both (docs/perf.md, session 30).
//
// A kernel declares its role in the default of specialization constant 190, which the runtime
// reads from the SPIR-V: bit b (b < 16) for each binding b it can read as handoff words (one
// push-constant slot each, in ascending binding order), bit 31 when it can publish binding 0.
// The including kernel defines HANDOFF_ROLE before including this header.
#extension GL_KHR_memory_scope_semantics : require

layout(constant_id = 190) const uint HANDOFF_ROLE_CONSTANT = HANDOFF_ROLE;

const uint HANDOFF_NONE = 0xFFFFFFFFu;
// What no published value is: a NaN with every bit set, which a published NaN of that pattern
// is changed from (to 0x7FFFFFFF, still a NaN).
const uint HANDOFF_EMPTY = 0xFFFFFFFFu;

layout(push_constant) uniform Handoff {
    // Word index of binding 0's element 0 (HANDOFF_NONE: binding 0 not published).
    uint out_at;
    // Word index of element 0 of the read bindings, slot by slot (HANDOFF_NONE: read from
    // the binding; the runtime sets all slots or none).
    uint in0_at;
    uint in1_at;
    uint in2_at;
} handoff;

layout(set = 1, binding = 0, std430) coherent buffer HandoffWords { uint handoff_word[]; };
// The same words four at a time, for handoff_load4's polls.
layout(set = 1, binding = 0, std430) coherent volatile buffer HandoffWords4 { uvec4 handoff_word4[]; };

// Whether this dispatch reads its role's bindings as handoff words (uniform). The role is
// read here so that the module keeps it: glslang drops a specialization constant no code uses.
bool handoff_reading() {
    return HANDOFF_ROLE_CONSTANT != 0u && handoff.in0_at != HANDOFF_NONE;
}

// Word index of element i of the binding in slot `slot`.
uint handoff_at(uint slot, uint i) {
    return (slot == 0u ? handoff.in0_at : slot == 1u ? handoff.in1_at : handoff.in2_at) + i;
}

// One poll of word `at`. A reader polls all its words before it looks at any: a poll waits on
// nothing, so they are all in flight at once and the words cost one L2 round trip, where
// polling each word until it is ready before polling the next costs one per word. Those still
// empty are polled again together (the attention block's words, handoff_load4's unaligned
// path), for the same reason. One poll per word set is in flight at a time: a second one
// issued 150-300 ns after the first, to see a landing word up to half a round trip sooner,
// lost 1-4% on an H200 (docs/perf.md, session 42), as slower polling had (session 26).
uint handoff_poll(uint at) {
    return atomicLoad(handoff_word[at], gl_ScopeDevice, gl_StorageSemanticsBuffer,
                      gl_SemanticsRelaxed);
}

// The value of word `at` whose first poll gave v: polled again while it is empty.
float handoff_value(uint at, uint v) {
    while (v == HANDOFF_EMPTY) {
        v = handoff_poll(at);
    }
    return uintBitsToFloat(v);
}

// Element i of the binding in slot `slot`, once its producer has published it.
float handoff_load(uint slot, uint i) {
    uint at = handoff_at(slot, i);
    return handoff_value(at, handoff_poll(at));
}

// Elements 4 i4 .. 4 i4 + 3. Where they start on 16 bytes (the runtime's regions start on 64
// words), all four are polled by one 16-byte volatile load, polled again whole while any is
// empty: each word carries its own readiness, so a poll that sees some of them published and
// others not is no harm, and each 4-byte word of the load is read whole (on NVIDIA a volatile
// vector load is a relaxed access per element; lavapipe's is an aligned SSE load). One request
// per poll and one round trip after the last word lands, where four atomic loads took four
// requests and up to four round trips more (the re-poll of each word waits for the one
// before): on an H100 bf16 +3.5%, q8_0 +3.4%, q4_0 +4.3%; two 64-bit atomic loads gave
// +2.7 / +2.6 / +3.0%, four volatile loads polled together -0.9 / -5.1 / -4.4% (docs/perf.md,
// session 29). Elsewhere four atomic loads, the empty ones polled again together.
//
// In two halves, for a reader with work between issuing its polls and waiting on them:
// handoff_poll4 issues the first poll and waits on nothing, handoff_finish4 polls again while
// any word it was given is empty, and handoff_load4 is both. The chained and wide kernels
// poll x before they ready their preloaded weights (fused_chain.glsl), so that a workgroup
// launching after x was published waits for the two loads at once, not for the weights first
// and then for x.
uvec4 handoff_poll4(uint slot, uint i4) {
    uint at = handoff_at(slot, 4u * i4);
    if ((at & 3u) == 0u) {
        return handoff_word4[at / 4u];
    }
    // Not taken in practice (the runtime's regions start on 64 words, and every reader of four
    // at a time reads a whole region), so no test runs it. Written as four single-word loads
    // (handoff_load) it cost q4_0 0.3% on an H100 where it never ran (docs/perf.md, session
    // 29): the four polls in flight, the empty ones polled again together.
    return uvec4(handoff_poll(at), handoff_poll(at + 1u), handoff_poll(at + 2u),
                 handoff_poll(at + 3u));
}

vec4 handoff_finish4(uint slot, uint i4, uvec4 w) {
    uint at = handoff_at(slot, 4u * i4);
    if ((at & 3u) == 0u) {
        while (any(equal(w, uvec4(HANDOFF_EMPTY)))) {
            w = handoff_word4[at / 4u];
        }
        return uintBitsToFloat(w);
    }
    while (any(equal(w, uvec4(HANDOFF_EMPTY)))) {
        w = uvec4(w.x != HANDOFF_EMPTY ? w.x : handoff_poll(at),
                  w.y != HANDOFF_EMPTY ? w.y : handoff_poll(at + 1u),
                  w.z != HANDOFF_EMPTY ? w.z : handoff_poll(at + 2u),
                  w.w != HANDOFF_EMPTY ? w.w : handoff_poll(at + 3u));
    }
    return uintBitsToFloat(w);
}

vec4 handoff_load4(uint slot, uint i4) {
    return handoff_finish4(slot, i4, handoff_poll4(slot, i4));
}

// Publishes element i of binding 0 (when this dispatch publishes).
void handoff_store(uint i, float f) {
    if (HANDOFF_ROLE_CONSTANT != 0u && handoff.out_at != HANDOFF_NONE) {
        uint v = floatBitsToUint(f);
        atomicStore(handoff_word[handoff.out_at + i], v == HANDOFF_EMPTY ? 0x7FFFFFFFu : v,
                    gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsRelaxed);
    }
}
#endif // HANDOFF_GLSL
