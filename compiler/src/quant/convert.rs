//! Which weights `--weights` converts, and the program retyped accordingly.
//!
//! Converted: every `weight` whose uses are all operand 0 of a `matvec` or an `embedding`, with
//! at least one matvec among them (the projections, lm_head, and the embedding table when
//! lm_head shares it: the gather then dequantises its row), and every expert stack
//! (`weight_stack`) the expert matvecs read, each expert's matrix converted as a matrix of its
//! own (Qwen3-Next's experts: most of its bytes). Kept as stored: norm weights, biases and other
//! vectors; an untied embedding table (read one row per token, not bandwidth-bound); and, for
//! the block formats, matrices and stacks whose input size is not a multiple of 32 (their rows
//! are not whole blocks).

use std::fmt;
use std::str::FromStr;

use crate::ir::{DType, OpKind, Program, Type, ValueId, VerifyError};

/// A weight format `compile-model --weights` converts to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    F16,
    BF16,
    Q8_0,
    Q4_0,
}

impl WeightFormat {
    pub const ALL: [WeightFormat; 4] = [
        WeightFormat::F16,
        WeightFormat::BF16,
        WeightFormat::Q8_0,
        WeightFormat::Q4_0,
    ];

    /// The IR dtype of converted weights.
    pub fn dtype(self) -> DType {
        match self {
            WeightFormat::F16 => DType::F16,
            WeightFormat::BF16 => DType::BF16,
            WeightFormat::Q8_0 => DType::Q8_0,
            WeightFormat::Q4_0 => DType::Q4_0,
        }
    }
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.dtype().name())
    }
}

impl FromStr for WeightFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<WeightFormat, String> {
        WeightFormat::ALL
            .into_iter()
            .find(|w| w.dtype().name() == s)
            .ok_or_else(|| format!("unknown weight format `{s}`: expected f16, bf16, q8_0 or q4_0"))
    }
}

/// A matrix weight `convert` left as stored, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Kept {
    pub name: String,
    pub ty: Type,
    pub reason: String,
}

/// What [`convert`] did.
#[derive(Clone, Debug, PartialEq)]
pub struct ConversionReport {
    pub format: WeightFormat,
    /// Converted weights: name and type before.
    pub converted: Vec<(String, Type)>,
    pub kept: Vec<Kept>,
}

impl ConversionReport {
    /// Bytes of the converted weights before and after.
    pub fn bytes(&self) -> (usize, usize) {
        let before = self.converted.iter().map(|(_, t)| t.bytes()).sum();
        let after = self
            .converted
            .iter()
            .map(|(_, t)| Type::new(self.format.dtype(), t.shape.dims()).bytes())
            .sum();
        (before, after)
    }

    /// One line: `q8_0: 197 matrices (1.19 GB -> 0.63 GB); kept as stored: 2 (2: input size
    /// not a multiple of 32)` (`30 matrices and 12 expert stacks` where stacks were converted),
    /// or that every matrix was in the format already.
    pub fn summary(&self) -> String {
        let (before, after) = self.bytes();
        let mut s = if self.converted.is_empty() && self.kept.is_empty() {
            format!("{}: every matrix is {0} already", self.format)
        } else {
            let stacks = self
                .converted
                .iter()
                .filter(|(_, t)| t.shape.rank() == 3)
                .count();
            let what = match stacks {
                0 => format!("{} matrices", self.converted.len()),
                n => format!(
                    "{} matrices and {n} expert stacks",
                    self.converted.len() - n
                ),
            };
            format!(
                "{}: {what} ({:.2} MB -> {:.2} MB)",
                self.format,
                before as f64 / 1e6,
                after as f64 / 1e6
            )
        };
        if !self.kept.is_empty() {
            // Each reason once, with how many matrices it kept.
            let mut reasons: Vec<(&str, usize)> = vec![];
            for k in &self.kept {
                match reasons.iter_mut().find(|(r, _)| *r == k.reason) {
                    Some((_, n)) => *n += 1,
                    None => reasons.push((&k.reason, 1)),
                }
            }
            reasons.sort_unstable();
            let reasons: Vec<String> = reasons.iter().map(|(r, n)| format!("{n}: {r}")).collect();
            s += &format!(
                "; kept as stored: {} ({})",
                self.kept.len(),
                reasons.join("; ")
            );
        }
        s
    }
}

impl fmt::Display for ConversionReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "weights: {}", self.summary())?;
        for (name, ty) in &self.converted {
            writeln!(f, "  converted {name}: {ty} -> {}", self.format)?;
        }
        for k in &self.kept {
            writeln!(f, "  kept      {}: {} ({})", k.name, k.ty, k.reason)?;
        }
        Ok(())
    }
}

/// Retypes the weights of `program` that `format` applies to (the module doc says which);
/// the program stays verified.
pub fn convert(
    program: &mut Program,
    format: WeightFormat,
) -> Result<ConversionReport, VerifyError> {
    let target = format.dtype();
    // Every use of every value: (op kind, operand index).
    let mut uses: Vec<Vec<(&OpKind, usize)>> = vec![vec![]; program.values.len()];
    for op in &program.ops {
        for (i, a) in op.args.iter().enumerate() {
            uses[a.index()].push((&op.kind, i));
        }
    }
    let mut retype: Vec<ValueId> = vec![];
    let mut report = ConversionReport {
        format,
        converted: vec![],
        kept: vec![],
    };
    for op in &program.ops {
        let Some(v) = op.result else { continue };
        let ty = program.ty(v);
        let u = &uses[v.index()];
        let is_matvec = |k: &&OpKind| matches!(k, OpKind::Matvec | OpKind::ExpertMatvec);
        match &op.kind {
            OpKind::Weight { name } => {
                let matrix_only = u
                    .iter()
                    .all(|(k, i)| *i == 0 && matches!(k, OpKind::Matvec | OpKind::Embedding));
                if !matrix_only || !u.iter().any(|(k, _)| is_matvec(k)) {
                    continue;
                }
                let cols = ty.shape.last();
                if target.is_quantized() && !cols.is_multiple_of(DType::BLOCK) {
                    report.kept.push(Kept {
                        name: name.clone(),
                        ty: ty.clone(),
                        reason: format!("input size not a multiple of {}", DType::BLOCK),
                    });
                } else if ty.dtype != target {
                    report.converted.push((name.clone(), ty.clone()));
                    retype.push(v);
                }
            }
            // Only where expert matvecs alone read it (as the matrices: a stack read otherwise
            // stays as stored).
            OpKind::WeightStack { pattern, .. }
                if !u.is_empty()
                    && u.iter()
                        .all(|(k, i)| *i == 0 && matches!(k, OpKind::ExpertMatvec))
                    && ty.dtype != target =>
            {
                if target.is_quantized() && !ty.shape.last().is_multiple_of(DType::BLOCK) {
                    report.kept.push(Kept {
                        name: pattern.clone(),
                        ty: ty.clone(),
                        reason: format!("input size not a multiple of {}", DType::BLOCK),
                    });
                } else {
                    report.converted.push((pattern.clone(), ty.clone()));
                    retype.push(v);
                }
            }
            _ => {}
        }
    }
    for v in retype {
        program.values[v.index()].dtype = target;
    }
    program.verify()?;
    Ok(report)
}
