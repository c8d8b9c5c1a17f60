//! Options shared by the commands that run a model (`run`, `generate`, `bench`): how a model
//! directory's weights are stored, and whether persistent regions and handoffs run.

use anyhow::{bail, Context, Result};
use vkfuse_compiler::import::Model;
use vkfuse_compiler::ir::Program;
use vkfuse_compiler::quant::{self, WeightFormat};
use vkfuse_compiler::{fuse, trace};
use vkfuse_runtime::{Device, DeviceChoice, Handoffs, Persistence};

/// `--device`, for the commands that open one.
#[derive(clap::Args)]
pub struct DeviceArg {
    /// The Vulkan device: its index in `vkfuse devices`, or a case-insensitive part of its
    /// name (default: VKFUSE_DEVICE, which takes the same, else the first discrete GPU, then
    /// integrated, then CPU).
    #[arg(long = "device", value_name = "N|NAME")]
    pub choice: Option<DeviceChoice>,
}

impl DeviceArg {
    /// The device it names ([`crate::decode::open_device`]).
    pub fn open(&self) -> Result<Device> {
        crate::decode::open_device(self.choice.as_ref())
    }
}

#[derive(clap::Args)]
pub struct RunOptions {
    /// For a model directory: store the matvec weights as f16, bf16, q8_0 or q4_0 (as
    /// `compile-model --weights` does; q8_0/q4_0 keep matrices whose input size is not a
    /// multiple of 32 as stored, and fold the norm weights by default: `--fold-norms`).
    /// Default: the checkpoint's dtypes.
    #[arg(long, value_name = "FORMAT")]
    pub weights: Option<WeightFormat>,
    /// For a model directory: fold the RMSNorm weights into the matrices after them, as
    /// `compile-model --fold-norms` does: `auto` (the default: where those matrices are stored
    /// as q8_0 or q4_0), `on` (`--fold-norms` alone) or `off`.
    #[arg(long, value_name = "WHEN", value_enum, num_args = 0..=1, default_missing_value = "on")]
    pub fold_norms: Option<trace::FoldNorms>,
    /// For a model directory under `bench`, which compiles it fused: the q8_0/q4_0 dot
    /// products in int8 (the chained MLPs; f16 elsewhere), f16 or f32, as `compile-model
    /// --dots` (default `auto`: int8 where `--weights` is q8_0 or q4_0). `run` and `generate`
    /// decode a model directory unfused (f32) and a schedule file as it was compiled.
    #[arg(long, value_name = "TYPE", value_enum)]
    pub dots: Option<fuse::Dots>,
    /// Persistent regions (one dispatch for a run of matvec levels, grid barriers in device
    /// memory between them): `off` (the default: they measured slower on the H100), `units`
    /// (one workgroup per compute unit where the device reports them) or a workgroup count
    /// (never more than the device keeps resident at once: that deadlocks; a device that does
    /// not report its compute units, such as lavapipe, refuses more than one). `bench` also
    /// measures the fused replay rows without them where they run.
    #[arg(long, default_value = "off", value_name = "off|units|N")]
    pub persistent: Persistence,
    /// Handoffs (replay only): where one kernel of a level reads what one kernel of the level
    /// before wrote, replay records no barrier between the two levels and that kernel waits on
    /// flagged words in device memory instead: `auto` (the default: on for NVIDIA devices,
    /// where it measured about 25% more tokens/s on the H100 at 256 tokens, docs/perf.md session
    /// 19; off elsewhere, since it relies on the driver launching dispatches in order), `on`
    /// or `off`. `on` elsewhere is for tests: on lavapipe a kernel that waits longer than
    /// 65535 polls goes on with a wrong value (llvmpipe bounds every loop; docs/perf.md session
    /// 30). `vkfuse inspect` lists the levels a schedule hands over; `vkfuse bench` measures the
    /// fused replay rows with and without them.
    #[arg(long, default_value = "auto", value_name = "auto|on|off")]
    pub handoffs: Handoffs,
}

/// `--ids`' value parser: clap's own for u32 would say "-1 is not in 0..=4294967295". Spaces
/// around an id are allowed ("1, 2"); an empty one (`--ids ""`, `1,,2`) is named as such.
pub fn parse_token_id(text: &str) -> std::result::Result<u32, String> {
    let id = text.trim();
    if id.is_empty() {
        return Err("an empty token id: give comma-separated integers, e.g. --ids 1,2,3".into());
    }
    id.parse().map_err(|_| {
        // `--ids 1 2 3 MODEL` takes the model as one more id (space-separated ids are
        // accepted too): say so where the text names a file.
        let hint = if std::path::Path::new(id).exists() {
            " (a file: give the model before --ids, or end the ids with `--`)"
        } else {
            ""
        };
        format!("token ids are integers from 0 to {}: {id}{hint}", u32::MAX)
    })
}

/// Loads the model directory `path`, with what config.json sets aside in it as warnings on
/// stderr (`Model::warnings`), for the commands that decode a directory.
pub fn load_model(path: &std::path::Path) -> Result<Model> {
    let model = vkfuse_compiler::import::load(path)
        .with_context(|| format!("loading {}", path.display()))?;
    for w in model.warnings() {
        eprintln!("warning: {w}");
    }
    Ok(model)
}

