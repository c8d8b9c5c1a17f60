//! The fusion report (`--explain`): ops in the trace → dispatches per token, the templates and
//! their instance counts, every unit's fused kernels with the ops each covers, why each fusion
//! was taken, and every rule match a condition refused.

use super::codegen::{ExpertSpec, MatvecSpec, Routing};
use super::program::{plural, FusedUnit, KernelKind};
use super::schedule::{unfused_dispatches, Fused};
use crate::ir::Program;
use std::fmt;
use vkfuse_runtime::schedule::Schedule;

/// What fusion did to one program.
#[derive(Clone, Debug)]
pub struct FusionReport {
    pub trace_ops: usize,
    /// Dispatches of the unfused schedule (one per compute op).
    pub unfused_dispatches: usize,
    /// Dispatches per token of the fused schedule.
    pub dispatches: usize,
    /// Dependency levels per token of the fused schedule.
    pub levels: usize,
    /// Instances per unit, in `units` order.
    pub instances: Vec<usize>,
    pub units: Vec<FusedUnit>,
    /// The arena plan of the fused schedule, when lowering made one.
    pub plan: Option<crate::plan::Plan>,
}

impl FusionReport {
    pub fn new(p: &Program, fused: &Fused, schedule: &Schedule) -> FusionReport {
        let mut instances = vec![0; fused.units.len()];
        for &(u, _) in &fused.sequence {
            instances[u] += 1;
        }
        FusionReport {
            trace_ops: p.ops.len(),
            unfused_dispatches: unfused_dispatches(p),
            dispatches: schedule.dispatches.len(),
            levels: schedule.levels.len(),
            instances,
            units: fused.units.clone(),
            plan: None,
        }
    }

    /// Dispatches per instance of each template unit (label, dispatches, instances).
    pub fn per_template(&self) -> Vec<(String, usize, usize)> {
        self.units
            .iter()
            .zip(&self.instances)
            .filter(|(u, _)| u.label.starts_with('T'))
            .map(|(u, &n)| (u.label.clone(), u.kernels.len(), n))
            .collect()
    }
}

/// Why each fused kernel of `u` was built, in words.
fn reasons(u: &FusedUnit, k: &super::program::UKernel) -> Vec<String> {
    let mut r = vec![];
    let ops = |names: &[&str]| {
        k.covers
            .iter()
            .filter(|&&o| names.contains(&u.op_names[o]))
            .count()
    };
    // Ops that are kernels of their own unfused (reshapes are views).
    let computed = k
        .covers
        .iter()
        .filter(|&&o| u.op_names[o] != "reshape")
        .count();
    match &k.kind {
        KernelKind::Matvec(spec) => {
            matvec_reasons(spec, &mut r, &ops);
            if spec.step {
                r.push(
                    "tail: argmax and position written by the logits' matvec \
                     (argmax-in-matvec: the tail's level goes; the token key it leaves is reset \
                     by a zero dispatch in level 1)"
                        .into(),
                );
            }
        }
        KernelKind::Chain(spec) => {
            // The outer residual add is the chain's own, not the inner epilogue's.
            let outer_add = usize::from(spec.add_in.is_some());
            let inner_ops = |names: &[&str]| {
                ops(names) - if names.contains(&"add") { outer_add } else { 0 }
            };
            matvec_reasons(&spec.inner, &mut r, &inner_ops);
            r.push(format!(
                "matvec chained into the kernel feeding it (chain-matvecs: its level goes; \
                 the output is zeroed by a dispatch in an earlier level{})",
                if spec.add_in.is_some() {
                    ", epilogue add(in0, acc) folded"
                } else {
                    ""
                }
            ));
        }
        KernelKind::Zero { .. } => {}
        KernelKind::Attention(_) => {
            let kinds: Vec<String> = [
                "slice",
                "rms_norm",
                "rope",
                "kv_write",
                "attention",
                "sigmoid",
                "mul",
            ]
                .iter()
                .filter(|k| ops(&[k]) > 0)
                .map(|k| format!("{} {k}", ops(&[k])))
                .collect();
            r.push(format!(
                "attention block ({} in one dispatch)",
                kinds.join(", ")
            ))
        }
        KernelKind::Tail(_) => r.push("tail: argmax and position written on the device".into()),
        KernelKind::ExpertGlu(e) => r.push(format!(
            "experts' gate and up with silu·mul ({computed} ops in one dispatch, stacks packed{})",
            routes_itself(e)
        )),
        KernelKind::ExpertSum(e) => r.push(format!(
            "experts' down, weighting and sum ({computed} ops in one dispatch{})",
            routes_itself(e)
        )),
        KernelKind::Route(_) => r.push(format!(
            "router ({computed} ops in one dispatch; the experts read the chosen indices on the device)"
        )),
        KernelKind::Gdn(_) => r.push(format!(
            "linear-attention step ({computed} ops in one dispatch, both states updated in place)"
        )),
        KernelKind::Elementwise(spec) => {
            if computed > 1 {
                r.push(format!("elementwise chain {} ({computed} ops)", spec.epi));
            }
        }
        KernelKind::InPlace { .. } => {
            r.push("state updated in place (its write_state copy goes)".into())
        }
        KernelKind::Unfused { .. } => {}
    }
    r
}

