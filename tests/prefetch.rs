//! Weight prefetch into L2 (fuse::prefetch, kernels/glsl/prefetch.comp) on the fixtures, with
//! its size floor lifted (their weights are far below the default 1 MiB): every attention
//! level gets one prefetch dispatch reading exactly the weight slices of the (at most three)
//! matvec or chained levels after it, in order (a chain's gate/up left out where the choice
//! says so), cut to the budget (norm weights read past it), only beside a host (an attention
//! block or a linear-attention step), never beside a level that streams weights itself; the
//! levels stay as they were, and the schedule still matches transformers within 5e-3 relative
//! L2 with the same greedy tokens, validation clean.

use vkfuse_compiler::fuse::kv_prefetch::{KvPrefetch, Lead};
use vkfuse_compiler::fuse::prefetch::Prefetch;
use vkfuse_compiler::fuse::FuseOptions;
use vkfuse_runtime::schedule::{Schedule, Slice};
use vkfuse_runtime::session::{Handoffs, Loaded, Replay};
use vkfuse_runtime::ValidationLog;
use vkfuse_tests::{
    assert_rows_close, expected, fused_schedule, fused_schedule_with, loaded_with_handoffs,
    replay_greedy_ids, replay_rows, validated_device, Expected,
};

/// Dispatches that stream weights from binding 1: matvecs, and chained matvecs (binding 1 is
/// their inner, gate/up, weight).
fn streams(label: &str) -> bool {
    label.starts_with("matvec") || label.starts_with("chain")
}

/// Dispatches a prefetch may run beside: attention blocks (not linear-attention steps, which
/// run beside their projections' last rows).
fn hosts(label: &str) -> bool {
    label.starts_with("attention")
}

/// The weight slices (binding 1's buffer) of the weight-streaming dispatches of the three
/// levels after `level` (a chain's binding 1 only with `chain_inner`), up to the first level
/// holding something else, the last matrix cut to the budget, norm weights past it.
fn next_weights(s: &Schedule, level: usize, budget: u64, chain_inner: bool) -> Vec<Slice> {
    let mut out = vec![];
    let mut left = budget;
    'levels: for l in s.levels[level + 1..].iter().take(3) {
        for d in &s.dispatches[l.start as usize..l.end as usize] {
            if !streams(&d.label) {
                break 'levels;
            }
            let weights = d.bindings[1].buffer;
            let skip = usize::from(d.label.starts_with("chain") && !chain_inner);
            for w in d.bindings[1..]
                .iter()
                .filter(|b| b.buffer == weights)
                .skip(skip)
            {
                if out.len() == 8 {
                    break 'levels;
                }
                // A vector beside the matrices (a norm weight: a sixteenth of the first matrix
                // or less) is read past the budget and not counted.
                let norm = w.size * 16 <= d.bindings[1].size;
                let size = if norm { w.size } else { w.size.min(left) } / 32 * 32;
                if size > 0 {
                    out.push(Slice { size, ..*w });
                    if !norm {
                        left -= size;
                    }
                }
            }
        }
    }
    out
}

fn check(name: &str, budget: u64, chain_inner: bool) {
    let (device, log) = validated_device();
    let want = expected(name);
    let opts = FuseOptions {
        prefetch: Some(Prefetch {
            budget,
            min: 0,
            chain_inner,
        }),
        // The weight prefetch alone (check_kv below has the K/V one).
        kv_prefetch: Some(KvPrefetch::NONE),
        ..FuseOptions::default()
    };
    let (model, schedule, _) = fused_schedule_with(name, &opts);
    let (_, plain, _) = fused_schedule(name);
    assert_eq!(schedule.levels.len(), plain.levels.len(), "{name}: levels");

    let mut prefetches = 0;
    for (i, l) in schedule.levels.iter().enumerate() {
        let ds = &schedule.dispatches[l.start as usize..l.end as usize];
        for d in ds.iter().filter(|d| d.label.starts_with("prefetch")) {
            prefetches += 1;
            assert!(
                !ds.iter().any(|d| streams(&d.label)),
                "{name}: level {i}: a prefetch beside a matvec"
            );
            assert!(
                ds.iter().any(|d| hosts(&d.label)),
                "{name}: level {i}: a prefetch beside no attention block"
            );
            assert_eq!(
                d.bindings[1..],
                next_weights(&schedule, i, budget, chain_inner)[..],
                "{name}: level {i}: the prefetch reads other slices than the next matvecs' weights"
            );
        }
    }
    let attention = schedule
        .dispatches
        .iter()
        .filter(|d| d.label.starts_with("attention"))
        .count();
    assert_eq!(
        prefetches, attention,
        "{name}: {prefetches} prefetches for {attention} attention blocks"
    );

    let replay = Replay::new(Loaded::new(device, schedule, &model.tensors).unwrap()).unwrap();
    matches_transformers(&format!("{name} with prefetch"), replay, &want, &log);
}

