//! A program that embeds vkfuse: open a schedule file, feed prompt ids, stream greedy ids and
//! the per-token counters.
//!
//! ```sh
//! ./target/release/compile-model fixtures/models/qwen3-tied -o /tmp/qwen3.vkf
//! cargo run --release -p vkfuse-runtime --example embed -- /tmp/qwen3.vkf 303,211,294,53 16
//! ```
//!
//! Arguments: the schedule file, comma-separated prompt ids, and how many ids to generate
//! (default 16); `VKFUSE_DEVICE` picks the device. Output: one line per generated id (the id,
//! the tokens in the KV cache when it was read, the device work since the previous line), then
//! the per-token figures. `tests/embed_api.rs` runs [`decode`] against transformers' tokens.

use std::io::{self, Write};
use std::process::ExitCode;

use vkfuse_runtime::{Counters, Session, SessionOptions};

type Error = Box<dyn std::error::Error>;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [path, ids, rest @ ..] = args.as_slice() else {
        return Err("usage: embed FILE.vkf ID,ID,... [N]".into());
    };
    let prompt = ids
        .split(',')
        .map(|s| s.trim().parse::<u32>())
        .collect::<Result<Vec<u32>, _>>()
        .map_err(|e| format!("prompt ids `{ids}`: {e}"))?;
    let n = match rest {
        [] => 16,
        [n] => n.parse().map_err(|e| format!("N `{n}`: {e}"))?,
        _ => return Err("usage: embed FILE.vkf ID,ID,... [N]".into()),
    };
    let mut session = Session::open(path, &SessionOptions::default())?;
    decode(&mut session, &prompt, n, &mut io::stdout().lock())?;
    Ok(())
}

/// Feeds `prompt`, then writes up to `n` greedy ids as they arrive (stopping after an EOS id)
/// with the counters of each, and the per-token summary; returns the generated ids.
pub fn decode(
    session: &mut Session,
    prompt: &[u32],
    n: usize,
    out: &mut dyn Write,
) -> Result<Vec<u32>, Error> {
    let meta = session.meta();
    writeln!(
        out,
        "{} on {}: vocab {}, context {}, {:?}",
        meta.architecture,
        session.device().info().name,
        meta.vocab_size,
        meta.max_context,
        session.backend()
    )?;
    session.feed(prompt)?;
    let mut ids = Vec::with_capacity(n);
    let mut before = session.counters();
    let mut generate = session.generate(n).stop_at_eos();
    while let Some(id) = generate.next() {
        let id = id?;
        ids.push(id);
        // The iterator borrows the session; counters are read between tokens through it.
        let now = generate.session().counters();
        let d = now.since(&before);
        writeln!(
            out,
            "{id:>8}  kv {:>5}  +{} steps: {} dispatches, {} barriers, {} descriptor writes, \
             {} recordings, {} submits",
            generate.session().position()?,
            now.tokens - before.tokens,
            d.dispatches,
            d.barriers,
            d.descriptor_writes,
            d.recordings,
            d.submits
        )?;
        before = now;
    }
    let c: Counters = session.counters();
    let per = c.per_token().ok_or("no step was run")?;
    writeln!(
        out,
        "generated: {}",
        ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
    )?;
    writeln!(
        out,
        "{} steps: {:.1} tokens/s, host {:.1} us, {:.1} dispatches, {:.1} barriers, \
         {:.1} descriptor writes, {:.2} recordings, {:.2} submits per token",
        c.tokens,
        per.tokens_per_s.unwrap_or(0.0),
        per.host_us_per_token,
        per.dispatches_per_token,
        per.barriers_per_token,
        per.descriptor_writes_per_token,
        per.recordings_per_token,
        per.submits_per_token
    )?;
    Ok(ids)
}
