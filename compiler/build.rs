//! Links Debian's static glslang and SPIRV-Tools under the `shaderc` crate.
//!
//! Debian 12's shared `libshaderc.so` does not carry glslang, so the `shaderc` crate is built
//! with `prefer-static-linking` against `SHADERC_LIB_DIR` (set in `.cargo/config.toml`), and the
//! static libraries that `libshaderc` itself needs are added here (`scripts/install-deps.sh`
//! installs them: `libshaderc-dev`, `glslang-dev`, `spirv-tools`).

const STATIC_LIBS: &[&str] = &[
    "glslang",
    "MachineIndependent",
    "OSDependent",
    "GenericCodeGen",
    "OGLCompiler",
    "SPIRV",
    "SPIRV-Tools-opt",
    "SPIRV-Tools",
    "glslang-default-resource-limits",
];

fn main() {
    println!("cargo:rerun-if-env-changed=SHADERC_LIB_DIR");
    println!("cargo:rerun-if-changed=build.rs");
    let dir =
        std::env::var("SHADERC_LIB_DIR").unwrap_or_else(|_| "/usr/lib/x86_64-linux-gnu".into());
    println!("cargo:rustc-link-search=native={dir}");
    for lib in STATIC_LIBS {
        println!("cargo:rustc-link-lib=static={lib}");
    }
}