/// `replay`'s teacher-forced logits within 5e-3 of transformers', its greedy tokens
/// transformers', and no validation error in `log`.
fn matches_transformers(what: &str, mut replay: Replay, want: &Expected, log: &ValidationLog) {
    let rows = replay_rows(&mut replay, &want.teacher_ids);
    assert_rows_close(what, &rows, &want.teacher_logits, 5e-3);
    let ids = replay_greedy_ids(&mut replay, want);
    assert_eq!(ids, want.greedy_ids, "{what}: greedy tokens");
    assert!(
        log.is_clean(),
        "{what}: validation errors:\n{}",
        log.report()
    );
}

#[test]
fn prefetch_qwen3_tied_whole_levels() {
    check("qwen3-tied", 1 << 20, true);
}

#[test]
fn prefetch_qwen3_tied_without_the_chains_gate_up() {
    // The choice for float weights.
    check("qwen3-tied", 1 << 20, false);
}

#[test]
fn prefetch_llama_gqa_cut_to_the_budget() {
    // 20000 bytes: o_proj's weights (18432) and part of gate/up's.
    check("llama-gqa", 20000, true);
}

/// The K/V prefetch (fuse::kv_prefetch) forced on a fixture (its default leaves tiny models
/// without): one dispatch per attention block whose level `ahead` before its own streams
/// weights (none where it does not), first or last there, binding the block's position, K and
/// V caches; the handoff plan hands the same levels as without it (the dispatch declares
/// itself unordered), and replay, with handoffs on, still matches transformers with the same
/// greedy tokens, validation clean.
fn check_kv(name: &str, choice: KvPrefetch, ahead: usize, first: bool) {
    let (device, log) = validated_device();
    let want = expected(name);
    let opts = FuseOptions {
        kv_prefetch: Some(choice),
        ..FuseOptions::default()
    };
    let (model, schedule, _) = fused_schedule_with(name, &opts);
    let (_, plain, _) = fused_schedule(name);
    assert_eq!(schedule.levels.len(), plain.levels.len(), "{name}: levels");
    let is_kv = |label: &str| label.contains("K and V caches");

    let (mut blocks, mut led) = (0, 0);
    for (b, l) in schedule.levels.iter().enumerate() {
        let ds = &schedule.dispatches[l.start as usize..l.end as usize];
        let Some(block) = ds.iter().find(|d| d.label.starts_with("attention")) else {
            continue;
        };
        blocks += 1;
        let Some(at) = b.checked_sub(ahead) else {
            continue;
        };
        let l = &schedule.levels[at];
        let ds = &schedule.dispatches[l.start as usize..l.end as usize];
        if !ds.iter().any(|d| streams(&d.label)) {
            assert!(
                !ds.iter().any(|d| is_kv(&d.label)),
                "{name}: level {at}: a K/V prefetch beside no streaming level"
            );
            continue;
        }
        led += 1;
        let i = ds
            .iter()
            .position(|d| is_kv(&d.label))
            .unwrap_or_else(|| panic!("{name}: level {at}: no K/V prefetch for block {b}"));
        // Last: after the level's own dispatches (the zero kernels merged after it may follow).
        assert_eq!(
            i == 0,
            first,
            "{name}: level {at}: the K/V prefetch is dispatch {i}"
        );
        let kv = &ds[i];
        assert_eq!(
            kv.bindings[1..],
            [block.bindings[6], block.bindings[4], block.bindings[5]],
            "{name}: level {at}: the K/V prefetch binds other slices than block {b}'s"
        );
    }
    let kvs = schedule
        .dispatches
        .iter()
        .filter(|d| is_kv(&d.label))
        .count();
    assert!(
        blocks > 0 && kvs > 0 && kvs == led,
        "{name}: {kvs} K/V prefetches for {blocks} blocks, {led} of them led by a streaming level"
    );

    let handed = |s: &Schedule| {
        let access = vkfuse_runtime::session::handoff::accesses(s);
        vkfuse_runtime::session::handoff::plan(s, &access).handed
    };
    assert_eq!(
        handed(&schedule),
        handed(&plain),
        "{name}: levels handed over"
    );
    assert!(
        handed(&schedule).iter().any(|&h| h),
        "{name}: no level handed over"
    );

    let loaded = loaded_with_handoffs(&device, schedule, &model.tensors, Handoffs::On);
    let replay = Replay::new(loaded).unwrap();
    matches_transformers(
        &format!("{name} with the K/V prefetch"),
        replay,
        &want,
        &log,
    );
}

#[test]
fn kv_prefetch_qwen3_tied_beside_q_k_v() {
    // 3 slots: the positions past them read no more (KV_LIMIT).
    let choice = KvPrefetch {
        slots: 3,
        lead: Lead::Input,
    };
    check_kv("qwen3-tied", choice, 1, false);
}

#[test]
fn kv_prefetch_llama_gqa_before_q_k_v() {
    // More slots than the cache holds: cut to its capacity. The first block's lead is the
    // embedding's level, which streams no weights: none there.
    let choice = KvPrefetch {
        slots: 1 << 20,
        lead: Lead::BeforeInput,
    };
    check_kv("llama-gqa", choice, 2, true);
}

