//! The schedule's text form, for `vkfuse inspect`, snapshots and reviews: a summary, then every
//! table in full. It never panics, even on a schedule that does not validate.
//!
//! ```text
//! schedule Qwen3ForCausalLM: vocab 151936, max context 4096, eos [151645], tokenizer 11422654 bytes
//!   4 buffers (1.2 GiB), 311 weight uploads (1.1 GiB), 24 kernels, 425 dispatches in 425 levels
//!   needs: subgroup shuffles
//! io: token b1[+0,4] position b1[+4,4] logits b2[+0,607744]
//! buffers:
//!   b0 weights  1191182336 (1.1 GiB)  weights
//! kernels:
//!   k0 matvec_f16: 1234 words of SPIR-V, 3 bindings, 16 push-constant bytes, spec [64]
//! dispatches: 425 in 425 levels (replay puts a barrier between consecutive levels)
//!   level 0
//!     d0 k3 [1,1,1] b0[+0,1024] b3[+0,4] push [1024] embed
//! weights (311 uploads, 1191182336 bytes):
//!   model.embed_tokens.weight -> b0[+0,311164928]
//! ```

use std::fmt;

use super::{Schedule, Slice};

/// The full text dump of `schedule` (its [`Display`](fmt::Display)).
pub fn dump(schedule: &Schedule) -> String {
    schedule.to_string()
}

impl fmt::Display for Slice {
    /// `b3[+offset,size]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[+{},{}]", self.buffer, self.offset, self.size)
    }
}

/// Bytes in the largest binary unit that keeps the number at least 1.
struct Human(u64);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut v = self.0 as f64;
        let mut u = 0;
        while v >= 1024.0 && u + 1 < UNITS.len() {
            v /= 1024.0;
            u += 1;
        }
        if u == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{v:.1} {}", UNITS[u])
        }
    }
}

/// Push constants as little-endian u32 words where they are whole words, else as hex bytes.
struct PushConstants<'a>(&'a [u8]);

impl fmt::Display for PushConstants<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        if self.0.len() % 4 == 0 {
            for (i, w) in self.0.chunks_exact(4).enumerate() {
                let sep = if i == 0 { "" } else { " " };
                write!(f, "{sep}{}", u32::from_le_bytes([w[0], w[1], w[2], w[3]]))?;
            }
        } else {
            for (i, b) in self.0.iter().enumerate() {
                let sep = if i == 0 { "" } else { " " };
                write!(f, "{sep}{b:02x}")?;
            }
        }
        f.write_str("]")
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.meta;
        write!(
            f,
            "schedule {}: vocab {}, max context {}, eos {:?}",
            m.architecture, m.vocab_size, m.max_context, m.eos_token_ids
        )?;
        match &m.tokenizer {
            Some(json) => writeln!(f, ", tokenizer {} bytes", json.len())?,
            None => writeln!(f, ", no tokenizer")?,
        }
        let buffer_bytes: u64 = self.buffers.iter().map(|b| b.size).sum();
        let weight_bytes: u64 = self.weights.iter().map(|w| w.dst.size).sum();
        writeln!(
            f,
            "  {} buffers ({}), {} weight uploads ({}), {} kernels, {} dispatches in {} levels",
            self.buffers.len(),
            Human(buffer_bytes),
            self.weights.len(),
            Human(weight_bytes),
            self.kernels.len(),
            self.dispatches.len(),
            self.levels.len()
        )?;
        // What the device must offer beyond compute (Loaded::load checks it), and the
        // compile-model choice each follows from.
        let needs: Vec<&str> = [
            (
                self.float_atomic_kernel().is_some(),
                "float atomic add (the chained MLPs)",
            ),
            (
                self.int64_atomic_kernel().is_some(),
                "64-bit atomics (the argmax in lm_head)",
            ),
            (self.shuffle_kernel().is_some(), "subgroup shuffles"),
            (
                self.float16_kernel().is_some(),
                "f16 arithmetic (the f16 dots)",
            ),
            (
                self.integer_dot_kernel().is_some(),
                "int8 dot products and subgroups of 8 or more (the int8 dots)",
            ),
        ]
        .into_iter()
        .filter_map(|(on, what)| on.then_some(what))
        .collect();
        match needs.is_empty() {
            true => writeln!(f, "  needs: compute only")?,
            false => writeln!(f, "  needs: {}", needs.join(", "))?,
        }
        let io = &self.io;
        let key = match io.token_encoding {
            super::TokenEncoding::Index => "",
            super::TokenEncoding::Key => " (argmax key)",
        };
        writeln!(
            f,
            "io: token {}{key} position {} logits {}",
            io.token, io.position, io.logits
        )?;

        writeln!(f, "buffers:")?;
        for (i, b) in self.buffers.iter().enumerate() {
            writeln!(
                f,
                "  b{i:<3} {:<8} {:>12} ({})  {}",
                b.role.name(),
                b.size,
                Human(b.size),
                b.label
            )?;
        }

        writeln!(f, "kernels:")?;
        for (i, k) in self.kernels.iter().enumerate() {
            writeln!(
                f,
                "  k{i:<3} {}: {} words of SPIR-V, {} bindings, {} push-constant bytes, spec {:?}{}{}",
                k.label,
                k.spirv.len(),
                k.bindings,
                k.push_constant_bytes,
                k.spec_constants,
                match k.subgroups {
                    Some(n) => format!(", workgroup {n} subgroups (at load)"),
                    None => String::new(),
                },
                handoff_role(k)
            )?;
        }

        let plan = crate::session::handoff::plan(self, &crate::session::handoff::accesses(self));
        let handed: Vec<String> = (0..self.levels.len())
            .filter(|&i| plan.handed[i])
            .map(|i| i.to_string())
            .collect();
        writeln!(
            f,
            "handoffs: {} of {} levels handed over where replay runs them (--handoffs: by default \
             on NVIDIA only){}",
            handed.len(),
            self.levels.len(),
            match handed.is_empty() {
                true => String::new(),
                false => format!(": levels {}", handed.join(", ")),
            }
        )?;

        write!(f, "{}", Regions(self))?;

        writeln!(
            f,
            "weights ({} uploads, {} bytes):",
            self.weights.len(),
            weight_bytes
        )?;
        for w in &self.weights {
            writeln!(f, "  {} -> {}", w.tensor, w.dst)?;
        }
        Ok(())
    }
}

