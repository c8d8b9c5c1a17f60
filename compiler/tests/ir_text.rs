//! The IR's text form parses back to an equal program, and the verifier rejects malformed IR
//! with a typed error naming the op.

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use vkfuse_compiler::ir::{
    parse, DType, F32Attr, OpKind, ParseError, Program, Shape, StateKind, Type, ValueId,
    VerifyErrorKind,
};

const SAMPLE: &str = "vkfuse-ir 1
state $token: i32[1] token
state $position: i32[1] position
state $k_cache_0: f32[2,16,8] kv_cache
state $v_cache_0: f32[2,16,8] kv_cache
%0: i32[1] = read_state $token
%1: i32[1] = read_state $position
%2: bf16[10,32] = weight \"model.embed_tokens.weight\"
%3: f32[32] = embedding %2, %0
%4: f16[32] = weight \"norm \\\"quoted\\\"\"
%5: f32[32] = rms_norm %3, %4 eps=1e-6 zero_centered=true
%6: f32[4,8] = reshape %5 shape=[4,8]
%7: f32[4,8] = rope %6, %1 theta=10000.0 rotary_dim=4
%8: f32[2,8] = slice %7 axis=0 start=0 end=2
%9: f32[2,16,8] = kv_write $k_cache_0, %8, %1
%10: f32[2,16,8] = kv_write $v_cache_0, %8, %1
%11: f32[4,8] = attention %7, %9, %10, %1 scale=0.35355338
%12: f32[32] = reshape %11 shape=[32]
%13: f32[10] = matvec %2, %12
%14: i32[1] = argmax %13
write_state $token, %14
%15: i32[1] = increment %1
write_state $position, %15
output logits = %13
";

#[test]
fn sample_program_round_trips_exactly() {
    let p = parse(SAMPLE).expect("sample parses");
    assert_eq!(p.to_string(), SAMPLE);
    assert_eq!(parse(&p.to_string()).unwrap(), p);
}

#[test]
fn f16_kv_caches_round_trip_and_need_an_even_head_dim() {
    let f16 = SAMPLE
        .replace("$k_cache_0: f32[2,16,8]", "$k_cache_0: f16[2,16,8]")
        .replace("$v_cache_0: f32[2,16,8]", "$v_cache_0: f16[2,16,8]")
        .replace("%9: f32[2,16,8]", "%9: f16[2,16,8]")
        .replace("%10: f32[2,16,8]", "%10: f16[2,16,8]");
    let p = parse(&f16).expect("f16 caches parse");
    assert_eq!(p.to_string(), f16);
    // Head_dim 7: an f16 cache is written two elements per word.
    let mut p = Program::new();
    let c = p.add_state("k", StateKind::KvCache, Type::new(DType::F16, [1, 4, 7]));
    let pos = p.add_state("position", StateKind::Position, Type::i32([1]));
    let pos = build(&mut p, OpKind::ReadState { state: pos }, &[]);
    let x = p
        .push(
            OpKind::Weight { name: "x".into() },
            vec![],
            Some(Type::f32([1, 7])),
        )
        .unwrap()
        .unwrap();
    let err = p
        .value(OpKind::KvWrite { state: c }, vec![x, pos])
        .unwrap_err();
    assert!(err.to_string().contains("even head_dim"), "{err}");
}

#[test]
fn comments_and_blank_lines_are_ignored() {
    let text = SAMPLE.replace("%5:", "; a comment\n\n%5:");
    assert_eq!(parse(&text).unwrap().to_string(), SAMPLE);
}

fn parse_err(text: &str) -> ParseError {
    parse(text).expect_err("must be rejected")
}

#[test]
fn parser_rejects_bad_text_with_the_line() {
    let cases = [
        ("vkfuse-ir 2\n", 1, "header"),
        ("vkfuse-ir 1\n%0: f32[4] = frobnicate\n", 2, "unknown op"),
        (
            "vkfuse-ir 1\n%1: f32[4] = weight \"w\"\n",
            2,
            "expected value %0",
        ),
        (
            "vkfuse-ir 1\n%0: q8[4] = weight \"w\"\n",
            2,
            "unknown dtype",
        ),
        ("vkfuse-ir 1\n%0: f32[4] = weight \"w\n", 2, "unterminated"),
        (
            "vkfuse-ir 1\n%0: i32[1] = read_state $nope\n",
            2,
            "undeclared state",
        ),
        (
            "vkfuse-ir 1\n%0: f32[4] = weight \"w\"\n%1: f32[4] = silu %0 eps=1\n",
            3,
            "no attribute",
        ),
        ("vkfuse-ir 1\noutput logits = %3\n", 2, "undefined"),
    ];
    for (text, line, needle) in cases {
        let e = parse_err(text);
        let msg = e.to_string();
        assert!(msg.starts_with(&format!("line {line}:")), "{msg}");
        assert!(msg.contains(needle), "`{msg}` should mention `{needle}`");
    }
}

