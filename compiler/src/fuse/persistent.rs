//! Persistent regions: runs of consecutive dependency levels made only of matvec-family
//! kernels become ONE dispatch whose workgroups stay resident and meet at a grid barrier in
//! device memory between levels, instead of a pipeline barrier (kernels/glsl/persistent.glsl).
//!
//! The region is offered, not imposed: the schedule keeps the levels, and the runtime applies
//! the region only where the device says how many workgroups it keeps resident at once
//! (`Schedule::with_persistent`). Each level is its fused matvec (the same rows, prologue and
//! epilogue, constants folded, names renamed: `codegen::persistent_member`) in the shape that
//! suits resident workgroups: each owns a share of the rows, and loads its share of a level's
//! weights into registers while it waits at the barrier before it
//! (kernels/glsl/persistent_matvec.glsl).
//!
//! In a dense layer the matvec levels are o_proj → gate/up → down → the next layer's q/k/v:
//! four levels between two attention blocks become one dispatch with three grid barriers.

use super::codegen::{
    persistent_member, persistent_ok, Generated, MatvecSpec, HEADER, PERSISTENT_ROW_CHUNKS,
};
use crate::lower::SpirvCache;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::ops::Range;
use vkfuse_runtime::schedule::{Dispatch, KernelDecl, KernelId, Persistent, Schedule, Slice};

/// Bindings one region may use (the grid barrier's included): far below any GPU's
/// `maxPerStageDescriptorStorageBuffers`; longer runs are cut.
pub const MAX_BINDINGS: usize = 32;
/// The longest matvec input a region stages in shared memory (16 KiB of f32: within lavapipe's
/// 32 KiB and every GPU's); longer inputs keep their levels.
pub const MAX_COLS: usize = 4096;
/// Workgroup size of a region: one workgroup per SM, 32 subgroups of 32 on NVIDIA (the
/// H100's best of 256, 512 and 1024 with [`REGION_PF`] 4).
pub const REGION_WG: u32 = 1024;

/// [`REGION_WG`], or `VKFUSE_REGION_WG` (a power of two in 64..=1024): the A/B knob of the
/// H100 measurements (`bench/h100 persistent`), read at compile time like
/// `VKFUSE_MATVEC_TUNING`. Malformed values are ignored.
fn region_wg() -> u32 {
    std::env::var("VKFUSE_REGION_WG")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|w| w.is_power_of_two() && (64..=1024).contains(w))
        .unwrap_or(REGION_WG)
}

/// 16-byte weight chunks each invocation of a region holds for the next level (registers):
/// on the H100 at workgroup 1024, 4 beat 2, 3 and 8 (fewer registers, and gate/up's second
/// pass costs less than the occupancy more registers would).
pub const REGION_PF: u32 = 4;

/// [`REGION_PF`], or `VKFUSE_REGION_PF` (1..=32), at least what a pass of one
/// [`PERSISTENT_ROW_CHUNKS`]-chunk row needs at workgroup size `wg` (its slots are a quarter
/// of its chunks).
fn region_pf(wg: u32) -> u32 {
    let pf = std::env::var("VKFUSE_REGION_PF")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|p| (1..=32).contains(p))
        .unwrap_or(REGION_PF);
    pf.max((4 * PERSISTENT_ROW_CHUNKS as u32).div_ceil(wg))
}

/// A matvec kernel of the schedule: its spec and generated source.
pub type MatvecKernels = HashMap<KernelId, (MatvecSpec, Generated)>;

/// Runs of two or more consecutive levels that are each ONE matvec persistent_matvec.glsl
/// computes, cut where a run would bind more than [`MAX_BINDINGS`] buffers.
pub fn find_in(
    dispatches: &[Dispatch],
    levels: &[Range<u32>],
    matvecs: &MatvecKernels,
) -> Vec<Range<u32>> {
    // The bindings of a level that can join a region.
    let eligible = |l: &Range<u32>| -> Option<usize> {
        let [d] = &dispatches[l.start as usize..l.end as usize] else {
            return None;
        };
        let (spec, _) = matvecs.get(&d.kernel)?;
        persistent_ok(spec, MAX_COLS).then_some(d.bindings.len())
    };
    let mut runs = vec![];
    let mut open: Option<(u32, usize)> = None; // (first level, bindings so far)
    for (i, l) in levels.iter().enumerate() {
        let i = i as u32;
        open = match (open, eligible(l)) {
            (Some((first, n)), Some(b)) if n + b <= MAX_BINDINGS => Some((first, n + b)),
            (before, next) => {
                if let Some((first, _)) = before {
                    if i - first >= 2 {
                        runs.push(first..i);
                    }
                }
                // A run starts with the grid barrier's binding and this level's.
                next.filter(|&b| b < MAX_BINDINGS).map(|b| (i, 1 + b))
            }
        };
    }
    if let Some((first, _)) = open {
        if levels.len() as u32 - first >= 2 {
            runs.push(first..levels.len() as u32);
        }
    }
    runs
}

