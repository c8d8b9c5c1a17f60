//! Checks a schedule before anything touches the device: every id resolves, every slice lies
//! inside its buffer, dispatches match their kernels, levels cover the dispatches in order.

use super::{BufferRole, Schedule, Slice};

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
            if d.workgroups.contains(&0) {
                return invalid(format!(
                    "{}: empty workgroup count {:?}",
                    what(),
                    d.workgroups
                ));
            }
            for b in &d.bindings {
                check_slice(self, b, &what)?;
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
        let io = &self.io;
        for (name, s, min) in [
            ("token", io.token, 4),
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
        Ok(())
    }
}