#[test]
fn parser_reports_type_errors_through_the_verifier() {
    let text = "vkfuse-ir 1\n%0: f32[4,3] = weight \"w\"\n%1: f32[4] = weight \"x\"\n%2: f32[4] = matvec %0, %1\n";
    match parse_err(text) {
        ParseError::Verify {
            line,
            error: source,
        } => {
            assert_eq!(line, 4);
            assert!(
                matches!(source.kind, VerifyErrorKind::OperandType { index: 1, .. }),
                "{source}"
            );
            assert!(source.to_string().contains("matvec %0, %1"), "{source}");
        }
        e => panic!("expected a verify error, got {e}"),
    }
    let declared_wrong = "vkfuse-ir 1\n%0: f32[4] = weight \"w\"\n%1: f32[5] = silu %0\n";
    match parse_err(declared_wrong) {
        ParseError::Verify { error: source, .. } => {
            assert!(
                matches!(source.kind, VerifyErrorKind::DeclaredType { .. }),
                "{source}"
            )
        }
        e => panic!("expected a verify error, got {e}"),
    }
}

fn build(p: &mut Program, kind: OpKind, args: &[ValueId]) -> ValueId {
    p.value(kind, args.to_vec()).unwrap()
}

#[test]
fn verifier_rejects_malformed_programs_naming_the_op() {
    let mut p = Program::new();
    let w = p
        .push(
            OpKind::Weight { name: "w".into() },
            vec![],
            Some(Type::f32([4, 3])),
        )
        .unwrap()
        .unwrap();
    let x = p
        .push(
            OpKind::Weight { name: "x".into() },
            vec![],
            Some(Type::f32([3])),
        )
        .unwrap()
        .unwrap();
    let y = build(&mut p, OpKind::Matvec, &[w, x]);
    build(&mut p, OpKind::Silu, &[y]);
    p.verify().unwrap();

    // Use before definition.
    let mut bad = p.clone();
    bad.ops[2].args[1] = ValueId::new(3);
    let e = bad.verify().unwrap_err();
    assert_eq!(e.op.index(), 2);
    assert!(matches!(e.kind, VerifyErrorKind::UndefinedValue(_)), "{e}");

    // A recorded type that disagrees with inference.
    let mut bad = p.clone();
    bad.values[2] = Type::f32([5]);
    let e = bad.verify().unwrap_err();
    assert_eq!(e.op.index(), 2);
    assert!(
        matches!(e.kind, VerifyErrorKind::DeclaredType { .. }),
        "{e}"
    );

    // Wrong arity.
    let mut bad = p.clone();
    bad.ops[3].args.push(x);
    assert!(matches!(
        bad.verify().unwrap_err().kind,
        VerifyErrorKind::Arity {
            expected: 1,
            got: 2
        }
    ));

    // A state written twice.
    let mut p = Program::new();
    let s = p.add_state("position", StateKind::Position, Type::i32([1]));
    let v = build(&mut p, OpKind::ReadState { state: s }, &[]);
    p.push(OpKind::WriteState { state: s }, vec![v], None)
        .unwrap();
    let mut bad = p.clone();
    bad.ops.push(bad.ops[1].clone());
    let e = bad.verify().unwrap_err();
    assert!(
        matches!(e.kind, VerifyErrorKind::StateWrittenTwice(ref n) if n == "position"),
        "{e}"
    );

    // kv_write on a state that is no KV cache.
    let e = p
        .push(OpKind::KvWrite { state: s }, vec![v, v], None)
        .unwrap_err();
    assert!(matches!(e.kind, VerifyErrorKind::StateKind { .. }), "{e}");
}