/// Adds a persistent region (and its kernel, shared by equal regions) for every run of levels
/// `runs` ([`find_in`]); `sync` is the grid barrier's 8 zeroed bytes.
pub fn add_regions(
    s: &mut Schedule,
    runs: &[Range<u32>],
    matvecs: &MatvecKernels,
    sync: Slice,
    spirv: &mut SpirvCache,
) -> Result<(), crate::kernels::KernelError> {
    let mut kernel_of_source: HashMap<String, KernelId> = HashMap::new();
    for run in runs {
        let (source, label, groups, wg) = region_source(s, matvecs, run);
        let kernel = match kernel_of_source.get(&source) {
            Some(k) => *k,
            None => {
                let id = KernelId(s.kernels.len() as u32);
                let mut bindings = 1;
                for d in dispatches(s, run) {
                    bindings += d.bindings.len();
                }
                s.kernels.push(KernelDecl {
                    label: label.clone(),
                    spirv: spirv.get_source(&label, &source)?,
                    bindings: bindings as u32,
                    push_constant_bytes: 0,
                    spec_constants: vec![wg],
                    subgroups: None,
                });
                kernel_of_source.insert(source, id);
                id
            }
        };
        let mut bindings = vec![sync];
        for d in dispatches(s, run) {
            bindings.extend_from_slice(&d.bindings);
        }
        let members: Vec<&str> = dispatches(s, run).map(|d| d.label.as_str()).collect();
        s.persistent.push(Persistent {
            levels: run.clone(),
            dispatch: Dispatch {
                kernel,
                bindings,
                push_constants: vec![],
                workgroups: [groups, 1, 1],
                label: format!(
                    "persistent region: {} levels, {}",
                    run.end - run.start,
                    members.join(" | ")
                ),
                alternatives: vec![],
                ops: vec![],
            },
        });
    }
    Ok(())
}

/// The dispatches of levels `run`, in order.
fn dispatches<'s>(s: &'s Schedule, run: &Range<u32>) -> impl Iterator<Item = &'s Dispatch> {
    let (a, b) = (
        s.levels[run.start as usize].start as usize,
        s.levels[run.end as usize - 1].end as usize,
    );
    s.dispatches[a..b].iter()
}

/// The region's GLSL, its label, its widest level's rows and its workgroup size.
fn region_source(
    s: &Schedule,
    matvecs: &MatvecKernels,
    run: &Range<u32>,
) -> (String, String, u32, u32) {
    let mut members = String::new();
    let mut body = String::new();
    let mut binding = 1;
    let mut widest = 1;
    let mut max_cols = 8;
    let mut shapes = vec![];
    for (m, d) in dispatches(s, run).enumerate() {
        let (spec, gen) = &matvecs[&d.kernel];
        // Level m's weights load while the workgroup waits for level m - 1 everywhere.
        if m > 0 {
            body += "    grid_arrive();\n";
        }
        let _ = writeln!(body, "    mv_prefetch_{m}();");
        if m > 0 {
            body += "    grid_wait();\n";
        }
        members += &persistent_member(spec, gen, m, binding);
        let _ = writeln!(body, "    mv_main_{m}();");
        shapes.push(spec.describe());
        binding += d.bindings.len();
        widest = widest.max(spec.rows() as u32);
        max_cols = max_cols.max(spec.cols);
    }
    let label = format!(
        "persistent[{} levels: {}]",
        run.end - run.start,
        shapes.join(" | ")
    );
    let mut src = String::from(HEADER);
    let _ = writeln!(src, "// Generated by vkfuse (fuse::persistent): {label}");
    src += "#include \"common.glsl\"\n#include \"reduce.glsl\"\n#include \"fused_epilogue.glsl\"\n";
    let wg = region_wg();
    let _ = writeln!(src, "#define PM_MAX_I {max_cols}");
    let pf = region_pf(wg);
    let _ = writeln!(src, "#define PM_PF {pf}u");
    let each: Vec<String> = (0..pf).map(|k| format!("X({k})")).collect();
    let _ = writeln!(src, "#define PM_EACH_K(X) {}", each.join(" "));
    src += "#include \"persistent.glsl\"\n";
    src += &members;
    src += "\nvoid main() {\n";
    src += &body;
    src += "    grid_exit();\n}\n";
    (src, label, widest, wg)
}
