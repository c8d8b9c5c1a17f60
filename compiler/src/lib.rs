//! vkfuse's compiler: a Hugging Face model in, one fused decode step out.
//!
//! The modules follow the pipeline: [`ir`] (the op IR), [`import`] (config and tensors),
//! [`trace`] (model -> one decode step), [`quant`] (the weight formats `--weights` converts
//! to), [`reference`](mod@reference) (the CPU interpreter, the oracle).

pub mod fuse;
pub mod import;
pub mod ir;
pub mod kernels;
pub mod lower;
pub mod npy;
pub mod plan;
pub mod quant;
pub mod reference;
pub mod regions;
pub mod trace;
