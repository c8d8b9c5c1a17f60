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
