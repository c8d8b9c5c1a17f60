//! Checks a schedule before anything touches the device: every id resolves, every slice lies
//! inside its buffer, dispatches match their kernels, levels cover the dispatches in order.

use super::{BufferRole, Schedule, Slice, TokenEncoding};

/// A schedule that cannot be run, and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScheduleError {
    /// A reference to a table entry that does not exist, or a range out of bounds.
    #[error("invalid schedule: {0}")]
    Invalid(String),
}

fn check_slice(
    s: &Schedule,
    slice: &Slice,
    what: &dyn Fn() -> String,
) -> Result<(), ScheduleError> {
    let buf = s.buffers.get(slice.buffer.index()).ok_or_else(|| {
        ScheduleError::Invalid(format!(
            "{}: buffer {} does not exist",
            what(),
            slice.buffer
        ))
    })?;
    let end = slice.offset.checked_add(slice.size);
    if end.is_none_or(|e| e > buf.size) {
        return Err(ScheduleError::Invalid(format!(
            "{}: bytes {}..+{} lie outside buffer {} `{}` of {} bytes",
            what(),
            slice.offset,
            slice.size,
            slice.buffer,
            buf.label,
            buf.size
        )));
    }
    Ok(())
}

fn check_workgroups(groups: &[u32; 3], what: &dyn Fn() -> String) -> Result<(), ScheduleError> {
    match groups.contains(&0) {
        true => Err(ScheduleError::Invalid(format!(
            "{}: empty workgroup count {groups:?}",
            what()
        ))),
        false => Ok(()),
    }
}

impl Schedule {
    /// Checks every cross-reference and bound; the error names the culprit.
    pub fn validate(&self) -> Result<(), ScheduleError> {
        let invalid = |m: String| Err(ScheduleError::Invalid(m));
        if self.meta.vocab_size == 0 || self.meta.max_context == 0 {
            return invalid("vocab_size and max_context must be positive".into());
        }
        for (i, w) in self.weights.iter().enumerate() {
            check_slice(self, &w.dst, &|| {
                format!("weight upload {i} `{}`", w.tensor)
            })?;
            if self.buffer(w.dst.buffer).role != BufferRole::Weights {
                return invalid(format!(
                    "weight upload `{}` targets a buffer that holds no weights",
                    w.tensor
                ));
            }
        }
        for (i, k) in self.kernels.iter().enumerate() {
            if let Some(n) = k.subgroups {
                if k.spec_constants.is_empty() || !(1..=super::MAX_WORKGROUP_SUBGROUPS).contains(&n)
                {
                    return invalid(format!(
                        "kernel {i} `{}`: a workgroup of {n} subgroups (1..={}), chosen at load, \
                         needs specialization constant 0",
                        k.label,
                        super::MAX_WORKGROUP_SUBGROUPS
                    ));
                }
            }
        }
        let regions = self.persistent.iter().enumerate().map(|(i, r)| {
            (
                format!("persistent region {i} ({})", r.dispatch.label),
                &r.dispatch,
            )
        });
        let plain = self
            .dispatches
            .iter()
            .enumerate()
            .map(|(i, d)| (format!("dispatch {i} ({})", d.label), d));
        for (name, d) in plain.chain(regions) {
            let what = || name.clone();
            let k = self.kernels.get(d.kernel.index()).ok_or_else(|| {
                ScheduleError::Invalid(format!("{}: kernel {} does not exist", what(), d.kernel))
            })?;
            if d.bindings.len() != k.bindings as usize {
                return invalid(format!(
                    "{}: {} bindings, kernel `{}` has {}",
                    what(),
                    d.bindings.len(),
                    k.label,
                    k.bindings
                ));
            }
            if d.push_constants.len() != k.push_constant_bytes as usize {
                return invalid(format!(
                    "{}: {} push-constant bytes, kernel `{}` declares {}",
                    what(),
                    d.push_constants.len(),
                    k.label,
                    k.push_constant_bytes
                ));
            }
            check_workgroups(&d.workgroups, &what)?;
            for b in &d.bindings {
                check_slice(self, b, &what)?;
            }
            // Profiles pair dispatches by their ops (`Dispatch::ops`): each named once.
            if d.ops.windows(2).any(|w| w[0] >= w[1]) {
                return invalid(format!(
                    "{}: its ops {:?} are not strictly ascending",
                    what(),
                    d.ops
                ));
            }
        }
        let mut next = 0u32;
        for l in &self.levels {
            if l.start != next || l.end <= l.start {
                return invalid(format!(
                    "levels must cover the dispatches in order; level {l:?} after {next}"
                ));
            }
            next = l.end;
        }
        if next as usize != self.dispatches.len() {
            return invalid(format!(
                "levels cover {next} of {} dispatches",
                self.dispatches.len()
            ));
        }
        let mut free = 0u32;
        for (i, r) in self.persistent.iter().enumerate() {
            if r.levels.start < free
                || r.levels.end < r.levels.start + 2
                || r.levels.end as usize > self.levels.len()
            {
                return invalid(format!(
                    "persistent region {i}: levels {:?} must be two or more of the {} levels, \
                     after the previous region's",
                    r.levels,
                    self.levels.len()
                ));
            }
            free = r.levels.end;
        }
        self.validate_alternatives()?;
        let io = &self.io;
        for (name, s, min) in [
            ("token", io.token, io.token_encoding.bytes()),
            ("position", io.position, 4),
            ("logits", io.logits, 4 * self.meta.vocab_size as u64),
        ] {
            check_slice(self, &s, &|| format!("io {name}"))?;
            if self.buffer(s.buffer).role != BufferRole::Io || s.size < min {
                return invalid(format!(
                    "io {name} must be a host-visible slice of at least {min} bytes"
                ));
            }
        }
        // The key's 64-bit atomics need it 8-aligned.
        if io.token_encoding == TokenEncoding::Key && io.token.offset % 8 != 0 {
            return invalid(format!(
                "io token: a key must start at a multiple of 8 bytes, not {}",
                io.token.offset
            ));
        }
        // Both backends copy the token and the logits out of one buffer.
        if io.logits.buffer != io.token.buffer {
            return invalid("io token and io logits must lie in one buffer".into());
        }
        Ok(())
    }

