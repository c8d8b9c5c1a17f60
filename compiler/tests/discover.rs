//! Layer templates are discovered from the flat trace, not from names: dense models yield one
//! template (one instance per layer), Qwen3-Next one per layer kind; renaming and permuting
//! every tensor and state name changes nothing.

use std::path::Path;
use vkfuse_compiler::fuse::discover;
use vkfuse_compiler::ir::{OpKind, Program};
use vkfuse_compiler::{import, trace};

fn fixture(name: &str) -> Program {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/models")
        .join(name);
    let model = import::load(&dir).unwrap();
    trace::trace(&model, &trace::TraceOptions::default()).unwrap()
}

fn counts(p: &Program) -> Vec<usize> {
    discover(p)
        .templates
        .iter()
        .map(|t| t.instances.len())
        .collect()
}

#[test]
fn should_find_one_layer_template_per_dense_model() {
    assert_eq!(counts(&fixture("qwen3-tied")), [2]);
    assert_eq!(counts(&fixture("qwen3-untied")), [3]);
    assert_eq!(counts(&fixture("llama-gqa")), [2]);
}

#[test]
fn should_find_linear_and_full_attention_templates_in_qwen3_next() {
    let p = fixture("qwen3-next");
    let s = discover(&p);
    assert_eq!(counts(&p), [3, 1]);
    let kinds = |t: usize| -> Vec<&str> {
        s.instances[s.templates[t].instances[0]]
            .ops
            .clone()
            .map(|i| p.ops[i].kind.name())
            .collect()
    };
    assert!(kinds(0).contains(&"delta_rule_update") && !kinds(0).contains(&"attention"));
    assert!(kinds(1).contains(&"attention") && !kinds(1).contains(&"delta_rule_update"));
}

/// Every name scrambled: tensor names reversed and their layer numbers permuted, states renamed.
fn scrambled(p: &Program) -> Program {
    let mut q = p.clone();
    for op in &mut q.ops {
        match &mut op.kind {
            OpKind::Weight { name } => {
                let permuted = name
                    .replace("layers.0.", "layers.X.")
                    .replace("layers.1.", "layers.0.")
                    .replace("layers.X.", "layers.1.");
                *name = format!("renamed/{}", permuted.chars().rev().collect::<String>());
            }
            OpKind::WeightStack { pattern, .. } => *pattern = format!("zz.{{}}.{}", pattern.len()),
            _ => {}
        }
    }
    for (i, s) in q.states.iter_mut().enumerate() {
        s.name = format!("s{}", 97 * i % 13);
    }
    q
}

#[test]
fn should_find_the_same_templates_when_names_are_renamed_or_shuffled() {
    for name in ["qwen3-tied", "qwen3-untied", "llama-gqa", "qwen3-next"] {
        let p = fixture(name);
        let q = scrambled(&p);
        assert_ne!(p.to_string(), q.to_string());
        assert_eq!(discover(&p), discover(&q), "{name}");
    }
}

#[test]
fn should_find_the_repeats_of_a_hand_written_trace() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/traces");
    let text = std::fs::read_to_string(dir.join("toy3.ir")).unwrap();
    let p = vkfuse_compiler::ir::parse(&text).unwrap();
    assert_eq!(counts(&p), [3]);
}

#[test]
fn segmentation_snapshots() {
    for name in ["qwen3-tied", "qwen3-untied", "llama-gqa", "qwen3-next"] {
        insta::assert_snapshot!(
            format!("templates-{name}"),
            discover(&fixture(name)).to_string()
        );
    }
}