/// Qwen3-Next's weight prefetch goes beside no linear-attention step (which reads its projection
/// as handoff words and so runs beside that projection's last rows: no host), and a K/V
/// prefetch goes only where its lead level streams weights: beside the gated block's q/k/v
/// (Lead::Input, the 16-bit floats' lead; the block reads q and its gate from that projection
/// with no level of slices between), one per block, and none led by the level before
/// (Lead::BeforeInput: the experts' sum, which streams no matvec's rows). Replay with both
/// prefetches still matches transformers.
#[test]
fn qwen3_next_prefetches_beside_hosts_and_streaming_leads_only() {
    let name = "qwen3-next";
    let opts = |lead| FuseOptions {
        prefetch: Some(Prefetch {
            budget: 1 << 20,
            min: 0,
            chain_inner: true,
        }),
        kv_prefetch: Some(KvPrefetch { slots: 4, lead }),
        ..FuseOptions::default()
    };
    let count = |s: &Schedule, what: &str| {
        s.dispatches
            .iter()
            .filter(|d| d.label.starts_with(what))
            .count()
    };
    let (_, schedule, _) = fused_schedule_with(name, &opts(Lead::Input));
    let mut beside_steps = 0;
    for (i, l) in schedule.levels.iter().enumerate() {
        let ds = &schedule.dispatches[l.start as usize..l.end as usize];
        if ds
            .iter()
            .any(|d| d.label.contains("of the next levels' weights"))
        {
            assert!(
                ds.iter().any(|d| hosts(&d.label)),
                "{name}: level {i}: a weight prefetch beside no host"
            );
            beside_steps += usize::from(
                ds.iter()
                    .any(|d| d.label.starts_with("linear-attention step")),
            );
        }
    }
    assert!(count(&schedule, "linear-attention step") > 0, "{name}");
    assert_eq!(
        beside_steps, 0,
        "{name}: a weight prefetch beside a linear-attention step"
    );
    let is_kv = |s: &Schedule| {
        s.dispatches
            .iter()
            .filter(|d| d.label.contains("K and V caches"))
            .count()
    };
    assert_eq!(
        is_kv(&schedule),
        count(&schedule, "attention"),
        "{name}: a K/V prefetch beside each block's q/k/v"
    );
    // The level before q/k/v is the MoE block's experts' sum, which streams no matvec's rows.
    let (_, before, _) = fused_schedule_with(name, &opts(Lead::BeforeInput));
    assert_eq!(
        is_kv(&before),
        0,
        "{name}: a K/V prefetch beside the experts"
    );

    let (device, log) = validated_device();
    let (model, schedule, _) = fused_schedule_with(name, &opts(Lead::Input));
    let replay = Replay::new(Loaded::new(device, schedule, &model.tensors).unwrap()).unwrap();
    matches_transformers(
        &format!("{name} with both prefetches"),
        replay,
        &expected(name),
        &log,
    );
}

/// Specialization constant 191 is honoured only where it can hold: the prefetch kernel (its
/// sink, binding 0, is all it may write) is unordered; a kernel declaring it that may write
/// another binding is not.
#[test]
fn unordered_is_honoured_only_for_a_kernel_writing_its_sink_alone() {
    use vkfuse_runtime::schedule::KernelDecl;
    let kernel = |src: &str| KernelDecl {
        label: "k".into(),
        spirv: vkfuse_compiler::kernels::compile_source("k", src).unwrap(),
        bindings: 2,
        push_constant_bytes: 0,
        spec_constants: vec![],
        subgroups: None,
    };
    let src = |writes: &str| {
        let access = if writes == "b" { "" } else { "readonly" };
        format!(
            "#version 450\nlayout(local_size_x = 1) in;\n\
             layout(constant_id = 191) const uint UNORDERED = 1;\n\
             layout(set = 0, binding = 0, std430) buffer A {{ uint a[]; }};\n\
             layout(set = 0, binding = 1, std430) {} buffer B {{ uint b[]; }};\n\
             void main() {{ if (UNORDERED != 0u && b[0] == 7u) {{ {writes}[0] = 1u; }} }}\n",
            access
        )
    };
    let (sink_only, other) = (kernel(&src("a")), kernel(&src("b")));
    assert!(
        sink_only.unordered() && other.unordered(),
        "both declare it"
    );
    let (_, mut schedule, _) = fused_schedule("qwen3-tied");
    let first = schedule.kernels.len();
    schedule.kernels.extend([sink_only, other]);
    for (i, d) in schedule.dispatches.iter_mut().take(2).enumerate() {
        d.kernel = vkfuse_runtime::schedule::KernelId((first + i) as u32);
    }
    let access = vkfuse_runtime::session::handoff::accesses(&schedule);
    assert!(access[0].unordered, "the sink-only kernel is unordered");
    assert!(
        !access[1].unordered,
        "a kernel writing binding 1 orders its accesses"
    );
}
