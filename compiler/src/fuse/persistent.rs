//! Persistent regions: runs of consecutive dependency levels made only of matvec-family
//! kernels become ONE dispatch whose workgroups stay resident and meet at a grid barrier in
//! device memory between levels, instead of a pipeline barrier (kernels/glsl/persistent.glsl).
//!
//! The region is offered, not imposed: the schedule keeps the levels, and the runtime applies
//! the region only where the device says how many workgroups it keeps resident at once
//! (`Schedule::with_persistent`). Each member is the same matvec body as its own kernel
//! (`codegen::persistent_member`), with its constants folded and its names renamed, so a row
//! is computed by the same arithmetic either way.
//!
//! In a dense layer the matvec levels are o_proj → gate/up → down → the next layer's q/k/v:
//! four levels between two attention blocks become one dispatch with three grid barriers.

use super::codegen::{persistent_member, Generated, MatvecSpec};
use crate::lower::SpirvCache;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::ops::Range;
use vkfuse_runtime::schedule::{Dispatch, KernelDecl, KernelId, Persistent, Schedule, Slice};

/// Bindings one region may use (the grid barrier's included): far below any GPU's
/// `maxPerStageDescriptorStorageBuffers`; longer runs are cut.
pub const MAX_BINDINGS: usize = 32;

/// A matvec kernel of the schedule: its spec and generated source.
pub type MatvecKernels = HashMap<KernelId, (MatvecSpec, Generated)>;

/// Runs of two or more consecutive levels whose dispatches are all matvecs of one workgroup
/// size, cut where a run would bind more than [`MAX_BINDINGS`] buffers.
pub fn find_in(
    dispatches: &[Dispatch],
    levels: &[Range<u32>],
    matvecs: &MatvecKernels,
) -> Vec<Range<u32>> {
    let wg_of = |d: &Dispatch| matvecs.get(&d.kernel).map(|(_, g)| g.spec_constants[0]);
    let level_wg = |l: &Range<u32>| -> Option<(u32, usize)> {
        let ds = &dispatches[l.start as usize..l.end as usize];
        let wg = wg_of(&ds[0])?;
        let bindings = ds.iter().map(|d| d.bindings.len()).sum();
        ds.iter()
            .all(|d| wg_of(d) == Some(wg))
            .then_some((wg, bindings))
    };
    let mut runs = vec![];
    let mut start: Option<(u32, u32, usize)> = None; // (first level, wg, bindings so far)
    for (i, l) in levels.iter().enumerate() {
        let i = i as u32;
        let this = level_wg(l);
        start = match (start, this) {
            (Some((first, wg, n)), Some((w, b))) if w == wg && n + b <= MAX_BINDINGS => {
                Some((first, wg, n + b))
            }
            (open, next) => {
                if let Some((first, _, _)) = open {
                    if i - first >= 2 {
                        runs.push(first..i);
                    }
                }
                next.filter(|&(_, b)| 1 + b <= MAX_BINDINGS)
                    .map(|(w, b)| (i, w, 1 + b))
            }
        };
    }
    if let Some((first, _, _)) = start {
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

/// The region's GLSL, its label, its widest level's virtual workgroups and its workgroup size.
fn region_source(
    s: &Schedule,
    matvecs: &MatvecKernels,
    run: &Range<u32>,
) -> (String, String, u32, u32) {
    let mut members = String::new();
    let mut body = String::new();
    let mut binding = 1;
    let mut m = 0;
    let mut widest = 1;
    let mut wg = 0;
    let mut shapes = vec![];
    for l in run.clone() {
        let level = s.levels[l as usize].clone();
        if l > run.start {
            body += "    grid_barrier();\n";
        }
        // The level's members share one range of virtual workgroups, member after member.
        let mut calls = vec![];
        let mut end = 0;
        for d in &s.dispatches[level.start as usize..level.end as usize] {
            let (spec, gen) = &matvecs[&d.kernel];
            wg = gen.spec_constants[0];
            let (text, groups) = persistent_member(spec, gen, m, binding);
            members += &text;
            calls.push((m, end, end + groups));
            shapes.push(spec.describe());
            end += groups;
            binding += d.bindings.len();
            m += 1;
        }
        widest = widest.max(end);
        let _ = writeln!(
            body,
            "    for (uint g = gl_WorkGroupID.x; g < {end}u; g += gl_NumWorkGroups.x) {{"
        );
        for (i, (m, from, to)) in calls.iter().enumerate() {
            let cond = if i + 1 == calls.len() {
                String::new()
            } else {
                format!("if (g < {to}u) ")
            };
            let els = if i == 0 { "        " } else { " else " };
            let _ = write!(
                body,
                "{els}{cond}{{ mv_vgroup = g - {from}u; mv_main_{m}(); }}"
            );
        }
        // The next virtual workgroup reuses the shared memory the body's reductions filled.
        body += "\n        barrier();\n    }\n";
    }
    let label = format!(
        "persistent[{} levels: {}]",
        run.end - run.start,
        shapes.join(" | ")
    );
    let mut src = String::from("#version 450\n#extension GL_GOOGLE_include_directive : require\n");
    let _ = writeln!(src, "// Generated by vkfuse (fuse::persistent): {label}");
    src += "#include \"common.glsl\"\n#define MV_PERSISTENT 1\n#define MV_COHERENT coherent\n";
    src += "#include \"persistent.glsl\"\n";
    src += &members;
    src += "\nvoid main() {\n";
    src += &body;
    src += "}\n";
    (src, label, widest, wg)
}
