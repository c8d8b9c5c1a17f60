//! Bands of positions: the attention block on other grids while the context is short.
//!
//! The block's grid (splits per head x workgroup size, [`super::codegen::attention_splits`]) is
//! chosen for long contexts, where every split has a chunk to walk. At short positions most of
//! its splits exit at once and the others walk a few dozen slots each: there a smaller grid is
//! faster (fewer workgroups beside the prefetch and the next levels' waiting workgroups), and it
//! is slower once the context is long. Both compute the same values (up to f32 rounding) and
//! are correct at every position, so the compiler gives the block's dispatches alternative
//! kernels for bands of positions (`Dispatch::alternatives`), and the runtime, which knows each
//! step's position, runs the band's grid (docs/perf.md, session 19). Bands asked for that the
//! block cannot take are an error; the defaults keep those it can (`Builder::attention_bands`
//! in `program.rs`).

use super::codegen::ATTENTION_MIN_CHUNK;
use super::prefetch;
use crate::ir::{DType, Program};
use std::fmt;

/// The attention block's grid for the positions below `below` (and not below the band
/// before's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionBand {
    /// The first position the band does not serve.
    pub below: u32,
    /// Splits per query head (at least 2 and at most the block's own, whose scratch it uses).
    pub splits: usize,
    /// Workgroup size (a power of two; raised to the head dim where smaller).
    pub workgroup: u32,
}

impl fmt::Display for AttentionBand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}x{}", self.below, self.splits, self.workgroup)
    }
}

/// The most splits a band combines by polling where it may (handoffs on, a waiter per head
/// resident: `Builder::attention_bands` in `program.rs`); a band of more splits combines as the
/// block's own grid does, the last split to arrive folding the partials. On an H100 (Qwen3-0.6B's
/// shape) the polled 16-split band first cost bf16 830 against 808 µs per step at positions
/// 1024-2048 and q4_0 712 against 706, while the waiter waited on each partial's words in turn;
/// once it polled those still empty again together, polling won there too (bf16 760 against
/// 765, q4_0 651 against 663, q4_0 572 against 589 at 768-1024), and the polled 12-split band
/// of the block formats saves q4_0 560 against 575 below position 768 (docs/perf.md, session
/// 29). Bands of more splits than 16 were not measured.
pub const MAX_POLLED_SPLITS: usize = 16;

/// The bands for a program whose matvec weights are `dtype` and whose block runs `workgroup`
/// invocations: that workgroup with as few splits as keep every split's chunk within two of the
/// fewest slots a split attends ([`ATTENTION_MIN_CHUNK`], 64 slots): 4 splits below position
/// 256, 6 below 384, 8 below 512, and for the block formats 12 below 768, as measured on an H100
/// with Qwen3-0.6B's shape (16 query heads of 128, the block's own grid then 16 splits of 512;
/// docs/perf.md, session 27; 16-bit floats lost 2% with the 12). Fewer splits are fewer
/// partials to combine and fewer workgroups beside the prefetch; past two minimal chunks a
/// split's walk costs more than they save. Against session 24's bands (q4_0
/// `128:4x256,256:8x256,512:8x512`, q8_0 `128:4x256,512:8x512`, 16-bit floats `512:8x512`): GPU
/// time per token at 256 tokens bf16 -0.8%, q8_0 -1.8%, q4_0 -2.8%. Every format also gets 16
/// splits below 2048, which a block of more splits (a cache of 4096 slots) uses there. The
/// block's own workgroup
/// keeps the invocations per head element it was chosen with (a 512-wide band cost a 32-wide
/// head on lavapipe twice the time), except the block formats' first band where the block has
/// more than 4 splits: 4 splits of half the workgroup below position 64, where no split has
/// more than MIN_CHUNK slots and at most two work (Qwen3-0.6B's 32-split block at 256 tokens on
/// an H200: q8_0 +0.32..0.39%, q4_0 +0.37 / +0.53%; below 128 q8_0 the same and q4_0 −0.45%,
/// below 192 or 256 q8_0 −1.1% and −3.9%; bf16 level: docs/perf.md, session 54; a block of 4
/// splits or fewer, which the other bands leave alone, was not measured with it). Where the
/// bands are applied, those with more splits than the block's fall away, and so do trailing
/// ones on the block's own grid; a band that compiles to the next one's kernel merges into it.
/// f32 weights keep one grid.
pub fn for_weights(dtype: DType, workgroup: u32, block_splits: usize) -> Vec<AttentionBand> {
    let band = |chunks: u32, splits: usize| AttentionBand {
        below: chunks * ATTENTION_MIN_CHUNK as u32,
        splits,
        workgroup,
    };
    let short = [band(8, 4), band(12, 6), band(16, 8)];
    // A block of more than 16 splits (a long cache: codegen::attention_splits) keeps 16 below
    // position 2048, where their chunks of 64-128 slots were still faster than 32 splits' 32-64
    // (session 28: bf16 817 against 866 µs per step at 1024-2048, q4_0 710 against 765).
    let long = band(64, 16);
    let half = Some(AttentionBand {
        workgroup: workgroup / 2,
        ..band(2, 4)
    })
    .filter(|h| block_splits > h.splits);
    match dtype {
        DType::Q4_0 | DType::Q8_0 => [half.as_slice(), &short[..], &[band(24, 12), long]].concat(),
        DType::F16 | DType::BF16 => [&short[..], &[long]].concat(),
        DType::F32 | DType::I32 => vec![],
    }
}

/// [`for_weights`] for `program`'s matvec weights ([`prefetch::matvec_dtype`]) and a block of
/// `splits` workgroups of `workgroup` invocations per head.
pub fn for_program(program: &Program, workgroup: u32, splits: usize) -> Vec<AttentionBand> {
    for_weights(prefetch::matvec_dtype(program), workgroup, splits)
}

