//! Dtypes, symbolic shapes and tensor types of IR values.

use serde::Serialize;
use std::fmt;

/// Element type of an IR value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum DType {
    /// 32-bit float (real).
    F32,
    /// Complex of two f32, stored interleaved `(re, im)` (8 bytes).
    C64,
    /// 32-bit signed integer: class labels and the step counter only.
    I32,
}

impl DType {
    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::C64 => 8,
        }
    }
    /// Whether the type is complex.
    pub fn is_complex(self) -> bool {
        self == DType::C64
    }
    /// Text form (`f32`, `c64`, `i32`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::C64 => "c64",
            DType::I32 => "i32",
        }
    }
}

/// How the elements of a buffer are stored: in the value's own precision, or (activations and
/// their gradients under `precision = bf16 | fp16`) as 16-bit floats, a complex value as a
/// pair of them. Kernels compute in f32 whatever the storage: a load widens, a store rounds
/// to nearest even.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub enum Storage {
    /// The dtype's own width (f32, c64 as two f32, i32).
    #[default]
    Full,
    /// bfloat16: f32's exponent range, 8 significant bits.
    Bf16,
    /// IEEE binary16: 5 exponent bits (largest finite 65504), 11 significant bits.
    F16,
}

impl Storage {
    /// Bytes per element of a `dtype` value stored this way (i32 is always full width).
    pub fn elem_bytes(self, dtype: DType) -> usize {
        match (self, dtype) {
            (Storage::Full, _) | (_, DType::I32) => dtype.bytes(),
            (_, DType::F32) => 2,
            (_, DType::C64) => 4,
        }
    }
    /// Whether elements are 16-bit floats.
    pub fn is_half(self) -> bool {
        self != Storage::Full
    }
    /// The stored element type's name: `f32`, `c64`, `i32`, `bf16`, `cbf16` (a pair of
    /// bf16), `f16`, `cf16`.
    pub fn stored_name(self, dtype: DType) -> &'static str {
        match (self, dtype) {
            (Storage::Full, d) | (_, d @ DType::I32) => d.name(),
            (Storage::Bf16, DType::F32) => "bf16",
            (Storage::Bf16, DType::C64) => "cbf16",
            (Storage::F16, DType::F32) => "f16",
            (Storage::F16, DType::C64) => "cf16",
        }
    }
    /// Text form of the format (`full`, `bf16`, `fp16`).
    pub fn name(self) -> &'static str {
        match self {
            Storage::Full => "full",
            Storage::Bf16 => "bf16",
            Storage::F16 => "fp16",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One dimension of a shape: a constant, or the batch size `B` (symbolic until planning).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Dim {
    /// The batch size; becomes a number when a batch is given.
    Batch,
    /// A known extent.
    Fixed(usize),
}

impl Dim {
    /// The extent, with `B = batch`.
    pub fn resolve(self, batch: usize) -> usize {
        match self {
            Dim::Batch => batch,
            Dim::Fixed(n) => n,
        }
    }
    /// The extent when known without a batch.
    pub fn fixed(self) -> Option<usize> {
        match self {
            Dim::Batch => None,
            Dim::Fixed(n) => Some(n),
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Batch => f.write_str("B"),
            Dim::Fixed(n) => write!(f, "{n}"),
        }
    }
}

/// A row-major shape; rank 0 is a scalar.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default, Serialize)]
pub struct Shape(pub Vec<Dim>);

impl Shape {
    /// The scalar shape `[]`.
    pub fn scalar() -> Self {
        Shape(Vec::new())
    }
    /// A shape of constant extents.
    pub fn fixed(dims: &[usize]) -> Self {
        Shape(dims.iter().map(|&d| Dim::Fixed(d)).collect())
    }
    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }
    /// Extents with `B = batch`.
    pub fn resolve(&self, batch: usize) -> Vec<usize> {
        self.0.iter().map(|d| d.resolve(batch)).collect()
    }
    /// Element count with `B = batch`, saturating at `usize::MAX` (see [`Shape::checked_numel`]).
    pub fn numel(&self, batch: usize) -> usize {
        self.checked_numel(batch).unwrap_or(usize::MAX)
    }
    /// Element count with `B = batch`, `None` when it overflows `usize`.
    pub fn checked_numel(&self, batch: usize) -> Option<usize> {
        self.0.iter().try_fold(1usize, |acc, d| acc.checked_mul(d.resolve(batch)))
    }
    /// How many times `B` occurs (element count is `fixed_numel * B^batch_power`).
    pub fn batch_power(&self) -> u32 {
        self.0.iter().filter(|d| **d == Dim::Batch).count() as u32
    }
    /// Product of the constant extents, saturating at `usize::MAX`.
    pub fn fixed_numel(&self) -> usize {
        self.0.iter().filter_map(|d| d.fixed()).fold(1usize, |acc, n| acc.saturating_mul(n))
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// The type of an IR value: element type and shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Shape, batch possibly symbolic.
    pub shape: Shape,
}

impl TensorType {
    /// A tensor type.
    pub fn new(dtype: DType, shape: Shape) -> Self {
        TensorType { dtype, shape }
    }
    /// Bytes at a given batch size, saturating at `usize::MAX` (see [`TensorType::checked_bytes`]).
    pub fn bytes(&self, batch: usize) -> usize {
        self.checked_bytes(batch).unwrap_or(usize::MAX)
    }
    /// Bytes at a given batch size, `None` when the count overflows `usize`.
    pub fn checked_bytes(&self, batch: usize) -> Option<usize> {
        self.shape.checked_numel(batch)?.checked_mul(self.dtype.bytes())
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}
