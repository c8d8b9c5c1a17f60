//! The runtime's own kernel, `kernels/glsl/step_io.comp`, reaches the runtime as committed
//! SPIR-V (`runtime/src/session/step_io.spv`: the runtime has no compiler). This checks that
//! the committed words are what the source compiles to; `VKFUSE_BLESS=1` rewrites them.

const SPV: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../runtime/src/session/step_io.spv"
);

#[test]
fn the_committed_step_io_spirv_is_its_source_compiled() {
    let words = vkfuse_compiler::kernels::compile("step_io", &[]).expect("step_io compiles");
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    if std::env::var("VKFUSE_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(SPV, &bytes).expect("write step_io.spv");
    }
    let committed = std::fs::read(SPV).expect("read step_io.spv");
    assert!(
        committed == bytes,
        "runtime/src/session/step_io.spv is not kernels/glsl/step_io.comp compiled ({} bytes \
         against {}): run this test with VKFUSE_BLESS=1 after changing the source",
        committed.len(),
        bytes.len()
    );
}