#[test]
fn builder_rejects_bad_attributes_and_broadcasts() {
    let mut p = Program::new();
    let a = p
        .push(
            OpKind::Weight { name: "a".into() },
            vec![],
            Some(Type::f32([4, 8])),
        )
        .unwrap()
        .unwrap();
    let b = p
        .push(
            OpKind::Weight { name: "b".into() },
            vec![],
            Some(Type::f32([3])),
        )
        .unwrap()
        .unwrap();
    let e = p.value(OpKind::Add, vec![a, b]).unwrap_err();
    assert!(matches!(e.kind, VerifyErrorKind::Broadcast(..)), "{e}");
    let e = p
        .value(
            OpKind::Slice {
                axis: 1,
                start: 4,
                end: 9,
            },
            vec![a],
        )
        .unwrap_err();
    assert!(e.to_string().contains("out of 0..8"), "{e}");
    let e = p
        .value(
            OpKind::Reshape {
                shape: Shape::new([5, 5]),
            },
            vec![a],
        )
        .unwrap_err();
    assert!(e.to_string().contains("cannot reshape"), "{e}");
    let e = p.value(OpKind::TopK { k: 4 }, vec![b]).unwrap_err();
    assert!(e.to_string().contains("k=4"), "{e}");
}

/// Builds a random valid program: each choice picks an op kind and operands among the values
/// so far; choices whose operands do not fit are skipped (the builder refuses them).
fn random_program(choices: &[(u8, u8, u8, u8)]) -> Program {
    let mut p = Program::new();
    let tok = p.add_state("token", StateKind::Token, Type::i32([1]));
    let pos = p.add_state("position", StateKind::Position, Type::i32([1]));
    let kc = p.add_state("k_cache_0", StateKind::KvCache, Type::f32([2, 16, 4]));
    let vc = p.add_state("v_cache_0", StateKind::KvCache, Type::f32([2, 16, 4]));
    let conv = p.add_state("conv_state_0", StateKind::Conv, Type::f32([6, 3]));
    let rec = p.add_state(
        "recurrent_state_0",
        StateKind::Recurrent,
        Type::f32([4, 2, 3]),
    );
    let mut written = vec![];
    for &(kind, a, b, c) in choices {
        let n = p.values.len().max(1);
        let v = |x: u8| ValueId::new(x as usize % n);
        // A value of exactly type `t` (searching from a random start), else a random one.
        let of = |t: Type, x: u8| {
            (0..p.values.len())
                .map(|i| (i + x as usize) % n)
                .find(|&i| p.values[i] == t)
                .map_or(v(x), ValueId::new)
        };
        let pick = |x: u8, list: &[usize]| list[x as usize % list.len()];
        let dtype = [DType::F32, DType::F16, DType::BF16][c as usize % 3];
        let eps = F32Attr([1e-6, 1e-5, 0.25][a as usize % 3]);
        let (kind, args, declared) = match kind % 34 {
            0 => (OpKind::ReadState { state: tok }, vec![], None),
            1 => (OpKind::ReadState { state: pos }, vec![], None),
            2 => (
                OpKind::ReadState {
                    state: [conv, rec][a as usize % 2],
                },
                vec![],
                None,
            ),
            3 => {
                let mut dims = vec![pick(a, &[1, 2, 3, 4, 6, 8]), pick(b, &[1, 2, 3, 4, 8, 16])];
                if c % 4 == 3 {
                    dims.remove(1);
                }
                let name = format!("w.{}", p.ops.len());
                (
                    OpKind::Weight { name },
                    vec![],
                    Some(Type::new(dtype, dims)),
                )
            }
            4 => {
                let shape = vec![pick(a, &[2, 3, 6]), pick(b, &[4, 6]), pick(c, &[2, 3, 8])];
                (
                    OpKind::WeightStack {
                        pattern: "e.{}.w".into(),
                        count: shape[0],
                    },
                    vec![],
                    Some(Type::new(dtype, shape)),
                )
            }
            5 => (
                OpKind::WriteState {
                    state: [conv, rec, tok, pos][a as usize % 4],
                },
                vec![v(b)],
                None,
            ),
            6 => (
                OpKind::KvWrite {
                    state: [kc, vc][a as usize % 2],
                },
                vec![v(b), v(c)],
                None,
            ),
            7 => (OpKind::Embedding, vec![v(a), v(b)], None),
            8 => (
                OpKind::RmsNorm {
                    eps,
                    zero_centered: b % 2 == 0,
                },
                vec![v(b), v(c)],
                None,
            ),
            9 => (OpKind::GatedRmsNorm { eps }, vec![v(a), v(b), v(c)], None),
            10 => (OpKind::L2Norm { eps }, vec![v(b)], None),
            11 => (OpKind::Matvec, vec![v(a), v(b)], None),
            12 => (OpKind::ExpertMatvec, vec![v(a), v(b), v(c)], None),
            13 => (OpKind::Add, vec![v(a), v(b)], None),
            14 => (OpKind::Mul, vec![v(a), v(b)], None),
            15 => (OpKind::Div, vec![v(a), v(b)], None),
            16 => (OpKind::Silu, vec![v(a)], None),
            17 => (OpKind::Sigmoid, vec![v(a)], None),
            18 => (OpKind::Softplus, vec![v(a)], None),
            19 => (OpKind::Exp, vec![v(a)], None),
            20 => (OpKind::Neg, vec![v(a)], None),
            21 => (
                OpKind::Rope {
                    theta: F32Attr(10000.0 + c as f32),
                    rotary_dim: pick(b, &[2, 4, 8]),
                },
                vec![v(a), v(c)],
                None,
            ),
            22 => (
                OpKind::Slice {
                    axis: b as usize % 2,
                    start: c as usize % 3,
                    end: c as usize % 3 + 1 + a as usize % 2,
                },
                vec![v(a)],
                None,
            ),
            23 => (
                OpKind::Concat {
                    axis: c as usize % 2,
                },
                vec![v(a), v(b)],
                None,
            ),
            24 => {
                let n = p.values.get(a as usize % n).map_or(1, |t| t.shape.numel());
                let shape = if n.is_multiple_of(2) && b.is_multiple_of(2) {
                    vec![2, n / 2]
                } else {
                    vec![n]
                };
                (
                    OpKind::Reshape {
                        shape: Shape::new(shape),
                    },
                    vec![v(a)],
                    None,
                )
            }
            25 => (
                OpKind::Attention {
                    scale: F32Attr(0.5),
                },
                vec![v(a), v(b), v(b), v(c)],
                None,
            ),
            26 => (
                OpKind::CausalConv1d,
                vec![v(a), of(Type::f32([6]), b), of(Type::f32([6, 4]), c)],
                None,
            ),
            27 => (OpKind::ConvShift, vec![v(a), v(b)], None),
            28 => {
                let args = vec![
                    v(a),
                    of(Type::f32([[2, 4][b as usize % 2], 2]), b),
                    of(Type::f32([4, 3]), c),
                    of(Type::f32([4]), a),
                    of(Type::f32([4]), b),
                ];
                (OpKind::DeltaRuleUpdate, args, None)
            }
            29 => (
                OpKind::DeltaRuleReadout {
                    scale: F32Attr(0.75),
                },
                vec![v(a), v(b)],
                None,
            ),
            30 => (OpKind::Softmax, vec![v(a)], None),
            31 => (
                OpKind::TopK {
                    k: 1 + b as usize % 3,
                },
                vec![v(a)],
                None,
            ),
            32 => (
                [OpKind::Gather, OpKind::Sum { axis: 0 }][c as usize % 2].clone(),
                vec![v(a), v(b)][..1 + (c as usize + 1) % 2].to_vec(),
                None,
            ),
            _ => (
                [OpKind::Argmax, OpKind::Increment][c as usize % 2].clone(),
                vec![v(a)],
                None,
            ),
        };
        if let Some(s) = kind
            .state()
            .filter(|_| !matches!(kind, OpKind::ReadState { .. }))
        {
            if written.contains(&s) {
                continue;
            }
            if p.push(kind, args, declared).is_ok() {
                written.push(s);
            }
            continue;
        }
        let _ = p.push(kind, args, declared);
    }
    if let Some(last) = p.values.len().checked_sub(1) {
        p.outputs.push(("logits".into(), ValueId::new(last)));
    }
    p
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn generated_programs_round_trip(choices in prop::collection::vec(any::<(u8, u8, u8, u8)>(), 1..120)) {
        let p = random_program(&choices);
        p.verify().unwrap();
        let text = p.to_string();
        let back = parse(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(&back, &p);
        prop_assert_eq!(back.to_string(), text);
    }
}

#[test]
fn generator_covers_every_op_kind() {
    // Guard against a generator that silently stops producing some ops.
    let mut seen = std::collections::BTreeSet::new();
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strat = prop::collection::vec(any::<(u8, u8, u8, u8)>(), 50..200);
    for _ in 0..3000 {
        let choices = strat.new_tree(&mut runner).unwrap().current();
        for op in &random_program(&choices).ops {
            seen.insert(op.kind.name());
        }
    }
    let missing: Vec<_> = OpKind::NAMES
        .iter()
        .filter(|n| !seen.contains(*n))
        .collect();
    assert!(
        missing.is_empty(),
        "the generator never produced {missing:?}"
    );
}
