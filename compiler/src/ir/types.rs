//! Element types, shapes and value types of the IR.

use std::fmt;

/// Element type of a value. Activations are always `F32`; weights keep the dtype they were
/// stored in (the kernels read it directly) or the one `compile-model --weights` converted
/// them to, `I32` holds token ids, positions and indices.
///
/// `Q8_0` and `Q4_0` are ggml's block-quantised formats (32 weights per block with an f16
/// scale; `crate::quant`), only for the weight of a `matvec` or an `embedding`. They have no
/// size per element: a value of them is rows of [`DType::row_bytes`] each (the layout in
/// docs/schedule-format.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    I32,
    Q8_0,
    Q4_0,
}

impl DType {
    pub const ALL: [DType; 6] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::Q8_0,
        DType::Q4_0,
    ];

    /// Weights per block of the block-quantised formats.
    pub const BLOCK: usize = 32;

    /// Bytes per element. Block formats have none: [`DType::row_bytes`] says how big their
    /// rows are.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 | DType::Q4_0 => {
                unreachable!("{self} has no size per element (use DType::row_bytes)")
            }
        }
    }

    /// Bytes of a row of `cols` elements: `cols * size` for element dtypes; for the block
    /// formats the row's codes, then its f16 scales, padded to 16 bytes (`cols` is a multiple
    /// of [`DType::BLOCK`]).
    pub fn row_bytes(self, cols: usize) -> usize {
        match self.quant_bits() {
            None => cols * self.size(),
            Some(bits) => {
                let blocks = cols.div_ceil(Self::BLOCK);
                (blocks * (Self::BLOCK * bits / 8 + 2)).div_ceil(16) * 16
            }
        }
    }

    /// Bits per code of the block formats (None for element dtypes).
    pub fn quant_bits(self) -> Option<usize> {
        match self {
            DType::Q8_0 => Some(8),
            DType::Q4_0 => Some(4),
            _ => None,
        }
    }

    pub fn is_quantized(self) -> bool {
        self.quant_bits().is_some()
    }

    /// Element dtypes holding real numbers (the block formats are not: only matvec and
    /// embedding read them).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
        }
    }

    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A shape: row-major dims, outermost first. Every value has rank >= 1 (a scalar is `[1]`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shape(pub Vec<usize>);

impl Shape {
    pub fn new(dims: impl Into<Vec<usize>>) -> Shape {
        Shape(dims.into())
    }
    pub fn dims(&self) -> &[usize] {
        &self.0
    }
    pub fn rank(&self) -> usize {
        self.0.len()
    }
    pub fn numel(&self) -> usize {
        self.0.iter().product()
    }
    /// The innermost dim (the axis that norms, softmax and top-k reduce over).
    pub fn last(&self) -> usize {
        self.0.last().copied().unwrap_or(1)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// The type of a value: element type and shape, written `bf16[1024,64]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Type {
    pub dtype: DType,
    pub shape: Shape,
}

impl Type {
    pub fn new(dtype: DType, dims: impl Into<Vec<usize>>) -> Type {
        Type {
            dtype,
            shape: Shape::new(dims),
        }
    }
    pub fn f32(dims: impl Into<Vec<usize>>) -> Type {
        Type::new(DType::F32, dims)
    }
    pub fn i32(dims: impl Into<Vec<usize>>) -> Type {
        Type::new(DType::I32, dims)
    }
    /// Bytes of a value of this type (block formats: rows of [`DType::row_bytes`]).
    pub fn bytes(&self) -> usize {
        let cols = self.shape.last();
        (self.shape.numel() / cols.max(1)) * self.dtype.row_bytes(cols)
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}

/// An `f32` attribute (eps, rope theta, attention scale) compared and hashed by its bits, so
/// ops can be keys in signature tables; written with Rust's shortest round-trip formatting.
#[derive(Clone, Copy, Debug)]
pub struct F32Attr(pub f32);

impl PartialEq for F32Attr {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}
impl Eq for F32Attr {}
impl std::hash::Hash for F32Attr {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state)
    }
}
impl PartialOrd for F32Attr {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for F32Attr {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}
impl fmt::Display for F32Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `{:?}` on f32 prints the shortest string that parses back to the same bits.
        write!(f, "{:?}", self.0)
    }
}