/// The dispatches grouped into their dependency levels (the regions replay puts one barrier
/// between), each with its kernel, workgroups, bindings and the ops it covers: the part of the
/// dump that fusion snapshots and `compile-model --explain` show.
pub struct Regions<'a>(pub &'a Schedule);

impl fmt::Display for Regions<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        writeln!(
            f,
            "dispatches: {} in {} levels (replay puts a barrier between consecutive levels)",
            s.dispatches.len(),
            s.levels.len()
        )?;
        let mut covered = 0usize;
        for (l, range) in s.levels.iter().enumerate() {
            writeln!(f, "  level {l}")?;
            let (start, end) = (range.start as usize, range.end as usize);
            match s.dispatches.get(start..end) {
                Some(ds) => {
                    for (j, d) in ds.iter().enumerate() {
                        write_dispatch(f, start + j, d)?;
                    }
                    covered = covered.max(end);
                }
                None => writeln!(f, "    (dispatches {start}..{end} do not exist)")?,
            }
        }
        if covered < s.dispatches.len() {
            writeln!(f, "  in no level")?;
            for (j, d) in s.dispatches[covered..].iter().enumerate() {
                write_dispatch(f, covered + j, d)?;
            }
        }
        if !s.persistent.is_empty() {
            writeln!(
                f,
                "persistent regions: {} (applied where the device keeps every workgroup \
                 resident: {} levels then)",
                s.persistent.len(),
                s.levels_with_persistent()
            )?;
            for (i, r) in s.persistent.iter().enumerate() {
                write!(f, "    p{i:<4}levels {}..{}", r.levels.start, r.levels.end)?;
                write_call(f, &r.dispatch)?;
            }
        }
        Ok(())
    }
}

fn write_dispatch(f: &mut fmt::Formatter<'_>, i: usize, d: &super::Dispatch) -> fmt::Result {
    write!(f, "    d{i:<4}")?;
    write_call(f, d)
}

fn write_call(f: &mut fmt::Formatter<'_>, d: &super::Dispatch) -> fmt::Result {
    let [x, y, z] = d.workgroups;
    write!(f, " {} [{x},{y},{z}]", d.kernel)?;
    for b in &d.bindings {
        write!(f, " {b}")?;
    }
    if !d.push_constants.is_empty() {
        write!(f, " push {}", PushConstants(&d.push_constants))?;
    }
    write!(f, " {}", d.label)?;
    // The ops it computes, where the label does not list them already (unfused labels name
    // their inputs; fused ones list their ops but for reshapes).
    if !d.ops.is_empty() && !d.label.contains("(#") {
        let ops: Vec<String> = d.ops.iter().map(|o| format!("#{o}")).collect();
        write!(f, " ({})", ops.join(" "))?;
    }
    writeln!(f)?;
    for a in &d.alternatives {
        let [x, y, z] = a.workgroups;
        writeln!(
            f,
            "          below position {}: {} [{x},{y},{z}]",
            a.below, a.kernel
        )?;
    }
    Ok(())
}

/// The handoff role a kernel's SPIR-V declares, for the dump (`kernels/glsl/handoff.glsl`).
fn handoff_role(k: &super::KernelDecl) -> String {
    let Some(role) = k.handoff_role() else {
        return String::new();
    };
    let reads: Vec<String> = role.reads.iter().map(|b| b.to_string()).collect();
    match (role.publishes, reads.is_empty()) {
        (false, true) => ", handoff: none".into(),
        (true, true) => ", handoff: publishes binding 0".into(),
        (false, false) => format!(", handoff: reads bindings {} as words", reads.join(",")),
        (true, false) => format!(
            ", handoff: publishes binding 0, reads bindings {} as words",
            reads.join(",")
        ),
    }
}
