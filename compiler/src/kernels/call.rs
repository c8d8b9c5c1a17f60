//! What the executor needs to create one op's pipeline and dispatch it.

use std::fmt;

/// Everything needed to create the pipeline of one op and dispatch it.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelCall {
    /// The GLSL file's name, e.g. `"matvec"` (see `vkfuse_kernels::KERNELS`).
    pub kernel: &'static str,
    /// Preprocessor defines, sorted by name; part of the pipeline identity (with `kernel`, they
    /// decide the SPIR-V).
    pub defines: Vec<(String, String)>,
    /// Specialization constants: `constant_id` i is `spec_constants[i]` (f32 as bits). Constant 0
    /// is the workgroup size.
    pub spec_constants: Vec<u32>,
    /// Push constants; may be empty.
    pub push_constants: Vec<u8>,
    /// Workgroup counts; more than [`MAX_WORKGROUPS_X`](super::MAX_WORKGROUPS_X) workgroups are
    /// split over x and y and kernels linearise them.
    pub workgroups: [u32; 3],
    /// Storage-buffer bindings: 1 + the op's arity.
    pub bindings: usize,
}

impl KernelCall {
    /// The subgroups per workgroup the runtime keeps when it chooses the workgroup size at
    /// load (`KernelDecl::subgroups`): the plain matvec's; every other kernel's size is as
    /// compiled.
    pub fn subgroups(&self) -> Option<u32> {
        match self.kernel {
            "matvec" => super::matvec_subgroups(&self.spec_constants),
            _ => None,
        }
    }
}

impl fmt::Display for KernelCall {
    /// `matvec[DTYPE_1=BF16] spec=[128,1024,64,2,1] groups=512x1x1 bindings=3`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kernel)?;
        if !self.defines.is_empty() {
            let defines: Vec<String> = self
                .defines
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            write!(f, "[{}]", defines.join(","))?;
        }
        let spec: Vec<String> = self.spec_constants.iter().map(u32::to_string).collect();
        let [x, y, z] = self.workgroups;
        write!(
            f,
            " spec=[{}] groups={x}x{y}x{z} bindings={}",
            spec.join(","),
            self.bindings
        )?;
        if !self.push_constants.is_empty() {
            write!(f, " push={}B", self.push_constants.len())?;
        }
        Ok(())
    }
}