impl fmt::Display for FusionReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "fusion: {} ops in the trace ({} unfused dispatches) -> {} dispatches per token in {} levels",
            self.trace_ops, self.unfused_dispatches, self.dispatches, self.levels
        )?;
        let per: Vec<String> = self
            .per_template()
            .iter()
            .map(|(l, d, n)| format!("{l} x {n} instances, {d} dispatches each"))
            .collect();
        writeln!(f, "templates: {}", per.join("; "))?;
        if let Some(plan) = &self.plan {
            writeln!(
                f,
                "arena: {} bytes for {} transient values (lower bound {}, naive {})",
                plan.arena_bytes,
                plan.offsets.len(),
                plan.lower_bound,
                plan.naive_bytes
            )?;
        }
        for (u, n) in self.units.iter().zip(&self.instances) {
            writeln!(f)?;
            if *n > 1 {
                writeln!(f, "[{n} instances; ops numbered in the first]")?;
            }
            write!(f, "{u}")?;
            writeln!(
                f,
                "  saturation: {}, {} e-nodes in {} e-classes, {}",
                plural(u.saturation.iterations, "iteration"),
                u.saturation.nodes,
                u.saturation.classes,
                u.saturation.stop
            )?;
            writeln!(
                f,
                "  estimate per instance: {:.2} µs fused vs {:.2} µs unfused",
                u.cost.us, u.unfused.us
            )?;
            for (i, k) in u.kernels.iter().enumerate() {
                for why in reasons(u, k) {
                    writeln!(f, "  taken k{i}: {why}")?;
                }
            }
            for k in &u.kept {
                let at: Vec<String> = k.ops.iter().map(|&o| u.op(o)).collect();
                writeln!(
                    f,
                    "  kept unfused {}: `{}` would cost {:.2} µs (vs {:.2} µs)",
                    at.join(", "),
                    k.fused,
                    k.fused_us,
                    k.chosen_us
                )?;
            }
            // Refusals grouped by rule and reason.
            let mut i = 0;
            while i < u.refusals.len() {
                let r = &u.refusals[i];
                let mut at: Vec<String> = vec![];
                while i < u.refusals.len()
                    && u.refusals[i].rule == r.rule
                    && u.refusals[i].reason == r.reason
                {
                    at.extend(u.refusals[i].ops.iter().map(|&o| u.op(o)));
                    i += 1;
                }
                at.dedup();
                writeln!(
                    f,
                    "  refused {} ({}) at {}",
                    r.rule,
                    r.reason,
                    at.join(", ")
                )?;
            }
        }
        Ok(())
    }
}

/// An expert kernel's word on routing for itself (the router's level saved).
fn routes_itself(e: &ExpertSpec) -> &'static str {
    match e.routing {
        Routing::Read => "",
        Routing::Own { .. } => "; each workgroup routes from the logits, no router level",
    }
}

/// The fusions a matvec-family kernel took.
fn matvec_reasons(spec: &MatvecSpec, r: &mut Vec<String>, ops: &dyn Fn(&[&str]) -> usize) {
    if spec.norm.is_some() {
        r.push("norm -> matvec (norm-into-matvec: the norm's dispatch and level go)".into());
    }
    if spec.part_rows.len() > 1 {
        r.push(format!(
            "{} matvecs on one input merged (merge-matvecs{})",
            spec.part_rows.len(),
            if spec.zipped {
                ", zip-parts"
            } else if spec.epi.part_counts().is_empty() {
                ""
            } else {
                ", an epilogue per part"
            }
        ));
    }
    if !spec.epi.is_identity() {
        r.push(format!(
            "epilogue {} folded ({})",
            spec.epi,
            plural(ops(&["add", "mul", "silu", "sigmoid"]), "elementwise op")
        ));
    }
}
