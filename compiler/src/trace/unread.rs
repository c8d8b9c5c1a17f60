//! The checkpoint tensors a traced decode step does not read: a checkpoint of another model
//! than config.json describes (an `architectures` of Llama over a Qwen3 checkpoint drops its
//! q/k norms and decodes wrongly without a word), reported as transformers reports the weights
//! it did not use when loading.

use std::collections::HashSet;

use crate::import::{layer_of, layout, Model};
use crate::ir::Program;

/// How many of the unread names a warning lists before it counts the rest.
const LISTED: usize = 6;

/// The checkpoint's tensors that `program` (`model`'s decode step) reads from none of its
/// weights, in name order, less those already reported or set aside on purpose: the layers
/// past config.json's `num_hidden_layers` and a tied config's `lm_head.weight`
/// ([`Model::warnings`]), and what transformers itself ignores in a checkpoint (multi-token
/// prediction heads, `mtp.*`; stored rotary tables, `*.rotary_emb.inv_freq`).
pub fn unread_tensors(model: &Model, program: &Program) -> Vec<String> {
    let mut read: HashSet<String> = HashSet::new();
    for name in program
        .ops
        .iter()
        .filter_map(|op| op.kind.tensors())
        .flatten()
    {
        read.extend(layout::sources(&name).into_iter().map(str::to_string));
    }
    let layers = model.config.num_layers;
    model
        .tensors
        .names()
        .filter(|n| !read.contains(*n))
        .filter(|n| !(*n == "lm_head.weight" && model.lm_head_set_aside()))
        .filter(|n| layer_of(n).is_none_or(|l| l < layers))
        .filter(|n| !n.starts_with("mtp.") && !n.ends_with("rotary_emb.inv_freq"))
        .map(str::to_string)
        .collect()
}

/// The warning for [`unread_tensors`], `None` where the step reads every tensor.
pub fn unread_warning(model: &Model, program: &Program) -> Option<String> {
    let unread = unread_tensors(model, program);
    if unread.is_empty() {
        return None;
    }
    let listed = unread[..unread.len().min(LISTED)].join(", ");
    let more = match unread.len().saturating_sub(LISTED) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    Some(format!(
        "{}: {} checkpoint tensor{} not read by the {} decode step (config.json's \
         architectures): {listed}{more}; a checkpoint of another model decodes wrongly, so \
         check architectures",
        model.dir.display(),
        unread.len(),
        if unread.len() == 1 { " is" } else { "s are" },
        model.config.architecture,
    ))
}
