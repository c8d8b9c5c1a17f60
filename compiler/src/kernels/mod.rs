//! Kernels: which GLSL kernel runs each op, with which defines, specialization constants and
//! dispatch geometry ([`select`]), and GLSL -> SPIR-V ([`compile`]; [`timeline`] wraps a kernel
//! for the timing probe).
//!
//! The kernel ABI (shared with the executors): descriptor set 0 holds storage buffers only;
//! binding 0 is the op's result and bindings 1..=arity its operands in IR order, except
//! `kv_write` (0 = the KV cache state, updated in place; 1 = x, 2 = pos) and `write_state`
//! (0 = the state buffer, 1 = the value). Every binding is indexed from 0. f32 and i32 are 4-byte
//! elements; f16 and bf16 are packed two per word, the even element in the low half; q8_0 and q4_0
//! are rows of codes then f16 scales (`kernels/glsl/quant.glsl`). Positions
//! are always read from their buffer on the device, so one recorded command buffer serves every
//! step. `weight`, `weight_stack`, `read_state` and `reshape` alias existing buffers and have
//! no kernel. Specialization constant 0 is always the workgroup size.

mod call;
mod compile;
mod select;
pub mod timeline;

pub use call::KernelCall;
pub use compile::{compile, compile_source, compile_with, with_defines, KernelError};
pub(crate) use select::rope_inv_freq;
pub use select::{is_alias, select, MAX_WORKGROUPS_X};
pub(crate) use select::{knob, matvec_subgroups, matvec_tuning, vec4};
