//! `vkfuse generate`: text in through the schedule's recorded tokenizer (the ids transformers'
//! tokenizer gives), the same greedy ids as `vkfuse run`, text streamed while decoding, EOS
//! respected, and clear errors for what a user can get wrong.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use vkfuse_tests::{compiled_fixture, expected, fixture_dir, write_fixture_file};

fn vkfuse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vkfuse"))
        .args(args)
        .output()
        .expect("vkfuse runs")
}

fn ok(args: &[&str]) -> String {
    let out = vkfuse(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

fn temp(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}.vkf", std::process::id()))
}

fn last_json(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout.lines().last().expect("a JSON line")).expect("JSON")
}

fn u32s(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("a list")
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn ids_arg(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// The first `tokenizer_checks` entry of qwen3-tied: a text and transformers' ids for it.
fn tokenizer_check() -> (String, Vec<u32>) {
    let path = fixture_dir("qwen3-tied").join("reference.json");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let check = &v["tokenizer_checks"][0];
    (
        check["text"].as_str().unwrap().to_string(),
        u32s(&check["ids"]),
    )
}

#[test]
fn generate_tokenizes_like_transformers_and_decodes_the_ids_vkfuse_run_decodes() {
    let file = temp("generate-qwen3");
    write_fixture_file("qwen3-tied", &file);
    let file = file.to_str().unwrap();
    let (prompt, prompt_ids) = tokenizer_check();
    let n = "20";

    let stdout = ok(&[
        "generate",
        file,
        "--prompt",
        &prompt,
        "-n",
        n,
        "--ignore-eos",
        "--json",
    ]);
    let json = last_json(&stdout);
    assert_eq!(
        u32s(&json["prompt_ids"]),
        prompt_ids,
        "the recorded tokenizer"
    );
    let ids = u32s(&json["ids"]);
    assert_eq!(ids.len(), 20);
    assert_eq!(json["backend"], "replay");
    assert_eq!(json["stopped_at_eos"], false);
    assert_eq!(json["descriptor_writes_per_token"], 0.0);
    // The streamed text, then the JSON line: the text is that of the ids.
    let text = json["text"].as_str().unwrap();
    let printed = &stdout[..stdout.len() - stdout.lines().last().unwrap().len() - 1];
    assert_eq!(printed, format!("{text}\n"));

    let run = last_json(&ok(&[
        "run",
        file,
        "--ids",
        &ids_arg(&prompt_ids),
        "--max-new-tokens",
        n,
        "--json",
    ]));
    assert_eq!(
        u32s(&run["ids"]),
        ids,
        "generate and run decode the same ids"
    );

    // K steps per submit, and eager, give the same ids.
    for extra in [&["--tokens-per-submit", "8"][..], &["--backend", "eager"]] {
        let args = [
            &[
                "generate",
                file,
                "--prompt",
                &prompt,
                "-n",
                n,
                "--ignore-eos",
                "--json",
            ][..],
            extra,
        ]
        .concat();
        assert_eq!(u32s(&last_json(&ok(&args))["ids"]), ids, "{extra:?}");
    }
    std::fs::remove_file(file).ok();
}

#[test]
fn generate_on_a_model_directory_compiles_it_and_uses_its_tokenizer() {
    let dir = fixture_dir("qwen3-tied");
    let dir = dir.to_str().unwrap();
    let (prompt, prompt_ids) = tokenizer_check();
    let json = last_json(&ok(&[
        "generate",
        dir,
        "--prompt",
        &prompt,
        "-n",
        "12",
        "--ignore-eos",
        "--json",
    ]));
    assert_eq!(u32s(&json["prompt_ids"]), prompt_ids);
    // Compiled in memory unfused, as `vkfuse run` compiles a directory.
    assert!(
        json["dispatches_per_token"].as_f64().unwrap() > 13.0,
        "{json}"
    );
    let run = last_json(&ok(&[
        "run",
        dir,
        "--backend",
        "replay",
        "--ids",
        &ids_arg(&prompt_ids),
        "--max-new-tokens",
        "12",
        "--json",
    ]));
    assert_eq!(json["ids"], run["ids"]);
}

#[test]
fn a_model_without_a_tokenizer_takes_ids_and_prints_transformers_greedy_ids() {
    let want = expected("llama-gqa");
    let dir = fixture_dir("llama-gqa");
    assert!(!dir.join("tokenizer.json").exists());
    let n = want.greedy_ids.len().to_string();
    let stdout = ok(&[
        "generate",
        dir.to_str().unwrap(),
        "--ids",
        &ids_arg(&want.prompt_ids),
        "-n",
        &n,
        "--ignore-eos",
    ]);
    assert_eq!(stdout, format!("{}\n", ids_arg(&want.greedy_ids)));
}

#[test]
fn a_prompt_without_a_tokenizer_is_a_clear_error() {
    let file = temp("generate-llama");
    write_fixture_file("llama-gqa", &file);
    for model in [file.clone(), fixture_dir("llama-gqa")] {
        let out = vkfuse(&["generate", model.to_str().unwrap(), "--prompt", "hello"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("no tokenizer"), "{stderr}");
        assert!(stderr.contains("--ids"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(out.stdout.is_empty());
    }
    std::fs::remove_file(&file).ok();
}

#[test]
fn bad_input_to_generate_is_a_clear_error_not_a_panic() {
    let qwen = fixture_dir("qwen3-tied");
    let qwen = qwen.to_str().unwrap();
    for (args, needle) in [
        (vec!["generate", qwen], "--prompt <PROMPT>|--ids"),
        (
            vec!["generate", qwen, "--prompt", "a", "--ids", "1"],
            "cannot be used with",
        ),
        (
            vec!["generate", qwen, "--prompt", ""],
            "the prompt is empty",
        ),
        (
            vec!["generate", qwen, "--ids", "372"],
            "outside the vocabulary of 372",
        ),
        (
            vec!["generate", qwen, "--ids", "1", "-n", "600"],
            "KV capacity of 512",
        ),
        (
            vec![
                "generate",
                qwen,
                "--ids",
                "1",
                "--backend",
                "eager",
                "--tokens-per-submit",
                "2",
            ],
            "needs --backend replay",
        ),
        (
            vec!["generate", "/no/such/model", "--ids", "1"],
            "/no/such/model",
        ),
        (
            vec!["generate", qwen, "--ids", "1", "-n", "-1"],
            "invalid value '-1' for '--max-new-tokens <N>'",
        ),
        // Space-separated ids take the model after them as one more id: the error says so.
        (
            vec!["generate", "--ids", "1", "2", qwen],
            "give the model before --ids",
        ),
    ] {
        let out = vkfuse(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    }
}

/// A copy of the qwen3-tied fixture (a folder `tag-PID` under the target's temp folder) whose
/// tokenizer.json is `json`.
fn with_tokenizer(tag: &str, json: &str) -> PathBuf {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(fixture_dir("qwen3-tied")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    std::fs::write(dir.join("tokenizer.json"), json).unwrap();
    dir
}

/// A prompt the tokenizer covers none of is not called empty: the error names it and points
/// to --ids.
#[test]
fn a_prompt_the_tokenizer_gives_no_ids_for_is_named() {
    let dir = with_tokenizer(
        "no-vocab",
        r#"{"version":"1.0","model":{"type":"BPE","vocab":{},"merges":[]}}"#,
    );
    let out = vkfuse(&[
        "generate",
        dir.to_str().unwrap(),
        "--prompt",
        "hi",
        "-n",
        "1",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("the tokenizer gives no token ids for the prompt \"hi\""),
        "{stderr}"
    );
    // Ids decode, but to no text: a note says so instead of an empty line alone.
    let out = vkfuse(&["generate", dir.to_str().unwrap(), "--ids", "1,2", "-n", "2"]);
    std::fs::remove_dir_all(&dir).ok();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("the tokenizer has no text for any of the 2 generated ids"),
        "{stderr}"
    );
}

/// A tokenizer.json of another model gives ids past the schedule's vocabulary: the error says
/// the tokenizer gave them, not only that an id is out of range.
#[test]
fn a_prompt_id_past_the_vocabulary_names_the_tokenizer() {
    let dir = with_tokenizer(
        "big-vocab",
        r#"{"version":"1.0","model":{"type":"WordLevel","vocab":{"hi":99999},"unk_token":"hi"}}"#,
    );
    let out = vkfuse(&[
        "generate",
        dir.to_str().unwrap(),
        "--prompt",
        "hi",
        "-n",
        "1",
    ]);
    std::fs::remove_dir_all(&dir).ok();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("token id 99999 is outside the vocabulary of 372")
            && stderr.contains("the tokenizer gave it for the prompt"),
        "{stderr}"
    );
}

/// A tokenizer.json that is JSON but not a tokenizer: a prompt is refused, naming it and
/// pointing to --ids; ids decode, and the generated ids are printed as numbers with a warning.
#[test]
fn a_tokenizer_that_does_not_load_refuses_a_prompt_but_not_ids() {
    let dir = with_tokenizer(
        "bad-tokenizer",
        r#"{"version":"1.0","model":{"type":"Nope"}}"#,
    );
    let model = dir.to_str().unwrap();
    let out = vkfuse(&["generate", model, "--prompt", "hi", "-n", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("the tokenizer does not load") && stderr.contains("--ids"),
        "{stderr}"
    );
    let want = expected("qwen3-tied");
    let prompt = ids_arg(&want.prompt_ids);
    let out = vkfuse(&[
        "generate",
        model,
        "--ids",
        &prompt,
        "-n",
        "2",
        "--ignore-eos",
    ]);
    std::fs::remove_dir_all(&dir).ok();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("the generated ids are printed as numbers"),
        "{stderr}"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{}\n", ids_arg(&want.greedy_ids[..2]))
    );
}

#[test]
fn generate_stops_after_an_eos_id_unless_told_to_ignore_it() {
    // The fixture's random weights never produce its real EOS: declare one they do produce.
    let want = expected("qwen3-tied");
    let at = 3;
    let eos = want.greedy_ids[at];
    let first = want.greedy_ids.iter().position(|&t| t == eos).unwrap();
    let (model, mut schedule) = compiled_fixture("qwen3-tied");
    schedule.meta.eos_token_ids = vec![eos];
    let file = temp("generate-eos");
    schedule.write_file(&file, &model.tensors).unwrap();
    let file = file.to_str().unwrap();
    let prompt = ids_arg(&want.prompt_ids);
    let n = want.greedy_ids.len().to_string();

    let json = last_json(&ok(&[
        "generate", file, "--ids", &prompt, "-n", &n, "--json",
    ]));
    assert_eq!(u32s(&json["ids"]), want.greedy_ids[..=first]);
    assert_eq!(json["stopped_at_eos"], true);
    let json = last_json(&ok(&[
        "generate",
        file,
        "--ids",
        &prompt,
        "-n",
        &n,
        "--json",
        "--ignore-eos",
    ]));
    assert_eq!(u32s(&json["ids"]), want.greedy_ids);
    assert_eq!(json["stopped_at_eos"], false);
    std::fs::remove_file(file).ok();
}

#[test]
fn generate_prints_text_while_it_is_still_decoding() {
    let file = temp("generate-stream");
    write_fixture_file("qwen3-tied", &file);
    // Hundreds of steps on lavapipe take seconds; the first text arrives long before.
    let mut child = Command::new(env!("CARGO_BIN_EXE_vkfuse"))
        .args(["generate", file.to_str().unwrap(), "--prompt", "The lamp"])
        .args(["-n", "300", "--ignore-eos"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("vkfuse runs");
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).expect("some text");
    let running = child.try_wait().unwrap().is_none();
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    assert!(child.wait().unwrap().success());
    assert!(running, "the first byte came only after decoding had ended");
    assert!(rest.len() > 100, "{} bytes", rest.len() + 1);
    std::fs::remove_file(&file).ok();
}
