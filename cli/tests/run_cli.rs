//! `vkfuse run`'s interface: the ids it prints, the logits file's rows, the JSON keys, and
//! clear errors (no panic) on bad input.

use std::process::Command;
use vkfuse_compiler::kernels::timeline::Records;
use vkfuse_compiler::npy;
use vkfuse_tests::{assert_rows_close, expected, fixture_dir};

fn vkfuse(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_vkfuse"))
        .args(args)
        .output()
        .expect("vkfuse runs")
}

/// `vkfuse args`, which must succeed (its stderr in the failure).
fn vkfuse_ok(args: &[&str]) -> std::process::Output {
    let out = vkfuse(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The `ids` of `vkfuse run --json`'s report.
fn json_ids(json: &serde_json::Value) -> Vec<u32> {
    json["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// `out` failed with exit status 1, its error saying every one of `needles`, before any output.
fn refused_alone(out: &std::process::Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "`{needle}` not in: {stderr}");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.is_empty(), "output before the error: {stdout}");
}

fn ids_arg(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

#[test]
fn run_reference_reproduces_transformers_greedy_run() {
    let want = expected("llama-gqa");
    let dir = fixture_dir("llama-gqa");
    let out_path = std::env::temp_dir().join(format!("vkfuse-cli-{}.npy", std::process::id()));
    let n = want.greedy_ids.len().to_string();
    let out = vkfuse_ok(&[
        "run",
        dir.to_str().unwrap(),
        "--backend",
        "reference",
        "--ids",
        &ids_arg(&want.prompt_ids),
        "--max-new-tokens",
        &n,
        "--logits-out",
        out_path.to_str().unwrap(),
        "--json",
    ]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(json_ids(&json), want.greedy_ids);
    for key in [
        "backend",
        "tokens_per_s",
        "host_us_per_token",
        "gpu_us_per_token",
        "dispatches_per_token",
        "barriers_per_token",
        "descriptor_writes_per_token",
        "recordings_per_token",
        "submits_per_token",
    ] {
        assert!(json.get(key).is_some(), "--json lacks `{key}`: {json}");
    }
    assert_eq!(json["backend"], "reference");
    let logits = npy::read(&out_path).unwrap();
    std::fs::remove_file(&out_path).ok();
    // Rows: every fed token and every generated one but the last.
    assert_eq!(
        logits.rows,
        want.prompt_ids.len() + want.greedy_ids.len() - 1
    );
    let rows: Vec<Vec<f32>> = (0..logits.rows).map(|r| logits.row(r).to_vec()).collect();
    assert_rows_close("cli greedy", &rows, &want.greedy_logits, 1e-3);

    // No new tokens: the prompt's logits, and the output says that none were generated.
    let out = vkfuse_ok(&[
        "run",
        dir.to_str().unwrap(),
        "--ids",
        &ids_arg(&want.prompt_ids),
        "--max-new-tokens",
        "0",
        "--logits-out",
        out_path.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.starts_with("generated: none"), "{stdout}");
    let logits = npy::read(&out_path).unwrap();
    std::fs::remove_file(&out_path).ok();
    assert_eq!(logits.rows, want.prompt_ids.len());
}

#[test]
fn replay_feeds_the_last_prompt_token_to_its_first_chain_and_reproduces_transformers() {
    // Without --logits-out the last prompt token is consumed by the first greedy chain (no
    // step of its own): the ids must still be transformers', with chains of 3 that do not
    // divide the count, and with the logits asked for (every step alone) as well.
    let want = expected("qwen3-tied");
    let (model, schedule, _) = vkfuse_tests::fused_schedule_with("qwen3-tied", &Default::default());
    let path = std::env::temp_dir().join(format!("vkfuse-chainlast-{}.vkf", std::process::id()));
    schedule.write_file(&path, &model.tensors).unwrap();
    let out_path =
        std::env::temp_dir().join(format!("vkfuse-chainlast-{}.npy", std::process::id()));
    let n = want.greedy_ids.len().to_string();
    let prompt = ids_arg(&want.prompt_ids);
    let base = [
        "run",
        path.to_str().unwrap(),
        "--ids",
        &prompt,
        "--max-new-tokens",
        &n,
    ];
    for extra in [
        &["--tokens-per-submit", "3", "--json"][..],
        &["--json"][..],
        &["--json", "--logits-out", out_path.to_str().unwrap()][..],
    ] {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let out = vkfuse_ok(&args);
        let stdout = String::from_utf8(out.stdout).unwrap();
        let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        assert_eq!(json_ids(&json), want.greedy_ids, "{args:?}");
        if extra.get(1) == Some(&"3") {
            // The warm-up step (and the reset after it) counts for nothing: the prompt's ids
            // but the last one submit each, then chains of 3.
            let (p, n) = (want.prompt_ids.len(), want.greedy_ids.len());
            let submits = (p - 1 + n.div_ceil(3)) as f64 / (p + n - 1) as f64;
            let got = json["submits_per_token"].as_f64().unwrap();
            assert!(
                (got - submits).abs() < 1e-9,
                "{got} submits per token, not {submits}"
            );
        }
    }
    // What compile-model fixed is not asked again.
    let out = vkfuse(&[
        "run",
        path.to_str().unwrap(),
        "--fold-norms",
        "off",
        "--ids",
        "1",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--fold-norms is fixed"), "{stderr}");
    for cmd in [&["bench"][..], &["run", "--ids", "1"]] {
        let mut args = vec![cmd[0], path.to_str().unwrap(), "--dots", "f32"];
        args.extend(&cmd[1..]);
        let out = vkfuse(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{cmd:?}: {stderr}");
        assert!(stderr.contains("--dots is fixed"), "{cmd:?}: {stderr}");
    }
    // A model directory decodes unfused: --dots has nothing to apply to.
    let dir = fixture_dir("qwen3-tied");
    let out = vkfuse(&["run", dir.to_str().unwrap(), "--dots", "f16", "--ids", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--dots applies to fused schedules"),
        "{stderr}"
    );
    std::fs::remove_file(&path).ok();
    // Runs keep their pipeline cache beside the schedule.
    std::fs::remove_file(path.with_extension("vkf.pipelines")).ok();
    std::fs::remove_file(&out_path).ok();
}

/// A model directory's logits through the CPU reference with `args`.
fn reference_logits(args: &[&str]) -> Vec<u8> {
    let dir = fixture_dir("llama-gqa");
    let path = std::env::temp_dir().join(format!(
        "vkfuse-fold-{}-{}.npy",
        std::process::id(),
        args.join("_").replace(['-', '='], "")
    ));
    let mut all = vec![
        "run",
        dir.to_str().unwrap(),
        "--backend",
        "reference",
        "--ids",
        "1,2,3",
        "--max-new-tokens",
        "0",
        "--logits-out",
        path.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    vkfuse_ok(&all);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).ok();
    bytes
}

#[test]
fn a_model_directory_in_a_block_format_is_folded_as_compile_model_folds_it() {
    // auto folds q8_0 (the same logits as `on`, other ones than `off`); bf16 it does not.
    let auto = reference_logits(&["--weights", "q8_0"]);
    assert_eq!(
        auto,
        reference_logits(&["--weights", "q8_0", "--fold-norms"])
    );
    assert_ne!(
        auto,
        reference_logits(&["--weights", "q8_0", "--fold-norms=off"])
    );
    let bf16 = reference_logits(&["--weights", "bf16"]);
    assert_eq!(
        bf16,
        reference_logits(&["--weights", "bf16", "--fold-norms", "off"])
    );
    assert_ne!(
        bf16,
        reference_logits(&["--weights", "bf16", "--fold-norms", "on"])
    );
}

#[test]
fn zero_new_tokens_gives_one_row_per_id() {
    let dir = fixture_dir("qwen3-tied");
    let out_path = std::env::temp_dir().join(format!("vkfuse-cli0-{}.npy", std::process::id()));
    vkfuse_ok(&[
        "run",
        dir.to_str().unwrap(),
        "--ids",
        "3,4,5",
        "--max-new-tokens",
        "0",
        "--logits-out",
        out_path.to_str().unwrap(),
    ]);
    assert_eq!(npy::read(&out_path).unwrap().rows, 3);
    std::fs::remove_file(&out_path).ok();
}

#[test]
fn bad_input_is_a_clear_error_not_a_panic() {
    let dir = fixture_dir("qwen3-tied");
    let d = dir.to_str().unwrap();
    let cases: [(&[&str], &str); 12] = [
        (
            &["run", "/nonexistent/model", "--ids", "1"],
            "/nonexistent/model",
        ),
        // Refused before the decode, naming the folder.
        (
            &[
                "run",
                d,
                "--ids",
                "1",
                "--logits-out",
                "/nonexistent/dir/l.npy",
            ],
            "the folder /nonexistent/dir does not exist",
        ),
        // A folder where the file to write belongs, named with its flag.
        (
            &["run", d, "--ids", "1", "--logits-out", d],
            "a folder, not a file to write",
        ),
        // A model directory where a schedule file belongs.
        (&["inspect", d], "is a directory, not a schedule file"),
        (&["inspect", "/nonexistent.vkf"], "/nonexistent.vkf"),
        (&["kernels", "/nonexistent.vkf"], "/nonexistent.vkf"),
        (&["kernels", d], "is a directory, not a schedule file"),
        (&["run", d, "--ids", "99999"], "outside the vocabulary"),
        // A device asked for where the CPU runs: refused, not ignored.
        (
            &["run", d, "--ids", "1", "--device", "0"],
            "a model directory runs on the CPU reference backend",
        ),
        (
            &[
                "run",
                d,
                "--ids",
                "1",
                "--backend",
                "reference",
                "--device",
                "0",
            ],
            "the reference backend runs on the CPU",
        ),
        (
            &[
                "run",
                d,
                "--ids",
                "1,2",
                "--max-new-tokens",
                "100",
                "--max-context",
                "8",
            ],
            "KV capacity",
        ),
        (
            &["run", d, "--ids", "1", "--max-context", "0"],
            "--max-context",
        ),
    ];
    for (args, needle) in cases {
        let out = vkfuse(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(needle),
            "{args:?}: `{stderr}` should mention `{needle}`"
        );
        assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
        // The operating system's message once, not repeated by the error chain.
        assert!(
            stderr.matches("(os error").count() <= 1,
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn bad_arguments_are_refused_before_decoding() {
    let dir = fixture_dir("qwen3-tied");
    let d = dir.to_str().unwrap();
    // Refused by the argument parser (exit 2), naming the value.
    for (args, needle) in [
        (
            &["run", d, "--ids", "-1"][..],
            "token ids are integers from 0",
        ),
        (
            &["run", d, "--ids", "1,-1"][..],
            "token ids are integers from 0",
        ),
        (&["bench", d, "--profile-steps", "0"][..], "--profile-steps"),
        (&["run", d, "--fold-norms=maybe"][..], "--fold-norms"),
    ] {
        let out = vkfuse(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: `{stderr}`");
    }
    // More tokens than the schedule reserves: the error alone, no table begun.
    let out = vkfuse(&["bench", d, "--tokens", "600"]);
    refused_alone(
        &out,
        &[
            "--tokens 600 needs 600 positions",
            "reserves its config's max_position_embeddings",
        ],
    );
    // --max-context sets a model directory's capacity for bench as for run.
    let out = vkfuse(&["bench", d, "--tokens", "9", "--max-context", "8"]);
    refused_alone(
        &out,
        &["--tokens 9 needs 9 positions; the schedule reserves 8 (--max-context 8 sets it)"],
    );
}

#[test]
fn vulkan_problems_are_clear_errors_not_panics() {
    let dir = fixture_dir("qwen3-tied");
    let d = dir.to_str().unwrap();
    let on_device = |device: &str| {
        vkfuse(&[
            "run",
            d,
            "--backend",
            "eager",
            "--ids",
            "1",
            "--device",
            device,
        ])
    };
    // A refusal: exit status 1, no panic, the message.
    let refused = |out: std::process::Output, says: &str| {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(says), "{says}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    };
    // --device out of range names how many devices there are.
    refused(on_device("99"), "asks for device 99, but there are");
    // --device by part of a name, as VKFUSE_DEVICE takes: this machine's device, then none.
    let listing = String::from_utf8_lossy(&vkfuse_ok(&["devices"]).stdout).to_string();
    // "device 0 (default): NAME (...)".
    let name = listing
        .lines()
        .find(|l| l.starts_with("device 0"))
        .and_then(|l| l.split_once(": "))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .expect("device 0 listed")
        .to_lowercase();
    let out = on_device(&name);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    refused(
        on_device("no-such-gpu"),
        "--device=\"no-such-gpu\" matches no device",
    );
    // No driver at all: the loader finds no ICD.
    let out = Command::new(env!("CARGO_BIN_EXE_vkfuse"))
        .args(["run", d, "--backend", "eager", "--ids", "1"])
        .env("VK_DRIVER_FILES", "/nonexistent/icd.json")
        .env("VK_ICD_FILENAMES", "/nonexistent/icd.json")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("mesa-vulkan-drivers"),
        "should say how to get a driver: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `vkfuse devices` lists every device, one marked the default; a VKFUSE_DEVICE naming none of
/// them marks none and says why (the commands that open a device refuse it).
#[test]
fn devices_lists_lavapipe_or_a_gpu() {
    let out = vkfuse_ok(&["devices"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("device 0"), "{stdout}");
    assert!(stdout.contains("(default)"), "{stdout}");
    let out = Command::new(env!("CARGO_BIN_EXE_vkfuse"))
        .arg("devices")
        .env("VKFUSE_DEVICE", "no-such-device-name")
        .output()
        .expect("vkfuse runs");
    assert!(out.status.success());
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        stdout.contains("device 0") && !stdout.contains("(default)"),
        "{stdout}"
    );
    assert!(
        stderr.contains("no device is the default") && stderr.contains("no-such-device-name"),
        "{stderr}"
    );
}

/// The rows `vkfuse bench` adds where the device runs handoffs (the fused replay without them,
/// K = 1 and 8): 2 if a row handed levels over, else 0 (lavapipe).
fn handoff_rows(rows: &[serde_json::Value]) -> usize {
    if rows.iter().any(|r| r["handed_levels"].as_u64() > Some(0)) {
        2
    } else {
        0
    }
}

#[test]
fn bench_prints_one_row_per_configuration_and_replay_does_no_per_token_host_work() {
    // A model directory is compiled both unfused and fused.
    let dir = fixture_dir("qwen3-tied");
    let out = vkfuse_ok(&["bench", dir.to_str().unwrap(), "--tokens", "9", "--json"]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let rows: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let rows = rows.as_array().unwrap();
    // {unfused, fused} x {eager, replay K=1, replay K=8}, and they agreed on the tokens; where
    // handoffs run (NVIDIA), the fused replay rows without them too.
    let extra = handoff_rows(rows);
    assert_eq!(rows.len(), 6 + extra, "{stdout}");
    assert_eq!(
        rows.iter().filter(|r| r["fused"] == true).count(),
        3 + extra
    );
    for r in rows {
        for key in [
            "fused",
            "backend",
            "tokens_per_submit",
            "ids",
            "tokens_per_s",
            "host_us_per_token",
            "dispatches_per_token",
        ] {
            assert!(r.get(key).is_some(), "row lacks `{key}`: {r}");
        }
        if r["backend"] == "replay" {
            assert_eq!(r["descriptor_writes_per_token"], 0.0);
            assert_eq!(r["recordings_per_token"], 0.0);
        } else {
            assert_eq!(r["recordings_per_token"], 1.0);
        }
    }
    // K = 8: 9 tokens take 1 (prompt) + 1 chain of 8 submits.
    let k8 = rows.iter().find(|r| r["tokens_per_submit"] == 8).unwrap();
    assert!(
        (k8["submits_per_token"].as_f64().unwrap() - 2.0 / 9.0).abs() < 1e-9,
        "{k8}"
    );
    // In a block format the fused schedule takes f16 dots, as compile-model's: its rows agree
    // with one another (the unfused ones' f32 may pick other tokens: a note, not a failure).
    for dots in ["auto", "f32"] {
        let out = vkfuse_ok(&[
            "bench",
            dir.to_str().unwrap(),
            "--weights",
            "q4_0",
            "--dots",
            dots,
            "--tokens",
            "9",
            "--json",
        ]);
        let stdout = String::from_utf8(out.stdout).unwrap();
        let rows: Vec<serde_json::Value> =
            serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        let fused: Vec<_> = rows.iter().filter(|r| r["fused"] == true).collect();
        assert_eq!(fused.len(), 3 + handoff_rows(&rows), "{dots}: {stdout}");
        assert!(
            fused.iter().all(|r| r["ids"] == fused[0]["ids"]),
            "{dots}: {stdout}"
        );
    }
}

#[test]
fn bench_profile_prints_every_level_of_the_fused_step() {
    let dir = fixture_dir("qwen3-tied");
    let out = vkfuse_ok(&[
        "bench",
        dir.to_str().unwrap(),
        "--tokens",
        "3",
        "--profile",
        "--profile-steps",
        "4",
        "--json",
    ]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("profile: fused replay"), "{stdout}");
    assert!(stdout.contains("by kernel"), "{stdout}");
    // One row per level, numbered from 0, then the step's total.
    let levels = stdout
        .lines()
        .skip_while(|l| !l.starts_with("profile:"))
        .skip(2)
        .take_while(|l| !l.starts_with("step:"))
        .count();
    assert!(levels > 5, "{stdout}");
    let step = stdout.lines().find(|l| l.starts_with("step:")).unwrap();
    assert!(step.contains(&format!("in {levels} levels")), "{step}");
    // Then each fused kernel against the plain kernels of its ops: the qwen3-tied step's
    // five (q/k/v with its norm, the attention block, o_proj with the residual, the chained
    // MLP, lm_head with the argmax), each replacing two or more plain dispatches.
    let kernels: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("fused kernel "))
        .skip(1)
        .take_while(|l| !l.starts_with("all fused kernels:"))
        .collect();
    // Then the fused step's work no op names (zeroing the chained MLP's sums), on its own row.
    assert!(
        kernels.last().unwrap().starts_with("(fused only: zeroing"),
        "{stdout}"
    );
    let kernels = &kernels[..kernels.len() - 1];
    assert_eq!(kernels.len(), 5, "{stdout}");
    for row in kernels {
        // From the right: kernels only, ratio, plain µs, fused µs, plain dispatches, n.
        let cols: Vec<&str> = row.split_whitespace().rev().take(6).collect();
        let plain: f64 = cols[4].parse().unwrap();
        assert!(plain >= 2.0, "{row}");
    }
    assert!(kernels[1].starts_with("attention block"), "{stdout}");
    assert!(stdout.contains("all fused kernels:"), "{stdout}");
    // The JSON array stays the last line.
    let rows: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 6 + handoff_rows(rows));
}

#[test]
fn bench_measures_fused_replay_with_and_without_handoffs() {
    let dir = fixture_dir("qwen3-untied");
    let out = vkfuse_ok(&[
        "bench",
        dir.to_str().unwrap(),
        "--tokens",
        "3",
        "--handoffs",
        "on",
        "--json",
    ]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let fused_replay = |handed: bool| {
        rows.iter()
            .filter(|r| r["fused"] == true && r["backend"] == "replay")
            .filter(|r| (r["handed_levels"].as_u64().unwrap() > 0) == handed)
            .count()
    };
    // K=1 and K=8 each way; the table names the levels handed over.
    assert_eq!(
        (fused_replay(true), fused_replay(false)),
        (2, 2),
        "{stdout}"
    );
    assert!(stdout.contains(" lv "), "{stdout}");
}

/// A fused schedule that hands no level over (qwen3-next's here) gets no rows without
/// handoffs beside its rows with them (the same barriers twice), and a note says why.
#[test]
fn bench_says_when_a_fused_schedule_hands_nothing_over() {
    // A fused schedule that hands nothing over: the hybrid fixture after one round of rules
    // (kernels fused, but q/k/v reach the attention block through slices, its output the gate
    // through an elementwise kernel: no consumer of words after its producer). Fully fused,
    // its gated attention block takes q/k/v as words and hands its output to o_proj.
    use vkfuse_runtime::session::handoff;
    let opts = vkfuse_compiler::fuse::FuseOptions {
        iter_limit: 1,
        ..Default::default()
    };
    let (model, schedule, _) = vkfuse_tests::fused_schedule_with("qwen3-next", &opts);
    let plan = handoff::plan(&schedule, &handoff::accesses(&schedule));
    assert_eq!(plan.handed_levels(), 0, "the premise: nothing to hand over");
    let path = std::env::temp_dir().join(format!("vkfuse-bench-next-{}.vkf", std::process::id()));
    schedule.write_file(&path, &model.tensors).unwrap();
    let out = vkfuse_ok(&[
        "bench",
        path.to_str().unwrap(),
        "--tokens",
        "3",
        "--handoffs",
        "on",
        "--json",
    ]);
    std::fs::remove_file(&path).ok();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("note: --handoffs on: no level of the fused schedule is handed over"),
        "{stderr}"
    );
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    // No second run without handoffs: each K (and write-back, where the schedule has copies
    // that ping-pong could drop) once.
    let mut replay: Vec<String> = rows
        .iter()
        .filter(|r| r["backend"] == "replay")
        .map(|r| format!("{} {}", r["tokens_per_submit"], r["write_back"]))
        .collect();
    let n = replay.len();
    replay.sort();
    replay.dedup();
    assert_eq!(replay.len(), n, "a configuration twice: {stdout}");
    assert!(replay.iter().any(|r| r.starts_with("1 ")), "{stdout}");
    assert!(replay.iter().any(|r| r.starts_with("8 ")), "{stdout}");
}

#[test]
fn run_says_when_handoffs_asked_for_do_not_run() {
    let dir = fixture_dir("qwen3-untied");
    // A model directory runs its unfused schedule, whose kernels declare no handoff role.
    let out = vkfuse_ok(&[
        "run",
        dir.to_str().unwrap(),
        "--backend",
        "replay",
        "--ids",
        "1",
        "2",
        "--max-new-tokens",
        "2",
        "--handoffs",
        "on",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("note: --handoffs on: no level is handed over"),
        "{stderr}"
    );
    let out = vkfuse(&[
        "run",
        dir.to_str().unwrap(),
        "--ids",
        "1",
        "--handoffs",
        "maybe",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("expected auto, on or off"), "{stderr}");
}

#[test]
fn calibrate_writes_costs_that_compile_model_reads() {
    let path = std::env::temp_dir().join(format!("vkfuse-calibrate-{}.json", std::process::id()));
    let out = vkfuse_ok(&["calibrate", "-o", path.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    for row in [
        "GB/s",
        "barrier µs",
        "dispatch µs",
        "compute units",
        "wrote",
    ] {
        assert!(stdout.contains(row), "{row}: {stdout}");
    }
    // The file is what the compiler's reader accepts (every cost positive), named after the
    // device it measured.
    let text = std::fs::read_to_string(&path).unwrap();
    let cost = vkfuse_compiler::fuse::cost::DeviceCost::from_json(&text).unwrap();
    let device = stdout
        .lines()
        .next()
        .unwrap()
        .trim_start_matches("device: ");
    assert_eq!(cost.name, device);
    std::fs::remove_file(&path).ok();
    // Without -o, the JSON is the last line.
    let out = vkfuse_ok(&["calibrate"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    vkfuse_compiler::fuse::cost::DeviceCost::from_json(stdout.lines().last().unwrap()).unwrap();
}

/// `calibrate -o` onto something that is not a file (a folder here) is refused before anything
/// is measured, as compile-model's -o is: the costs go through a partial file renamed over the
/// path, which would replace it.
#[test]
fn calibrate_refuses_an_output_that_is_not_a_file() {
    let dir = std::env::temp_dir().join(format!("vkfuse-calibrate-dir-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = vkfuse(&["calibrate", "-o", dir.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("-o"), "{stderr}");
    assert!(
        stderr.contains("not a regular file") || stderr.contains("give a file path"),
        "{stderr}"
    );
    // Nothing measured, nothing left beside it.
    assert!(!String::from_utf8_lossy(&out.stdout).contains("GB/s"));
    assert!(std::fs::read_dir(&dir).unwrap().next().is_none());
    std::fs::remove_dir(&dir).unwrap();
}

/// `vkfuse kernels FILE`: one row per kernel of the schedule, with the dispatches that run it
/// (a band's alternative counts), its workgroup size on this device and the driver's
/// statistics where it offers them (lavapipe does not: then it says so). The schedule has an
/// attention band, so the block's own kernel and its band's each run once per layer.
#[test]
fn kernels_lists_every_kernel_with_its_driver_statistics() {
    let opts = vkfuse_compiler::fuse::FuseOptions {
        attention_splits: Some(4),
        attention_bands: Some(vec![vkfuse_compiler::fuse::bands::AttentionBand {
            below: 48,
            splits: 2,
            workgroup: 64,
        }]),
        ..Default::default()
    };
    let (model, schedule, _) = vkfuse_tests::fused_schedule_with("qwen3-tied", &opts);
    let path = std::env::temp_dir().join(format!("vkfuse-kernels-{}.vkf", std::process::id()));
    schedule.write_file(&path, &model.tensors).unwrap();
    // A damaged weight byte (the last before the 16-byte trailer): the kernels are still
    // listed, since no weight is uploaded (as `inspect`), where a decode refuses the file.
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() - 17;
    bytes[at] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let refused = vkfuse(&["run", path.to_str().unwrap(), "--ids", "1"]);
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("checksum"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    // --representations: a file where its folder belongs, or above it, is refused by name; a
    // folder is made only where the driver offers something to write into it.
    let representations = |dir: &std::path::Path| {
        vkfuse(&[
            "kernels",
            path.to_str().unwrap(),
            "--representations",
            dir.to_str().unwrap(),
        ])
    };
    for dir in [path.clone(), path.join("new")] {
        let out = representations(&dir);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        let said = format!("{} is a file, not a folder", path.display());
        assert!(stderr.contains(&said), "{stderr}");
    }
    let reps = std::env::temp_dir().join(format!("vkfuse-reps-{}/new", std::process::id()));
    let out = representations(&reps);
    assert!(out.status.success(), "{out:?}");
    let nothing = String::from_utf8_lossy(&out.stdout).contains("nothing written");
    assert_eq!(reps.exists(), !nothing, "{}", reps.display());
    std::fs::remove_dir_all(reps.parent().unwrap()).ok();
    let out = vkfuse_ok(&["kernels", path.to_str().unwrap()]);
    std::fs::remove_file(&path).ok();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = stdout.lines();
    let head = lines.next().unwrap();
    let offered = head.contains("with the driver's statistics");
    assert!(
        offered || head.contains("offers no pipeline statistics"),
        "{head}"
    );
    let rows: Vec<&str> = lines.skip(1).collect();
    assert_eq!(rows.len(), schedule.kernels.len(), "{stdout}");
    let layers = model.config.num_layers;
    let mut attention = 0;
    let mut runs = 0;
    for (i, (row, k)) in rows.iter().zip(&schedule.kernels).enumerate() {
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols[0], i.to_string(), "{row}");
        assert!(row.contains(&k.label), "{row}");
        let n: usize = cols[1].parse().unwrap();
        runs += n;
        if k.label.starts_with("fused_attention[") {
            assert_eq!(n, layers, "{row}");
            attention += 1;
        }
        // Statistics, or the dash where the device offers none.
        assert_eq!(row.trim_end().ends_with(" -"), !offered, "{row}");
    }
    assert_eq!(attention, 2, "the block's kernel and its band's: {stdout}");
    assert_eq!(runs, schedule.dispatches.len() + layers, "{stdout}");
}

/// The qwen3-tied fixture and its fused schedule with the timeline probe recording `records`.
fn timed_fixture(
    records: Records,
) -> (
    vkfuse_compiler::import::Model,
    vkfuse_runtime::schedule::Schedule,
) {
    use vkfuse_compiler::fuse::{lower_fused, FuseOptions};
    use vkfuse_compiler::lower::{Meta, SpirvCache};
    let model = vkfuse_compiler::import::load(&fixture_dir("qwen3-tied")).unwrap();
    let program =
        vkfuse_compiler::trace::trace(&model, &vkfuse_compiler::trace::TraceOptions::default())
            .unwrap();
    let (timed, _) = lower_fused(
        &program,
        &Meta::of(&model),
        &mut SpirvCache::timeline(records),
        &FuseOptions::default(),
    )
    .unwrap();
    (model, timed)
}

/// `vkfuse timeline FILE`: a schedule compiled with the timeline probe runs its steps and prints
/// one step dispatch by dispatch, the medians per kernel and the clock check; `--json` holds a
/// record of four clock readings for every workgroup of every dispatch of every timed step. A
/// schedule without the probe, and a first position of 0, are refused by name.
#[test]
fn timeline_runs_a_probed_schedule_and_refuses_others() {
    let (model, timed) = timed_fixture(Records::Times);
    let dir = std::env::temp_dir();
    let id = std::process::id();
    let (path, plain, json) = (
        dir.join(format!("vkfuse-timeline-{id}.vkf")),
        dir.join(format!("vkfuse-timeline-plain-{id}.vkf")),
        dir.join(format!("vkfuse-timeline-{id}.json")),
    );
    timed.write_file(&path, &model.tensors).unwrap();
    let (_, untimed, _) = vkfuse_tests::fused_schedule("qwen3-tied");
    untimed.write_file(&plain, &model.tensors).unwrap();
    let p = path.to_str().unwrap();
    let out = vkfuse_ok(&[
        "timeline",
        p,
        "--position",
        "4",
        "--steps",
        "3",
        "--tokens-per-submit",
        "2",
        "--json-out",
        json.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The records and the submits' timestamps read one clock: the check says they agree.
    for needle in [
        "step 1, dispatch by dispatch",
        "per kernel",
        "clock check",
        "about 1 : 1",
    ] {
        assert!(stdout.contains(needle), "`{needle}` in {stdout}");
    }
    // No SMs recorded, no table of late workgroups by SM.
    assert!(!stdout.contains("workgroups that began"), "{stdout}");
    let records: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = records.as_array().unwrap();
    assert_eq!(runs.len(), 3 * timed.dispatches.len());
    for r in runs {
        let d = &timed.dispatches[r["dispatch"].as_u64().unwrap() as usize];
        let groups = r["groups"].as_array().unwrap();
        assert_eq!(
            groups.len() as u32,
            d.workgroups.iter().product::<u32>(),
            "{r}"
        );
        // Four readings, the end (taken from its low half and the begin's) not before the
        // begin; no SMs where the kernels do not record them.
        assert!(
            groups.iter().all(|g| {
                let g: Vec<u64> = g
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap())
                    .collect();
                g.len() == 4 && g[3] >= g[0] && g[3] - g[0] < 1_000_000_000
            }),
            "{r}"
        );
        assert!(r.get("sms").is_none(), "{r}");
    }
    let refused = vkfuse(&["timeline", plain.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("compile-model --timeline"), "{stderr}");
    let zero = vkfuse(&["timeline", p, "--position", "0"]);
    assert!(!zero.status.success());
    assert!(String::from_utf8_lossy(&zero.stderr).contains("--position"));
    let past = vkfuse(&["timeline", p, "--steps", "3", "--show-step", "3"]);
    let stderr = String::from_utf8_lossy(&past.stderr);
    assert_eq!(past.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--show-step 3: the timed steps are 0 to 2"),
        "{stderr}"
    );
    // A --json-out folder that does not exist is refused before anything is timed (by its old
    // name, --json, too).
    let missing = dir
        .join(format!("vkfuse-timeline-none-{id}"))
        .join("t.json");
    let lost = vkfuse(&["timeline", p, "--json", missing.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&lost.stderr);
    assert_eq!(lost.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--json-out") && stderr.contains("does not exist"),
        "{stderr}"
    );
    assert!(
        lost.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&lost.stdout)
    );
    // Decoding with the probed schedule says what it is.
    let run = vkfuse_ok(&["run", p, "--ids", "1", "--max-new-tokens", "2"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("compiled with --timeline"), "{stderr}");
    for f in [&path, &plain, &json] {
        std::fs::remove_file(f).ok();
    }
}

/// `compile-model --timeline-sm`'s schedules record each workgroup's SM: where the device reads
/// SM ids (NVIDIA's VK_NV_shader_sm_builtins) `vkfuse timeline` writes them into the JSON, one
/// per workgroup, and lists the late workgroups by what ran before them on their SMs; where it
/// cannot (lavapipe) the schedule is refused by the extension's name.
#[test]
fn timeline_sm_ids_are_recorded_where_the_device_reads_them_and_refused_by_name_elsewhere() {
    let (model, timed) = timed_fixture(Records::TimesAndSms);
    let dir = std::env::temp_dir();
    let id = std::process::id();
    let (path, json) = (
        dir.join(format!("vkfuse-timeline-sm-{id}.vkf")),
        dir.join(format!("vkfuse-timeline-sm-{id}.json")),
    );
    timed.write_file(&path, &model.tensors).unwrap();
    let p = path.to_str().unwrap();
    let out = vkfuse(&[
        "timeline",
        p,
        "--position",
        "4",
        "--steps",
        "2",
        "--json-out",
        json.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        let records: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        for r in records.as_array().unwrap() {
            let groups = r["groups"].as_array().unwrap().len();
            let sms = r["sms"]
                .as_array()
                .unwrap_or_else(|| panic!("no sms in {r}"));
            assert_eq!(sms.len(), groups, "{r}");
            assert!(sms.iter().all(|s| s.as_u64().unwrap() < 4096), "{r}");
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        for needle in ["workgroups that began", "per kernel"] {
            assert!(stdout.contains(needle), "`{needle}` in {stdout}");
        }
    } else {
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("VK_NV_shader_sm_builtins") && stderr.contains("--timeline-sm"),
            "{stderr}"
        );
    }
    for f in [&path, &json] {
        std::fs::remove_file(f).ok();
    }
}

/// A KV capacity the host cannot allocate for the reference backend is an error naming the
/// state and its size, not an abort (a process limited to 3 GB of address space asked for
/// 16777216 slots: 4 GiB per cache).
#[test]
fn a_reference_state_the_host_cannot_allocate_is_a_clear_error() {
    let model = fixture_dir("qwen3-tied");
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v 3000000 && exec '{}' run '{}' --backend reference --ids 1,2 \
             --max-new-tokens 2 --max-context 16777216",
            env!("CARGO_BIN_EXE_vkfuse"),
            model.display()
        ))
        .output()
        .expect("sh runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("state `") && stderr.contains("GiB of host memory"),
        "{stderr}"
    );
    assert!(stderr.contains("lower --max-context"), "{stderr}");
}

/// `--persistent units` where no region runs says why, in `run` and in `generate` alike: a
/// chained schedule offers none; an unchained one offers some, but lavapipe does not report its
/// compute units (`--persistent 1` runs them there).
#[test]
fn persistent_regions_that_do_not_run_are_named() {
    let dir = std::env::temp_dir();
    let id = std::process::id();
    let (chained, unchained) = (
        dir.join(format!("vkfuse-regions-chained-{id}.vkf")),
        dir.join(format!("vkfuse-regions-unchained-{id}.vkf")),
    );
    let (model, schedule, _) = vkfuse_tests::fused_schedule("qwen3-tied");
    schedule.write_file(&chained, &model.tensors).unwrap();
    let opts = vkfuse_compiler::fuse::FuseOptions {
        chain: false,
        ..Default::default()
    };
    let (_, schedule, _) = vkfuse_tests::fused_schedule_with("qwen3-tied", &opts);
    assert!(!schedule.persistent.is_empty());
    schedule.write_file(&unchained, &model.tensors).unwrap();
    // `--persistent units` runs the regions where the device reports its compute units (NVIDIA,
    // AMD), and says why not elsewhere (lavapipe).
    let (device, _) = vkfuse_tests::validated_device();
    let reports_units = device.info().compute_units.is_some();
    drop(device);
    for (file, persistent, note) in [
        (&chained, "units", Some("the schedule offers none")),
        (
            &unchained,
            "units",
            (!reports_units).then_some("does not report its compute units"),
        ),
        (&unchained, "1", None),
    ] {
        for command in ["run", "generate"] {
            let out = vkfuse_ok(&[
                command,
                file.to_str().unwrap(),
                "--ids",
                "1,2",
                "--max-new-tokens",
                "1",
                "--persistent",
                persistent,
            ]);
            let stderr = String::from_utf8_lossy(&out.stderr);
            let said = stderr.contains("note: --persistent: no persistent region runs");
            match note {
                Some(why) => assert!(said && stderr.contains(why), "{command}: {stderr}"),
                None => assert!(!said, "{command}: {stderr}"),
            }
        }
    }
    // A model directory is compiled unfused: no regions, and the note says that, not a chain.
    let model_dir = fixture_dir("qwen3-tied");
    for command in [&["run", "--backend", "replay"][..], &["generate"]] {
        let mut args = vec![command[0], model_dir.to_str().unwrap()];
        args.extend(&command[1..]);
        args.extend(["--ids", "1,2", "--max-new-tokens", "1", "--persistent", "1"]);
        let out = vkfuse_ok(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("a model directory is compiled in memory unfused"),
            "{command:?}: {stderr}"
        );
    }
    // The reference backend has no regions to run: refused, as --tokens-per-submit is.
    let out = vkfuse(&[
        "run",
        model_dir.to_str().unwrap(),
        "--ids",
        "1",
        "--persistent",
        "1",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the reference backend has none"),
        "{stderr}"
    );
    std::fs::remove_file(&chained).ok();
    std::fs::remove_file(&unchained).ok();
}

/// `--logits-out` with chains longer than one submit can return the logits of (a vocabulary of
/// 600000 on lavapipe's 128 MiB binding range: 55 steps) is refused before anything decodes,
/// naming the limit; chains that fit run. Built for lavapipe's range: on a device whose range is
/// larger the table would be gigabytes, and the test says so and checks nothing.
#[test]
fn logits_chains_past_the_logits_ring_are_refused_before_decoding() {
    let (device, _) = vkfuse_tests::validated_device();
    let max = device.info().max_storage_buffer_range;
    drop(device);
    if max > 128 << 20 {
        eprintln!("skipped: the device's binding range is {max} bytes, past lavapipe's 128 MiB");
        return;
    }
    let id = std::process::id();
    let dir = std::env::temp_dir().join(format!("vkfuse-cli-big-vocabulary-{id}"));
    vkfuse_tests::write_big_vocabulary(&dir, 600_000);
    let (model, _, schedule) = vkfuse_tests::compiled_dir(&dir);
    let file = dir.with_extension("vkf");
    schedule.write_file(&file, &model.tensors).unwrap();
    let npy = dir.with_extension("npy");
    let run = |k: &str| {
        vkfuse(&[
            "run",
            file.to_str().unwrap(),
            "--ids",
            "1",
            "--max-new-tokens",
            "64",
            "--tokens-per-submit",
            k,
            "--logits-out",
            npy.to_str().unwrap(),
        ])
    };
    refused_alone(
        &run("64"),
        &[
            "--tokens-per-submit 64 with --logits-out",
            "maxStorageBufferRange",
        ],
    );
    let out = run("8");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).ok();
    std::fs::remove_file(&file).ok();
    std::fs::remove_file(file.with_extension("vkf.pipelines")).ok();
    std::fs::remove_file(&npy).ok();
}

/// The int8 chains (the fused default for q8_0/q4_0) quantise blocks of 32 inputs across 8
/// invocations of a subgroup: a device with narrower subgroups refuses them by name, and takes
/// `--dots f16`. lavapipe narrows its subgroups to 4 with `LP_NATIVE_VECTOR_WIDTH=128` (other
/// drivers ignore the variable, and then both run).
#[test]
fn int8_chains_are_refused_on_subgroups_narrower_than_8() {
    let dir = fixture_dir("qwen3-tied");
    let narrow = |dots: &str| {
        Command::new(env!("CARGO_BIN_EXE_vkfuse"))
            .args(["bench", dir.to_str().unwrap(), "--weights", "q8_0"])
            .args(["--tokens", "4", "--dots", dots])
            .env("LP_NATIVE_VECTOR_WIDTH", "128")
            .output()
            .expect("vkfuse runs")
    };
    let listing = Command::new(env!("CARGO_BIN_EXE_vkfuse"))
        .arg("devices")
        .env("LP_NATIVE_VECTOR_WIDTH", "128")
        .output()
        .expect("vkfuse runs");
    let listing = String::from_utf8_lossy(&listing.stdout).to_string();
    let out = narrow("int8");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if listing.contains("subgroups:  size 4") {
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        // bench compiled the directory itself: the fix is its own flag, not compile-model's.
        for needle in [
            "subgroups hold 4",
            "run this command with `--dots f16` in place of its --dots",
            "fused_chain",
        ] {
            assert!(stderr.contains(needle), "`{needle}` not in: {stderr}");
        }
        assert!(!stderr.contains("compile-model"), "{stderr}");
    } else {
        assert!(out.status.success(), "{stderr}");
    }
    let out = narrow("f16");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
