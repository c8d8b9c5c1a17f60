//! The text form of a program: what `--emit-trace` prints, snapshots hold and tests parse back.
//!
//! ```text
//! vkfuse-ir 1
//! state $position: i32[1] position
//! %0: i32[1] = read_state $token
//! %1: bf16[512,64] = weight "model.embed_tokens.weight"
//! %2: f32[64] = embedding %1, %0
//! %3: f32[64] = rms_norm %2, %4 eps=1e-6 zero_centered=false
//! write_state $position, %9
//! output logits = %8
//! ```
//! Lines starting with `;` are comments.

use super::op::OpKind;
use super::program::{OpId, Program, StateKind, ValueId};
use super::types::{DType, F32Attr, Shape, Type};
use super::verify::VerifyError;
use std::collections::HashMap;
use std::fmt::{self, Write};

pub const HEADER: &str = "vkfuse-ir 1";

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParseError {
    #[error("line {line}: {message}")]
    Syntax { line: usize, message: String },
    /// In the message, not also a `source()`: a printed chain would repeat it.
    #[error("line {line}: {error}")]
    Verify { line: usize, error: VerifyError },
}

/// An attribute value as written in the text form.
enum Attr {
    F32(F32Attr),
    Usize(usize),
    Bool(bool),
    Shape(Shape),
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attr::F32(x) => write!(f, "{x}"),
            Attr::Usize(x) => write!(f, "{x}"),
            Attr::Bool(x) => write!(f, "{x}"),
            Attr::Shape(x) => write!(f, "{x}"),
        }
    }
}

/// The attributes of an op kind, in their printed order.
fn attrs(kind: &OpKind) -> Vec<(&'static str, Attr)> {
    use OpKind::*;
    match kind {
        WeightStack { count, .. } => vec![("count", Attr::Usize(*count))],
        RmsNorm { eps, zero_centered } => {
            vec![
                ("eps", Attr::F32(*eps)),
                ("zero_centered", Attr::Bool(*zero_centered)),
            ]
        }
        GatedRmsNorm { eps } | L2Norm { eps } => vec![("eps", Attr::F32(*eps))],
        Rope { theta, rotary_dim } => {
            vec![
                ("theta", Attr::F32(*theta)),
                ("rotary_dim", Attr::Usize(*rotary_dim)),
            ]
        }
        Slice { axis, start, end } => vec![
            ("axis", Attr::Usize(*axis)),
            ("start", Attr::Usize(*start)),
            ("end", Attr::Usize(*end)),
        ],
        Concat { axis } | Sum { axis } => vec![("axis", Attr::Usize(*axis))],
        Reshape { shape } => vec![("shape", Attr::Shape(shape.clone()))],
        Attention { scale } | DeltaRuleReadout { scale } => vec![("scale", Attr::F32(*scale))],
        TopK { k } => vec![("k", Attr::Usize(*k))],
        _ => vec![],
    }
}

fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl Program {
    /// One op as text, without its result (`rope %5, %2 theta=1000000 rotary_dim=64`).
    pub fn op_text(&self, id: OpId) -> String {
        let op = self.op(id);
        let mut s = op.kind.name().to_string();
        let mut sep = " ";
        match &op.kind {
            OpKind::Weight { name } => {
                let _ = write!(s, " {}", quote(name));
            }
            OpKind::WeightStack { pattern, .. } => {
                let _ = write!(s, " {}", quote(pattern));
            }
            OpKind::ReadState { state }
            | OpKind::WriteState { state }
            | OpKind::KvWrite { state } => {
                let name = self
                    .states
                    .get(state.index())
                    .map_or("?", |d| d.name.as_str());
                let _ = write!(s, " ${name}");
                sep = ", ";
            }
            _ => {}
        }
        for a in &op.args {
            let _ = write!(s, "{sep}{a}");
            sep = ", ";
        }
        for (k, v) in attrs(&op.kind) {
            let _ = write!(s, " {k}={v}");
        }
        s
    }

    /// One op as a full line (`%7: f32[4,32] = rope %5, %2 theta=...`).
    pub fn op_line(&self, id: OpId) -> String {
        match self.op(id).result {
            Some(v) => format!("{v}: {} = {}", self.ty(v), self.op_text(id)),
            None => self.op_text(id),
        }
    }
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{HEADER}")?;
        for s in &self.states {
            writeln!(f, "state ${}: {} {}", s.name, s.ty, s.kind.name())?;
        }
        for id in self.op_ids() {
            writeln!(f, "{}", self.op_line(id))?;
        }
        for (name, v) in &self.outputs {
            writeln!(f, "output {name} = {v}")?;
        }
        Ok(())
    }
}

/// A cursor over one line of text.
struct Cursor<'a> {
    s: &'a str,
    line: usize,
}

