//! `compile-model`: writes a schedule with a report, prints the trace, and fails clearly.

use std::path::Path;
use std::process::Command;

fn compile_model(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_compile-model"))
        .args(args)
        .output()
        .expect("compile-model runs")
}

/// Whether a write to `target` left a partial file (`TARGET.PID-N.partial`) in its folder.
fn leaves_partial(target: &str) -> bool {
    let path = Path::new(target);
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    let folder = path.parent().filter(|p| !p.as_os_str().is_empty());
    std::fs::read_dir(folder.unwrap_or(Path::new(".")))
        .map(|entries| {
            entries.filter_map(|e| e.ok()).any(|e| {
                let n = e.file_name().to_string_lossy().to_string();
                n.starts_with(&format!("{name}.")) && n.ends_with(".partial")
            })
        })
        .unwrap_or(false)
}

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/models")
        .join(name)
        .display()
        .to_string()
}

#[test]
fn writes_an_unfused_schedule_and_reports_it() {
    let out_path = std::env::temp_dir().join(format!("vkfuse-cm-{}.vkf", std::process::id()));
    let out = compile_model(&[
        &fixture("llama-gqa"),
        "-o",
        out_path.to_str().unwrap(),
        "--no-fuse",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "wrote",
        "74 ops -> 43 dispatches per token",
        "templates:   T0 (31 ops) x 2",
        "arena:",
        "time:",
    ] {
        assert!(
            stdout.contains(needle),
            "report lacks `{needle}`:\n{stdout}"
        );
    }
    let f = vkfuse_runtime::schedule::ScheduleFile::open(&out_path).unwrap();
    assert_eq!(f.schedule().dispatches.len(), 43);
    assert_eq!(f.schedule().meta.vocab_size, 1000);
    std::fs::remove_file(&out_path).ok();
}

#[test]
fn emit_trace_prints_parseable_ir_with_a_summary() {
    let out = compile_model(&[
        &fixture("qwen3-tied"),
        "--emit-trace",
        "--max-context",
        "64",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let p = vkfuse_compiler::ir::parse(&text)
        .expect("the trace parses back (summary lines are comments)");
    assert_eq!(p.ops.len(), 81);
    assert!(text.contains("; state at --max-context 64"));
}

#[test]
fn bad_arguments_are_clear_errors() {
    let tied = fixture("qwen3-tied");
    // 17 bands, each on another grid than the next (a band on the next one's grid merges).
    let bands: Vec<String> = (16..33)
        .map(|b| format!("{b}:2x{}", 64 << (b % 2)))
        .collect();
    let bands = bands.join(",");
    let bands_out = format!("{}/bands-17.vkf", env!("CARGO_TARGET_TMPDIR"));
    let cases: [(&[&str], &str); 6] = [
        (&["/nonexistent"], "nothing to do"),
        (
            &[&tied, "--explain"],
            "--explain prints its reasons as it writes one",
        ),
        // Said once, not once more as the error's source.
        (
            &[
                &tied,
                "--attention-splits",
                "4",
                "--attention-bands",
                &bands,
                "-o",
                &bands_out,
            ],
            "cannot write the schedule: invalid schedule: 17 bounds of alternative grids, more \
             than the 16 bands replay records\n",
        ),
        // Refused before compiling, naming the folder.
        (
            &[&tied, "-o", "/nonexistent/dir/x.vkf"],
            "the folder /nonexistent/dir does not exist",
        ),
        (&["/nonexistent", "--emit-trace"], "/nonexistent"),
        (
            &[&fixture("qwen3-tied"), "--emit-trace", "--max-context", "0"],
            "--max-context",
        ),
    ];
    for (args, needle) in cases {
        let out = compile_model(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(needle),
            "{args:?}: `{stderr}` should mention `{needle}`"
        );
    }
    // The SM ids are the timeline's: alone, the flag is a usage error naming what it needs.
    let out = compile_model(&[&tied, "--timeline-sm", "-o", &bands_out]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("required arguments were not provided") && stderr.contains("--timeline\n"),
        "{stderr}"
    );
}

/// `-o` where something other than a file is: a directory, a device, a link to a device are
/// refused before compiling, and left as they were (the write's final rename would have
/// replaced them: `-o /dev/null` as root did); a link to a file is written through, the link
/// kept.
#[test]
fn the_output_path_is_a_file_or_a_link_to_one() {
    use std::os::unix::fs::{symlink, FileTypeExt};
    let dir = std::env::temp_dir().join(format!("vkfuse-out-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    symlink("/dev/null", dir.join("null")).unwrap();
    let tied = fixture("qwen3-tied");
    for target in [dir.join("sub"), "/dev/null".into(), dir.join("null")] {
        let t = target.to_str().unwrap();
        let out = compile_model(&[&tied, "-o", t]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{t}: {stderr}");
        assert!(
            stderr.contains("exists and is not a regular file"),
            "{t}: {stderr}"
        );
        // Refused before the compile: no stage ran.
        assert!(!stderr.contains("fuse "), "{t}: {stderr}");
        assert!(!leaves_partial(t), "{t}");
    }
    assert!(std::fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
    assert!(dir.join("sub").is_dir());
    assert!(std::fs::symlink_metadata(dir.join("null"))
        .unwrap()
        .file_type()
        .is_symlink());
    // A link to a file: the file gets the schedule, the link stays a link.
    std::fs::write(dir.join("real.vkf"), b"old").unwrap();
    symlink(dir.join("real.vkf"), dir.join("link.vkf")).unwrap();
    let out = compile_model(&[&tied, "-o", dir.join("link.vkf").to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::symlink_metadata(dir.join("link.vkf"))
        .unwrap()
        .file_type()
        .is_symlink());
    let written = std::fs::read(dir.join("real.vkf")).unwrap();
    assert!(written.starts_with(&vkfuse_runtime::schedule::MAGIC));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A fresh copy of the fixture `name` in a temporary folder of its own (`tag`), to damage.
fn fixture_copy(name: &str, tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("vkfuse-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in std::fs::read_dir(fixture(name)).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
    }
    dir
}

/// A config that names fewer layers than the checkpoint holds compiles (the first layers are
/// a model too), with a warning naming both counts; the fixture as it is gets none.
#[test]
fn a_config_cut_short_of_the_checkpoint_is_warned_about() {
    let dir = fixture_copy("llama-gqa", "short");
    let out_path = dir.join("x.vkf");
    let out = out_path.to_str().unwrap();
    let run = || {
        let o = compile_model(&[dir.to_str().unwrap(), "-o", out]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stderr).to_string()
    };
    assert!(!run().contains("warning"));
    let config = dir.join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    assert_eq!(c["num_hidden_layers"], 2);
    c["num_hidden_layers"] = 1.into();
    std::fs::write(&config, c.to_string()).unwrap();
    let stderr = run();
    assert!(
        stderr.contains("num_hidden_layers is 1, but the checkpoint holds 2 layers"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A NaN in a weight (a damaged checkpoint) is refused, naming the tensor and the element,
/// and no schedule is written; it decoded into token 0 at every step before.
#[test]
fn a_nan_weight_is_named_and_nothing_is_written() {
    let dir = fixture_copy("llama-gqa", "nan");
    // Element 5 of a bf16 matrix set to a NaN in place: the safetensors header gives its bytes.
    let file = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let tensor = "model.layers.1.mlp.down_proj.weight";
    assert_eq!(header[tensor]["dtype"], "BF16");
    let begin = header[tensor]["data_offsets"][0].as_u64().unwrap() as usize;
    let at = 8 + header_len + begin + 2 * 5;
    bytes[at..at + 2].copy_from_slice(&half::bf16::NAN.to_le_bytes());
    std::fs::write(&file, bytes).unwrap();
    let out_path = dir.join("x.vkf");
    let out = compile_model(&[dir.to_str().unwrap(), "-o", out_path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("tensor \"{tensor}\" holds NaN at element 5")),
        "{stderr}"
    );
    assert!(!out_path.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn device_cost_file_sets_the_costs_and_bad_ones_are_named() {
    let dir = std::env::temp_dir().join(format!("vkfuse-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = |name: &str| dir.join(name).to_str().unwrap().to_string();
    // A device with 4 compute units: the attention block splits the context less than for
    // the default H100's 132 (its grid follows the units, where the context is long enough
    // to split), so the file is what was used.
    let mut cost = serde_json::to_value(vkfuse_compiler::fuse::cost::DeviceCost::h100()).unwrap();
    cost["name"] = "small-gpu".into();
    cost["compute_units"] = 4.into();
    std::fs::write(path("small.json"), cost.to_string()).unwrap();
    let attention_groups = |extra: &[&str]| {
        let out_path = path("s.vkf");
        let mut args = vec![
            fixture("qwen3-untied"),
            "-o".into(),
            out_path.clone(),
            "--max-context".into(),
            "4096".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = compile_model(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let f = vkfuse_runtime::schedule::ScheduleFile::open(&out_path).unwrap();
        let d = f
            .schedule()
            .dispatches
            .iter()
            .find(|d| d.label.starts_with("attention block"))
            .expect("an attention block")
            .workgroups[0];
        (d, String::from_utf8_lossy(&out.stdout).to_string())
    };
    let (default_groups, stdout) = attention_groups(&[]);
    assert!(
        stdout.contains("costs of:    h100: barrier 3.5 µs"),
        "{stdout}"
    );
    let (small_groups, stdout) = attention_groups(&["--device-cost", &path("small.json")]);
    assert!(
        stdout.contains(
            "costs of:    small-gpu: barrier 3.5 µs, dispatch 0.2 µs, 3000.0 GB/s, 4 compute units"
        ),
        "{stdout}"
    );
    assert!(
        small_groups < default_groups,
        "{small_groups} vs {default_groups}"
    );

    // Bad files: the error names the file and the field.
    cost["compute_units"] = 0.into();
    std::fs::write(path("zero.json"), cost.to_string()).unwrap();
    std::fs::write(path("text.json"), "barrier_us = 3").unwrap();
    for (file, want) in [
        (
            "zero.json",
            "`compute_units` is 0: it must be a whole number from 1",
        ),
        ("text.json", "not JSON"),
        ("absent.json", "reading the device cost file"),
    ] {
        let out = compile_model(&[
            &fixture("qwen3-tied"),
            "-o",
            &path("bad.vkf"),
            "--device-cost",
            &path(file),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{file}");
        assert!(stderr.contains(want), "{file}: {stderr}");
        assert!(stderr.contains(&path(file)), "{file}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    // An unfused schedule has no costs to minimise: the flag is refused, not ignored.
    let out = compile_model(&[
        &fixture("qwen3-tied"),
        "-o",
        &path("bad.vkf"),
        "--no-fuse",
        "--device-cost",
        &path("small.json"),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
    std::fs::remove_dir_all(&dir).ok();
}

/// Whether `compile-model FIXTURE --emit-trace ARGS` reads a folded matrix (`#times:`).
fn traces_folded(name: &str, args: &[&str]) -> bool {
    let f = fixture(name);
    let mut all = vec![f.as_str(), "--emit-trace"];
    all.extend_from_slice(args);
    let out = compile_model(&all);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().contains("#times:")
}

#[test]
fn fold_norms_folds_the_block_formats_by_default_and_on_request() {
    // auto: the block formats fold, float weights and the checkpoint's own do not.
    assert!(traces_folded("llama-gqa", &["--weights", "q8_0"]));
    assert!(traces_folded("llama-gqa", &["--weights", "q4_0"]));
    assert!(!traces_folded("llama-gqa", &["--weights", "bf16"]));
    assert!(!traces_folded("llama-gqa", &[]));
    // Asked for: `--fold-norms` alone is `on`, a value with or without `=`.
    assert!(traces_folded("llama-gqa", &["--fold-norms"]));
    assert!(traces_folded(
        "llama-gqa",
        &["--weights", "bf16", "--fold-norms", "on"]
    ));
    assert!(!traces_folded(
        "llama-gqa",
        &["--weights", "q4_0", "--fold-norms=off"]
    ));
    // Qwen3-Next never folds (zero-centred norms).
    assert!(!traces_folded(
        "qwen3-next",
        &["--weights", "q8_0", "--fold-norms=on"]
    ));
}

/// Asserts that compile-model's report of fixture `name` compiled with `--weights W` contains
/// the needle, for each (name, W, needle).
fn assert_reports(tag: &str, cases: &[(&str, &str, &str)]) {
    let path = std::env::temp_dir().join(format!("vkfuse-{tag}-{}.vkf", std::process::id()));
    let path = path.to_str().unwrap();
    for (name, weights, needle) in cases {
        let out = compile_model(&[&fixture(name), "-o", path, "--weights", weights]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name} {weights}: {stdout}");
        assert!(stdout.contains(needle), "{name} {weights}: {stdout}");
    }
    std::fs::remove_file(path).ok();
}

#[test]
fn the_report_says_what_was_folded() {
    assert_reports(
        "fold",
        &[
            (
                "qwen3-tied",
                "q8_0",
                "norms:       4 folded into the matrices after them (lm_head shares",
            ),
            (
                "qwen3-untied",
                "q4_0",
                "norms:       7 folded into the matrices after them\n",
            ),
            ("qwen3-untied", "bf16", "norms:       not folded"),
        ],
    );
}

#[test]
fn the_weights_line_counts_what_each_reason_kept() {
    assert_reports(
        "weights",
        &[
            (
                "qwen3-next",
                "q8_0",
                "q8_0: 30 matrices and 12 expert stacks (0.69 MB -> 0.45 MB); kept as stored: 4 \
                 (4: input size not a multiple of 32)",
            ),
            (
                "qwen3-tied",
                "bf16",
                "weights:     bf16: every matrix is bf16 already",
            ),
        ],
    );
}

#[test]
fn the_block_formats_take_int8_chains_and_f16_dots_by_default_and_f16_or_f32_on_request() {
    let path = std::env::temp_dir().join(format!("vkfuse-dots-{}.vkf", std::process::id()));
    // compile-model on qwen3-untied into `path`, with `args`.
    let compile = |args: &[&str]| {
        let (model, out) = (fixture("qwen3-untied"), path.display().to_string());
        let mut all = vec![model.as_str(), "-o", out.as_str()];
        all.extend(args);
        compile_model(&all)
    };
    // (f16 kernels, int8 kernels) of the schedule compile-model writes with `args`.
    let dots = |args: &[&str]| {
        let out = compile(args);
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "{args:?}: {stdout}");
        let file = vkfuse_runtime::schedule::ScheduleFile::open(&path).unwrap();
        let f16 = file.schedule().float16_kernel().is_some();
        let int8 = file.schedule().integer_dot_kernel().is_some();
        // `vkfuse inspect` says what the device must offer for it.
        let dump = vkfuse_runtime::schedule::dump(file.schedule());
        assert_eq!(dump.contains("int8 dot products"), int8, "{args:?}: {dump}");
        assert_eq!(dump.contains("f16 arithmetic"), f16, "{args:?}: {dump}");
        // The report says what the kernels do.
        let line = match (f16, int8, args) {
            (_, true, _) => "dots:        int8 products in the chained MLPs",
            (true, false, [.., "--no-chain"]) => "no chained MLP to take int8 ones (--no-chain",
            (true, false, _) => "dots:        f16 products",
            (false, false, [_, "bf16", ..]) => "dots:        no block-format matvecs",
            (false, false, [.., "--no-fuse"]) => "dots:        f32 (the unfused kernels",
            (false, false, _) => "dots:        f32 (exact",
        };
        assert!(stdout.contains(line), "{args:?}: {stdout}");
        (f16, int8)
    };
    assert_eq!(dots(&["--weights", "q8_0"]), (true, true));
    assert_eq!(dots(&["--weights", "q4_0", "--dots", "auto"]), (true, true));
    assert_eq!(dots(&["--weights", "q4_0", "--dots", "int8"]), (true, true));
    assert_eq!(dots(&["--weights", "q4_0", "--dots", "f16"]), (true, false));
    assert_eq!(
        dots(&["--weights", "q4_0", "--dots", "f32"]),
        (false, false)
    );
    // Without the chain there are no int8 dots to take.
    assert_eq!(dots(&["--weights", "q8_0", "--no-chain"]), (true, false));
    assert_eq!(dots(&["--weights", "q8_0", "--no-fuse"]), (false, false));
    // Float weights have no block-format dots to take in f16 or int8.
    assert_eq!(dots(&["--weights", "bf16"]), (false, false));
    assert_eq!(
        dots(&["--weights", "bf16", "--dots", "int8"]),
        (false, false)
    );
    let out = compile(&["--dots", "f8"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("possible values: auto, int8, f16, f32"));
    // An explicit f16 or int8 that the unfused kernels cannot take is refused, before any work
    // and with no file written; `--no-fuse --dots f32` agrees with them and compiles.
    for arith in ["f16", "int8"] {
        std::fs::remove_file(&path).ok();
        let out = compile(&["--weights", "q8_0", "--no-fuse", "--dots", arith]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            stderr.contains(&format!("--dots {arith} applies to fused schedules"))
                && stderr.contains("--no-fuse"),
            "{stderr}"
        );
        assert!(!path.exists());
    }
    assert_eq!(
        dots(&["--weights", "q8_0", "--dots", "f32", "--no-fuse"]),
        (false, false)
    );
    std::fs::remove_file(&path).ok();
}

/// `-o` onto one of the model's own files (its checkpoint, its config) is refused before any
/// work, the file untouched; so is a new `.safetensors` file in the model's folder, which the
/// next import would read as part of the checkpoint. A schedule beside them is fine.
#[test]
fn the_output_is_not_one_of_the_models_own_files() {
    let dir = std::env::temp_dir().join(format!("vkfuse-own-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(Path::new(&fixture("qwen3-tied")).join(f), dir.join(f)).unwrap();
    }
    let model = dir.display().to_string();
    let before = std::fs::read(dir.join("model.safetensors")).unwrap();
    for (name, why) in [
        ("model.safetensors", "one of the model's own files"),
        ("config.json", "one of the model's own files"),
        (
            "more.safetensors",
            "would be read as part of its checkpoint",
        ),
    ] {
        let out_path = dir.join(name).display().to_string();
        let out = compile_model(&[&model, "-o", &out_path]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        assert!(
            stderr.contains(why) && stderr.contains(&out_path),
            "{name}: {stderr}"
        );
        assert!(
            !stderr.contains("import "),
            "refused before the import: {stderr}"
        );
    }
    assert_eq!(
        std::fs::read(dir.join("model.safetensors")).unwrap(),
        before
    );
    assert!(!dir.join("more.safetensors").exists());
    let vkf = dir.join("model.vkf").display().to_string();
    let out = compile_model(&[&model, "-o", &vkf]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `--max-context` out of range is refused before the import, as itself (no trace stage ran).
#[test]
fn a_max_context_out_of_range_is_refused_before_the_import() {
    for n in ["0", "16777217"] {
        let out = compile_model(&[&fixture("qwen3-tied"), "--emit-trace", "--max-context", n]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert_eq!(
            stderr.trim(),
            format!("error: --max-context {n} must be between 1 and 16777216")
        );
    }
}
