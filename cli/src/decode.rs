//! `vkfuse run`: teacher-force the prompt, then decode greedily, with any backend.

use crate::metrics::RunReport;
use crate::{Backend, RunArgs};
use anyhow::{bail, Context, Result};
use std::time::Instant;
use vkfuse_compiler::npy::{self, Array2};
use vkfuse_compiler::reference::Reference;
use vkfuse_compiler::{import, trace};

pub fn run(args: &RunArgs) -> Result<()> {
    if args.ids.is_empty() {
        bail!("--ids needs at least one token id");
    }
    let model =
        import::load(&args.model).with_context(|| format!("loading {}", args.model.display()))?;
    let opts = trace::TraceOptions {
        max_context: args.max_context,
    };
    let program = trace::trace(&model, &opts).context("tracing the decode step")?;
    let steps = args.ids.len() + args.max_new_tokens.saturating_sub(1);
    let capacity = trace::max_context(&model, &opts)?;
    if steps > capacity {
        bail!(
            "{} prompt ids + {} new tokens need {steps} positions, more than the KV capacity of {capacity} \
             (raise --max-context)",
            args.ids.len(),
            args.max_new_tokens
        );
    }
    let vocab = model.config.vocab_size;
    if let Some(bad) = args.ids.iter().find(|&&t| t as usize >= vocab) {
        bail!("token id {bad} is outside the vocabulary of {vocab}");
    }

    let Backend::Reference = args.backend;
    let mut engine = Reference::new(&program, &model.tensors);
    let mut logits = Vec::with_capacity(steps * vocab);
    let mut generated = vec![];
    let start = Instant::now();
    for (i, &id) in args.ids.iter().enumerate() {
        let out = engine.step(Some(id))?;
        logits.extend_from_slice(&out.logits);
        if i + 1 == args.ids.len() && args.max_new_tokens > 0 {
            generated.push(out.next_token as u32);
        }
    }
    while generated.len() < args.max_new_tokens {
        let out = engine.step(None)?;
        logits.extend_from_slice(&out.logits);
        generated.push(out.next_token as u32);
    }
    let elapsed = start.elapsed().as_secs_f64();

    if let Some(path) = &args.logits_out {
        let rows = logits.len() / vocab;
        npy::write(
            path,
            &Array2 {
                rows,
                cols: vocab,
                data: logits,
            },
        )?;
    }
    let report = RunReport {
        backend: "reference".into(),
        ids: generated.clone(),
        tokens_per_s: steps as f64 / elapsed.max(1e-9),
        host_us_per_token: elapsed * 1e6 / steps as f64,
        gpu_us_per_token: None,
        dispatches_per_token: 0.0,
        barriers_per_token: 0.0,
        descriptor_writes_per_token: 0.0,
        recordings_per_token: 0.0,
        submits_per_token: 0.0,
    };
    let ids: Vec<String> = generated.iter().map(u32::to_string).collect();
    println!("generated: {}", ids.join(","));
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{steps} tokens in {:.3} s ({:.1} tokens/s, reference backend)",
            elapsed, report.tokens_per_s
        );
    }
    Ok(())
}