/// Refuses an output file (`flag`'s `path`) whose folder does not exist, or that is a folder,
/// before the work that fills it: found after a decode or a timeline, that work would be lost.
pub fn check_out_folder(flag: &str, path: &std::path::Path) -> Result<()> {
    if let Some(dir) = vkfuse_runtime::schedule::missing_folder(path) {
        bail!(
            "{flag} {}: the folder {} does not exist",
            path.display(),
            dir.display()
        );
    }
    if path.is_dir() {
        bail!("{flag} {}: a folder, not a file to write", path.display());
    }
    Ok(())
}

/// Opens a schedule file, with a warning where compile-model built it for timing only
/// (`--ablate`: its kernels are marked, its tokens wrong by design).
pub fn open_schedule(path: &std::path::Path) -> Result<vkfuse_runtime::schedule::ScheduleFile> {
    open_schedule_with(path, vkfuse_runtime::schedule::Verify::All)
}

/// [`open_schedule`], checking as much as `verify` asks (`vkfuse kernels` never uploads the
/// weights: their checksum, a read of every weight byte, is left out).
pub fn open_schedule_with(
    path: &std::path::Path,
    verify: vkfuse_runtime::schedule::Verify,
) -> Result<vkfuse_runtime::schedule::ScheduleFile> {
    let file = vkfuse_runtime::schedule::ScheduleFile::open_with(path, verify)?;
    let mark = vkfuse_compiler::fuse::ablate::MARK;
    let ablated = file
        .schedule()
        .kernels
        .iter()
        .filter(|k| k.label.ends_with(mark))
        .count();
    if ablated > 0 {
        eprintln!(
            "warning: {} was compiled with --ablate ({ablated} kernel{} reduced for timing): its \
             tokens and logits are wrong by design",
            path.display(),
            if ablated == 1 { "" } else { "s" }
        );
    }
    Ok(file)
}

/// [`open_schedule`] for the commands that decode with it (`run`, `generate`, `bench`), with a
/// note where compile-model built it with `--timeline`: its kernels record every workgroup's
/// times, which makes it slower than the plain schedule (its tokens are the same).
pub fn open_to_decode(path: &std::path::Path) -> Result<vkfuse_runtime::schedule::ScheduleFile> {
    let file = open_schedule(path)?;
    if file.schedule().kernels.iter().any(|k| k.records_timeline()) {
        eprintln!(
            "note: {} was compiled with --timeline (for `vkfuse timeline`): its kernels record \
             their workgroups' times and run slower than a plain schedule's",
            path.display()
        );
    }
    Ok(file)
}

impl RunOptions {
    /// Refuses what a schedule file fixed at compile time.
    pub fn check_file(&self) -> Result<()> {
        if self.weights.is_some() {
            bail!("--weights is fixed when the schedule is compiled (compile-model --weights)");
        }
        if self.fold_norms.is_some() {
            bail!(
                "--fold-norms is fixed when the schedule is compiled (compile-model --fold-norms)"
            );
        }
        if self.dots.is_some() {
            bail!("--dots is fixed when the schedule is compiled (compile-model --dots)");
        }
        Ok(())
    }

    /// Refuses what only a fused schedule takes, for the commands that decode a model directory
    /// unfused (`run`, `generate`).
    pub fn check_unfused(&self) -> Result<()> {
        if self.dots.is_some() {
            bail!(
                "--dots applies to fused schedules, and a model directory is decoded unfused \
                 here: compile one with `compile-model --weights W --dots TYPE -o FILE` and run \
                 FILE (`vkfuse bench MODEL_DIR --dots TYPE` times both)"
            );
        }
        Ok(())
    }

    /// A model directory's decode step, traced with `opts` (a warning where `--max-context`
    /// passes the positions the model was trained on), its weights stored as `--weights` asks
    /// and its norm weights folded as `--fold-norms` does.
    pub fn program(&self, model: &Model, opts: &trace::TraceOptions) -> Result<Program> {
        let opts = &trace::TraceOptions {
            fold_norms: self
                .fold_norms
                .unwrap_or_default()
                .folds(model, self.weights),
            ..opts.clone()
        };
        let mut program = trace::trace(model, opts).context("tracing the decode step")?;
        if let Some(warning) = trace::unread_warning(model, &program) {
            eprintln!("warning: {warning}");
        }
        if let Some(warning) = trace::past_trained_context(model, opts) {
            eprintln!("{warning}");
        }
        if let Some(format) = self.weights {
            quant::convert(&mut program, format).context("converting the weights' format")?;
        }
        Ok(program)
    }
}

#[cfg(test)]
mod tests {
    use super::parse_token_id;

    #[test]
    fn token_ids_allow_spaces_and_name_empty_ones() {
        assert_eq!(parse_token_id(" 2"), Ok(2));
        assert!(parse_token_id("").unwrap_err().contains("empty"));
        assert!(parse_token_id(" ").unwrap_err().contains("empty"));
        assert!(parse_token_id("-1").unwrap_err().contains("from 0 to"));
    }
}
