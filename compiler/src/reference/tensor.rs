//! The interpreter's values: f32 or i32 data with a shape, row-major.

use crate::ir::Shape;

#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    I32(Vec<i32>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Shape,
    pub data: Data,
}

impl Tensor {
    pub fn f32(dims: &[usize], data: Vec<f32>) -> Tensor {
        debug_assert_eq!(dims.iter().product::<usize>(), data.len());
        Tensor {
            shape: Shape::new(dims),
            data: Data::F32(data),
        }
    }
    pub fn i32(dims: &[usize], data: Vec<i32>) -> Tensor {
        Tensor {
            shape: Shape::new(dims),
            data: Data::I32(data),
        }
    }
    /// [`Tensor::zeros`], or None where the host cannot allocate it (a huge KV capacity), so
    /// that the caller can say so instead of the process aborting. The room is asked for
    /// fallibly first and given back: zeros() then takes zeroed pages the OS maps lazily, where
    /// writing the zeros into a fallible reservation would touch every page at once.
    pub fn try_zeros(shape: &Shape, int: bool) -> Option<Tensor> {
        let mut probe: Vec<u32> = Vec::new();
        probe.try_reserve_exact(shape.numel()).ok()?;
        drop(probe);
        Some(Tensor::zeros(shape, int))
    }
    pub fn zeros(shape: &Shape, int: bool) -> Tensor {
        let n = shape.numel();
        let data = if int {
            Data::I32(vec![0; n])
        } else {
            Data::F32(vec![0.0; n])
        };
        Tensor {
            shape: shape.clone(),
            data,
        }
    }
    /// The float data (the verifier guarantees operands have the dtype an op expects).
    pub fn f(&self) -> &[f32] {
        match &self.data {
            Data::F32(v) => v,
            Data::I32(_) => {
                panic!("reference: expected a float tensor (the verifier admits none here)")
            }
        }
    }
    pub fn i(&self) -> &[i32] {
        match &self.data {
            Data::I32(v) => v,
            Data::F32(_) => {
                panic!("reference: expected an i32 tensor (the verifier admits none here)")
            }
        }
    }
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }
}