/// Why a `--attention-bands` text does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("attention bands `{text}`: {why} (expected `none` or a list like `128:4x256,512:8x512`: below which position, splits x workgroup size)")]
pub struct BandsParseError {
    text: String,
    why: String,
}

/// Parses `none` or `BELOW:SPLITSxWG,...` (positions ascending, at least 2 splits, a power-of-two
/// workgroup of at most 1024).
pub fn parse(text: &str) -> Result<Vec<AttentionBand>, BandsParseError> {
    let fail = |why: String| BandsParseError {
        text: text.to_string(),
        why,
    };
    let t = text.trim();
    if t == "none" {
        return Ok(vec![]);
    }
    let mut bands: Vec<AttentionBand> = vec![];
    for part in t.split(',') {
        let part = part.trim();
        let (below, grid) = part
            .split_once(':')
            .ok_or_else(|| fail(format!("`{part}` has no `:`")))?;
        let (splits, wg) = grid
            .split_once('x')
            .ok_or_else(|| fail(format!("`{grid}` is not SPLITSxWG")))?;
        let num = |s: &str, what: &str| -> Result<u64, BandsParseError> {
            s.trim()
                .parse::<u64>()
                .map_err(|_| fail(format!("{what} `{s}` is not a number")))
        };
        let below = u32::try_from(num(below, "position")?)
            .map_err(|_| fail(format!("position `{below}` is too large")))?;
        let splits = num(splits, "splits")?;
        let wg = num(wg, "workgroup size")?;
        if below == 0 || bands.last().is_some_and(|b| b.below >= below) {
            return Err(fail(format!(
                "positions must be positive and ascending (`{part}`)"
            )));
        }
        if !(2..=super::codegen::MAX_ATTENTION_SPLITS as u64).contains(&splits) {
            return Err(fail(format!(
                "{splits} splits: a band needs 2..={} (the block's scratch)",
                super::codegen::MAX_ATTENTION_SPLITS
            )));
        }
        if !wg.is_power_of_two() || wg > 1024 {
            return Err(fail(format!(
                "workgroup size {wg} is not a power of two up to 1024"
            )));
        }
        bands.push(AttentionBand {
            below,
            splits: splits as usize,
            workgroup: wg as u32,
        });
    }
    Ok(bands)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn should_parse_what_it_prints() {
        let bands = for_weights(DType::Q4_0, 512, 32);
        let text: Vec<String> = bands.iter().map(|b| b.to_string()).collect();
        assert_eq!(
            text.join(","),
            "64:4x256,256:4x512,384:6x512,512:8x512,768:12x512,2048:16x512"
        );
        assert_eq!(parse(&text.join(",")).unwrap(), bands);
        assert_eq!(parse(" none ").unwrap(), vec![]);
        assert_eq!(for_weights(DType::Q8_0, 512, 32), bands);
        let floats: Vec<String> = for_weights(DType::BF16, 512, 32)
            .iter()
            .map(|b| b.to_string())
            .collect();
        assert_eq!(
            floats,
            ["256:4x512", "384:6x512", "512:8x512", "2048:16x512"]
        );
        assert_eq!(
            for_weights(DType::BF16, 512, 32),
            for_weights(DType::F16, 512, 32)
        );
        assert_eq!(
            for_weights(DType::BF16, 128, 32)[0].to_string(),
            "256:4x128"
        );
        assert!(for_weights(DType::F32, 512, 32).is_empty());
        // The half-width band only beside a block of more than its 4 splits.
        let four: Vec<String> = for_weights(DType::Q8_0, 512, 4)
            .iter()
            .map(|b| b.to_string())
            .collect();
        assert_eq!(four[0], "256:4x512");
        assert_eq!(for_weights(DType::Q4_0, 512, 5)[0].to_string(), "64:4x256");
    }

    /// The subgroup walk (q4_0) keeps to the default bands below 384, whose chunks take one
    /// pass: not the 8- and 12-split bands (measured slower with it) nor the long grids.
    #[test]
    fn should_walk_in_subgroups_in_the_short_bands_only() {
        use super::super::codegen::subgroup_walk_fits;
        let walks: Vec<bool> = for_weights(DType::Q4_0, 512, 32)
            .iter()
            .map(|b| subgroup_walk_fits(b.below as usize, b.splits))
            .collect();
        assert_eq!(walks, [true, true, true, false, false, false]);
        let walks: Vec<bool> = for_weights(DType::BF16, 512, 32)
            .iter()
            .map(|b| subgroup_walk_fits(b.below as usize, b.splits))
            .collect();
        assert_eq!(walks, [true, true, false, false]);
        // The block's own grids: a 4096-slot cache's 32 splits, a short cache unsplit.
        assert!(!subgroup_walk_fits(4096, 32));
        assert!(!subgroup_walk_fits(128, 1));
        assert!(subgroup_walk_fits(64, 1));
    }

    #[test]
    fn should_name_what_is_wrong() {
        for (text, why) in [
            ("", "has no `:`"),
            ("128", "has no `:`"),
            ("128:4", "is not SPLITSxWG"),
            ("x:4x256", "position `x`"),
            ("128:4x256,64:8x256", "ascending"),
            ("0:4x256", "ascending"),
            ("128:1x256", "1 splits"),
            ("128:33x256", "33 splits"),
            ("128:4x300", "300 is not a power of two"),
            ("128:4x2048", "2048 is not a power of two"),
            ("99999999999:4x256", "too large"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(why), "{text}: {e}");
            assert!(e.contains(&format!("`{text}`")), "{text}: {e}");
        }
    }
}