impl<'a> Cursor<'a> {
    fn err<T>(&self, message: impl Into<String>) -> Result<T, ParseError> {
        Err(ParseError::Syntax {
            line: self.line,
            message: message.into(),
        })
    }
    fn ws(&mut self) {
        self.s = self.s.trim_start();
    }
    fn eat(&mut self, tok: &str) -> bool {
        self.ws();
        if let Some(rest) = self.s.strip_prefix(tok) {
            self.s = rest;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, tok: &str) -> Result<(), ParseError> {
        if self.eat(tok) {
            Ok(())
        } else {
            self.err(format!("expected `{tok}` at `{}`", self.s))
        }
    }
    fn word(&mut self) -> Result<&'a str, ParseError> {
        self.ws();
        let n = self
            .s
            .find(|c: char| !(c.is_ascii_alphanumeric() || "_.-".contains(c)))
            .unwrap_or(self.s.len());
        if n == 0 {
            return self.err(format!("expected a name at `{}`", self.s));
        }
        let (w, rest) = self.s.split_at(n);
        self.s = rest;
        Ok(w)
    }
    fn number(&mut self) -> Result<usize, ParseError> {
        let w = self.word()?;
        w.parse()
            .or_else(|_| self.err(format!("`{w}` is not a whole number")))
    }
    fn value(&mut self) -> Result<ValueId, ParseError> {
        self.expect("%")?;
        Ok(ValueId::new(self.number()?))
    }
    fn string(&mut self) -> Result<String, ParseError> {
        self.expect("\"")?;
        let mut out = String::new();
        let mut chars = self.s.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    self.s = &self.s[i + 1..];
                    return Ok(out);
                }
                '\\' => match chars.next() {
                    Some((_, 'n')) => out.push('\n'),
                    Some((_, c)) => out.push(c),
                    None => break,
                },
                c => out.push(c),
            }
        }
        self.err("unterminated string")
    }
    fn shape(&mut self) -> Result<Shape, ParseError> {
        self.expect("[")?;
        let mut dims = vec![];
        if !self.eat("]") {
            loop {
                dims.push(self.number()?);
                if self.eat("]") {
                    break;
                }
                self.expect(",")?;
            }
        }
        Ok(Shape(dims))
    }
    fn ty(&mut self) -> Result<Type, ParseError> {
        self.ws();
        let n = self.s.find('[').unwrap_or(0);
        let name = &self.s[..n];
        let dtype = DType::from_name(name)
            .map_or_else(|| self.err(format!("unknown dtype `{name}`")), Ok)?;
        self.s = &self.s[n..];
        Ok(Type {
            dtype,
            shape: self.shape()?,
        })
    }
    fn end(&mut self) -> Result<(), ParseError> {
        self.ws();
        if self.s.is_empty() {
            Ok(())
        } else {
            self.err(format!("unexpected `{}`", self.s))
        }
    }
}

/// Parses the text form back into a verified program.
pub fn parse(text: &str) -> Result<Program, ParseError> {
    let mut p = Program::new();
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim()));
    lines
        .by_ref()
        .find(|(_, l)| !l.is_empty() && !l.starts_with(';'))
        .map_or(
            Err(ParseError::Syntax {
                line: 1,
                message: format!("expected the header `{HEADER}`"),
            }),
            |(line, l)| {
                if l == HEADER {
                    Ok(())
                } else {
                    Err(ParseError::Syntax {
                        line,
                        message: format!("expected the header `{HEADER}`, found `{l}`"),
                    })
                }
            },
        )?;
    for (line, l) in lines {
        if l.is_empty() || l.starts_with(';') {
            continue;
        }
        let mut c = Cursor { s: l, line };
        if c.eat("state ") {
            c.expect("$")?;
            let name = c.word()?.to_string();
            c.expect(":")?;
            let ty = c.ty()?;
            let kind_name = c.word()?;
            let kind = StateKind::from_name(kind_name)
                .map_or_else(|| c.err(format!("unknown state kind `{kind_name}`")), Ok)?;
            c.end()?;
            if p.state_by_name(&name).is_some() {
                return c.err(format!("state `${name}` declared twice"));
            }
            p.add_state(name, kind, ty);
        } else if c.eat("output ") {
            let name = c.word()?.to_string();
            c.expect("=")?;
            let v = c.value()?;
            c.end()?;
            if v.index() >= p.values.len() {
                return c.err(format!("output `{name}` names undefined value {v}"));
            }
            p.outputs.push((name, v));
        } else {
            let mut declared = None;
            if c.s.starts_with('%') {
                let v = c.value()?;
                if v.index() != p.values.len() {
                    return c.err(format!(
                        "expected value %{} next, found {v}",
                        p.values.len()
                    ));
                }
                c.expect(":")?;
                declared = Some(c.ty()?);
                c.expect("=")?;
            }
            let kind = parse_op(&mut c, &p, declared.is_some())?;
            let op = OpId::new(p.ops.len());
            let had_result = declared.is_some();
            let (kind, args) = kind;
            if kind.has_result() != had_result {
                return c.err(format!(
                    "`{}` {} a result",
                    kind.name(),
                    if had_result { "has no" } else { "needs" }
                ));
            }
            p.push(kind, args, declared).map_err(|mut e| {
                e.op = op;
                e.text = l.to_string();
                ParseError::Verify { line, error: e }
            })?;
        }
    }
    Ok(p)
}

