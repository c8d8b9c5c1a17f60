//! `compile-model --timeline`, a timing probe: every kernel's source wrapped so that each of
//! its workgroups records when it began and ended on the device's realtime clock
//! (`kernels/glsl/timeline.glsl`), for `vkfuse timeline` to lay out what ran when inside a
//! replayed step. The kernels compute what they did; they only write their records besides.

/// What the probe records of each workgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Records {
    /// When it began and ended, and the two points its kernel marks.
    Times,
    /// Those, and the SM it ran on (`gl_SMIDNV`: NVIDIA's VK_NV_shader_sm_builtins, which the
    /// device must then offer): where a late workgroup waited, and for whom.
    TimesAndSms,
}

/// `source` (a compute shader whose first line is `#version`) with its `main` renamed and the
/// timeline's `main` around it, recording `records`.
pub fn wrap(source: &str, records: Records) -> String {
    let at = source.find('\n').map_or(source.len(), |i| i + 1);
    let (version, body) = source.split_at(at);
    let sm = match records {
        Records::Times => "",
        Records::TimesAndSms => {
            "#extension GL_NV_shader_sm_builtins : require\n#define TIMELINE_SM 1\n"
        }
    };
    // The marks are invocation 0's clock at two points the kernel names (TIMELINE_MARK),
    // declared before its body so that it can set them.
    format!(
        "{version}#extension GL_GOOGLE_include_directive : require\n\
         #extension GL_EXT_shader_realtime_clock : require\n{sm}\
         #define main vkfuse_timed_main\n\
         uvec2 vkfuse_timeline_marks[2];\n\
         #define TIMELINE_MARK(i) if (gl_LocalInvocationIndex == 0u) vkfuse_timeline_marks[i] = clockRealtime2x32EXT()\n\
         {body}\n#undef main\n#include \"timeline.glsl\"\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn should_rename_main_after_the_version_line_and_include_the_wrapper_last() {
        let w = wrap("#version 450\nvoid main() {}\n", Records::Times);
        assert!(w.starts_with("#version 450\n"), "{w}");
        let rename = w.find("#define main vkfuse_timed_main").expect("renamed");
        assert!(rename < w.find("void main()").expect("body kept"));
        assert!(w.trim_end().ends_with("#include \"timeline.glsl\""), "{w}");
    }

    #[test]
    fn wrapped_kernels_compile() {
        // The realtime clock and device addresses: the capabilities the runtime looks for;
        // the SM ids' only where they are recorded.
        const SHADER_CLOCK: u32 = 5055;
        const PHYSICAL_STORAGE_BUFFER_ADDRESSES: u32 = 5347;
        const SHADER_SM_BUILTINS_NV: u32 = 5373;
        for records in [Records::Times, Records::TimesAndSms] {
            let words = super::super::compile::compile_with(
                "copy",
                &[
                    ("DTYPE_1".into(), "F32".into()),
                    ("DTYPE_2".into(), "F32".into()),
                ],
                Some(records),
            )
            .expect("a wrapped library kernel compiles");
            let declares = |cap: u32| {
                words
                    .windows(2)
                    .any(|w| w[0] == (2 << 16 | 17) && w[1] == cap)
            };
            for cap in [SHADER_CLOCK, PHYSICAL_STORAGE_BUFFER_ADDRESSES] {
                assert!(declares(cap), "capability {cap} declared ({records:?})");
            }
            assert_eq!(
                declares(SHADER_SM_BUILTINS_NV),
                records == Records::TimesAndSms,
                "{records:?}"
            );
        }
    }
}