    /// Each dispatch's alternatives (after the levels and regions are checked): none in or on a
    /// persistent region, ascending positions, existing kernels interchangeable with the
    /// dispatch's own (so that the descriptor set, the push constants and the handoff plan made
    /// for the dispatch serve them too), and grids that are not empty.
    fn validate_alternatives(&self) -> Result<(), ScheduleError> {
        let invalid = |m: String| Err(ScheduleError::Invalid(m));
        // A region's dispatch replaces levels whose grids it chose itself.
        for (i, r) in self.persistent.iter().enumerate() {
            if !r.dispatch.alternatives.is_empty() {
                return invalid(format!(
                    "persistent region {i} ({}): alternative grids on a region's dispatch",
                    r.dispatch.label
                ));
            }
            let levels = &self.levels[r.levels.start as usize..r.levels.end as usize];
            let inside = levels[0].start as usize..levels[levels.len() - 1].end as usize;
            for (k, d) in self.dispatches[inside.clone()].iter().enumerate() {
                if !d.alternatives.is_empty() {
                    return invalid(format!(
                        "dispatch {} ({}): alternative grids inside persistent region `{}`, \
                         whose dispatch would replace them",
                        inside.start + k,
                        d.label,
                        r.dispatch.label
                    ));
                }
            }
        }
        // Replay records every step once per band.
        let bands = self.bands().len();
        if bands > super::MAX_BANDS {
            return invalid(format!(
                "{bands} bounds of alternative grids, more than the {} bands replay records",
                super::MAX_BANDS
            ));
        }
        for (i, d) in self.dispatches.iter().enumerate() {
            if d.alternatives.is_empty() {
                continue;
            }
            let own = &self.kernels[d.kernel.index()];
            let mut after = 0u32;
            for a in &d.alternatives {
                let what = || format!("dispatch {i} ({}), alternative below {}", d.label, a.below);
                if a.below <= after {
                    return invalid(format!(
                        "{}: positions must be positive and ascending",
                        what()
                    ));
                }
                after = a.below;
                let Some(k) = self.kernels.get(a.kernel.index()) else {
                    return invalid(format!("{}: kernel {} does not exist", what(), a.kernel));
                };
                if k.bindings != own.bindings
                    || k.push_constant_bytes != own.push_constant_bytes
                    || k.handoff_role() != own.handoff_role()
                    || k.written_bindings() != own.written_bindings()
                {
                    return invalid(format!(
                        "{}: kernel `{}` does not bind, take push constants, hand off and write \
                         as the dispatch's `{}` does",
                        what(),
                        k.label,
                        own.label
                    ));
                }
                check_workgroups(&a.workgroups, &what)?;
            }
        }
        Ok(())
    }
}
