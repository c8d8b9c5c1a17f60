//! `compile-model`: writes a schedule with a report, prints the trace, and fails clearly.

use std::path::Path;
use std::process::Command;

fn compile_model(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_compile-model"))
        .args(args)
        .output()
        .expect("compile-model runs")
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
    let cases: [(&[&str], &str); 4] = [
        (&["/nonexistent"], "nothing to do"),
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
}