fn parse_op(
    c: &mut Cursor<'_>,
    p: &Program,
    _has_result: bool,
) -> Result<(OpKind, Vec<ValueId>), ParseError> {
    let name = c.word()?;
    let mut string = None;
    let mut state = None;
    if name == "weight" || name == "weight_stack" {
        string = Some(c.string()?);
    }
    if matches!(name, "read_state" | "write_state" | "kv_write") {
        c.expect("$")?;
        let s = c.word()?;
        state = Some(
            p.state_by_name(s)
                .map_or_else(|| c.err(format!("undeclared state `${s}`")), Ok)?,
        );
        c.eat(",");
    }
    let mut args = vec![];
    loop {
        c.ws();
        if !c.s.starts_with('%') {
            break;
        }
        args.push(c.value()?);
        if !c.eat(",") {
            break;
        }
    }
    let mut at: HashMap<&str, &str> = HashMap::new();
    loop {
        c.ws();
        if c.s.is_empty() {
            break;
        }
        let key = c.word()?;
        c.expect("=")?;
        c.ws();
        let n = if c.s.starts_with('[') {
            c.s.find(']').map_or(c.s.len(), |i| i + 1)
        } else {
            c.s.find(' ').unwrap_or(c.s.len())
        };
        let (v, rest) = c.s.split_at(n);
        c.s = rest;
        at.insert(key, v);
    }
    let line = c.line;
    let mut used = 0;
    let mut get = |k: &str| -> Result<&str, ParseError> {
        used += 1;
        at.get(k).copied().ok_or_else(|| ParseError::Syntax {
            line,
            message: format!("`{name}` needs `{k}=`"),
        })
    };
    let bad = |k: &str, v: &str| ParseError::Syntax {
        line,
        message: format!("bad value `{v}` for `{k}`"),
    };
    let f = |k: &str, v: &str| v.parse::<f32>().map(F32Attr).map_err(|_| bad(k, v));
    let u = |k: &str, v: &str| v.parse::<usize>().map_err(|_| bad(k, v));
    use OpKind::*;
    let kind = match name {
        "weight" => Weight {
            name: string.unwrap_or_default(),
        },
        "weight_stack" => WeightStack {
            pattern: string.unwrap_or_default(),
            count: u("count", get("count")?)?,
        },
        "read_state" | "write_state" | "kv_write" => {
            let state = state.expect("parsed above for these names");
            match name {
                "read_state" => ReadState { state },
                "write_state" => WriteState { state },
                _ => KvWrite { state },
            }
        }
        "embedding" => Embedding,
        "rms_norm" => RmsNorm {
            eps: f("eps", get("eps")?)?,
            zero_centered: get("zero_centered")?
                .parse()
                .map_err(|_| bad("zero_centered", "?"))?,
        },
        "gated_rms_norm" => GatedRmsNorm {
            eps: f("eps", get("eps")?)?,
        },
        "l2_norm" => L2Norm {
            eps: f("eps", get("eps")?)?,
        },
        "matvec" => Matvec,
        "expert_matvec" => ExpertMatvec,
        "add" => Add,
        "mul" => Mul,
        "div" => Div,
        "silu" => Silu,
        "sigmoid" => Sigmoid,
        "softplus" => Softplus,
        "exp" => Exp,
        "neg" => Neg,
        "rope" => Rope {
            theta: f("theta", get("theta")?)?,
            rotary_dim: u("rotary_dim", get("rotary_dim")?)?,
        },
        "slice" => Slice {
            axis: u("axis", get("axis")?)?,
            start: u("start", get("start")?)?,
            end: u("end", get("end")?)?,
        },
        "concat" => Concat {
            axis: u("axis", get("axis")?)?,
        },
        "reshape" => {
            let v = get("shape")?;
            let mut sc = Cursor { s: v, line };
            Reshape { shape: sc.shape()? }
        }
        "attention" => Attention {
            scale: f("scale", get("scale")?)?,
        },
        "causal_conv1d" => CausalConv1d,
        "conv_shift" => ConvShift,
        "delta_rule_update" => DeltaRuleUpdate,
        "delta_rule_readout" => DeltaRuleReadout {
            scale: f("scale", get("scale")?)?,
        },
        "softmax" => Softmax,
        "top_k" => TopK {
            k: u("k", get("k")?)?,
        },
        "gather" => Gather,
        "sum" => Sum {
            axis: u("axis", get("axis")?)?,
        },
        "argmax" => Argmax,
        "increment" => Increment,
        other => return c.err(format!("unknown op `{other}`")),
    };
    if at.len() != used {
        let known: Vec<&str> = attrs(&kind).iter().map(|(k, _)| *k).collect();
        if let Some(k) = at.keys().find(|k| !known.contains(k)) {
            return c.err(format!("`{name}` has no attribute `{k}`"));
        }
    }
    Ok((kind, args))
}
