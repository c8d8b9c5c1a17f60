//! GLSL -> SPIR-V with shaderc. Callers cache the words per (kernel, defines): specialization
//! constants do not change the SPIR-V.

use shaderc::{
    CompileOptions, Compiler, EnvVersion, OptimizationLevel, ResolvedInclude, ShaderKind, TargetEnv,
};

/// Why a kernel did not compile.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("no kernel named `{0}` in vkfuse-kernels")]
    UnknownKernel(String),
    #[error("kernel `{kernel}` [{defines}] does not compile:\n{message}")]
    Compile {
        kernel: String,
        defines: String,
        message: String,
    },
    #[error("shaderc could not start: {0}")]
    Shaderc(String),
}

/// The SPIR-V (Vulkan 1.1 target) of `kernel` with `defines`; `#include "x.glsl"` resolves to
/// the headers of `vkfuse_kernels`. Errors name the kernel and its defines.
pub fn compile(kernel: &str, defines: &[(String, String)]) -> Result<Vec<u32>, KernelError> {
    compile_with(kernel, defines, None)
}

/// [`compile`], with the timeline probe's wrapper around the kernel where `timeline` says
/// what it records ([`super::timeline`]).
pub fn compile_with(
    kernel: &str,
    defines: &[(String, String)],
    timeline: Option<super::timeline::Records>,
) -> Result<Vec<u32>, KernelError> {
    let source =
        vkfuse_kernels::source(kernel).ok_or_else(|| KernelError::UnknownKernel(kernel.into()))?;
    let wrapped;
    let source = match timeline {
        Some(records) => {
            wrapped = super::timeline::wrap(source, records);
            wrapped.as_str()
        }
        None => source,
    };
    let list = defines
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let fail = |message: String| KernelError::Compile {
        kernel: kernel.to_string(),
        defines: list.clone(),
        message,
    };
    for (name, value) in defines {
        let ok =
            |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok(name) || !ok(value) {
            return Err(fail(format!(
                "define `{name}={value}` is not an identifier pair"
            )));
        }
    }
    let compiler = Compiler::new().map_err(|e| KernelError::Shaderc(e.to_string()))?;
    let mut options = CompileOptions::new().map_err(|e| KernelError::Shaderc(e.to_string()))?;
    options.set_target_env(TargetEnv::Vulkan, EnvVersion::Vulkan1_1 as u32);
    options.set_optimization_level(OptimizationLevel::Performance);
    options.set_warnings_as_errors();
    for (name, value) in defines {
        options.add_macro_definition(name, Some(value));
    }
    options.set_include_callback(|name, _kind, _from, _depth| {
        vkfuse_kernels::header(name)
            .map(|content| ResolvedInclude {
                resolved_name: name.to_string(),
                content: content.to_string(),
            })
            .ok_or_else(|| format!("no header `{name}` in vkfuse-kernels"))
    });
    let file = format!("{kernel}.comp");
    let artifact = compiler
        .compile_into_spirv(source, ShaderKind::Compute, &file, "main", Some(&options))
        .map_err(|e| fail(e.to_string()))?;
    Ok(artifact.as_binary().to_vec())
}

/// `source` with `#define NAME 1` after its first line (`#version`) for each name of the
/// comma-separated `names` (empty ones skipped): a choice of the fused kernels' GLSL
/// (`FuseOptions::f16_dots`) or a probe's (`VKFUSE_DEFINES`), the source unchanged where there
/// are none.
pub fn with_defines(source: &str, names: &str) -> String {
    let extra: String = names
        .split(',')
        .filter(|d| !d.is_empty())
        .map(|d| format!("#define {d} 1\n"))
        .collect();
    let at = source.find('\n').map_or(source.len(), |i| i + 1);
    format!("{}{extra}{}", &source[..at], &source[at..])
}

/// The SPIR-V of a generated kernel source (the fusion compiler's kernels), compiled exactly
/// as [`compile`] compiles the kernels of `vkfuse_kernels`: same target, optimisation, warnings
/// as errors, and `#include "x.glsl"` resolving to its headers. Errors name `label` and carry
/// the source with line numbers, so a bad generated expression can be read where it failed.
pub fn compile_source(label: &str, source: &str) -> Result<Vec<u32>, KernelError> {
    let compiler = Compiler::new().map_err(|e| KernelError::Shaderc(e.to_string()))?;
    let mut options = CompileOptions::new().map_err(|e| KernelError::Shaderc(e.to_string()))?;
    options.set_target_env(TargetEnv::Vulkan, EnvVersion::Vulkan1_1 as u32);
    options.set_optimization_level(OptimizationLevel::Performance);
    options.set_warnings_as_errors();
    options.set_include_callback(|name, _kind, _from, _depth| {
        vkfuse_kernels::header(name)
            .map(|content| ResolvedInclude {
                resolved_name: name.to_string(),
                content: content.to_string(),
            })
            .ok_or_else(|| format!("no header `{name}` in vkfuse-kernels"))
    });
    let file = format!("{label}.comp");
    let artifact = compiler
        .compile_into_spirv(source, ShaderKind::Compute, &file, "main", Some(&options))
        .map_err(|e| {
            let numbered: Vec<String> = source
                .lines()
                .enumerate()
                .map(|(i, l)| format!("{:4} {l}", i + 1))
                .collect();
            KernelError::Compile {
                kernel: label.to_string(),
                defines: "generated".to_string(),
                message: format!("{e}\n{}", numbered.join("\n")),
            }
        })?;
    Ok(artifact.as_binary().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn should_compile_a_kernel_with_its_headers() {
        let words = compile("matvec", &d(&[("DTYPE_1", "BF16")])).expect("compiles");
        assert_eq!(words[0], 0x0723_0203);
    }

    #[test]
    fn errors_name_the_kernel_and_defines() {
        let err = compile(
            "binary",
            &d(&[("DTYPE_1", "F32"), ("DTYPE_2", "F32"), ("OP", "POW")]),
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("`binary`") && msg.contains("OP=POW"), "{msg}");
        assert!(matches!(
            compile("nope", &[]),
            Err(KernelError::UnknownKernel(_))
        ));
    }
}
