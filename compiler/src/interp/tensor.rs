//! Host tensors of the reference interpreter: row-major f64, complex f64 or i64 data.

use crate::ir::DType;
use num_complex::Complex64;

/// The elements of a [`Tensor`], row-major.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    /// Values of an `f32` IR value, held in f64.
    Real(Vec<f64>),
    /// Values of a `c64` IR value, held as complex f64.
    Complex(Vec<Complex64>),
    /// Values of an `i32` IR value (labels, the step counter).
    Int(Vec<i64>),
}

/// A row-major tensor: a resolved shape and its elements.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Extents, batch resolved.
    pub shape: Vec<usize>,
    /// The elements (`shape.iter().product()` of them).
    pub data: TensorData,
}

impl TensorData {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            TensorData::Real(v) => v.len(),
            TensorData::Complex(v) => v.len(),
            TensorData::Int(v) => v.len(),
        }
    }
    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The IR dtype these elements stand for.
    pub fn dtype(&self) -> DType {
        match self {
            TensorData::Real(_) => DType::F32,
            TensorData::Complex(_) => DType::C64,
            TensorData::Int(_) => DType::I32,
        }
    }
    /// The elements at `idx`, in order (a gather).
    pub fn gather(&self, idx: &[usize]) -> TensorData {
        match self {
            TensorData::Real(v) => TensorData::Real(idx.iter().map(|&i| v[i]).collect()),
            TensorData::Complex(v) => TensorData::Complex(idx.iter().map(|&i| v[i]).collect()),
            TensorData::Int(v) => TensorData::Int(idx.iter().map(|&i| v[i]).collect()),
        }
    }
}

impl Tensor {
    /// A tensor of zeros of the given dtype and shape.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        let data = match dtype {
            DType::F32 => TensorData::Real(vec![0.0; n]),
            DType::C64 => TensorData::Complex(vec![Complex64::new(0.0, 0.0); n]),
            DType::I32 => TensorData::Int(vec![0; n]),
        };
        Tensor { shape: shape.to_vec(), data }
    }
    /// A real tensor.
    pub fn real(shape: &[usize], data: Vec<f64>) -> Tensor {
        Tensor { shape: shape.to_vec(), data: TensorData::Real(data) }
    }
    /// A complex tensor.
    pub fn complex(shape: &[usize], data: Vec<Complex64>) -> Tensor {
        Tensor { shape: shape.to_vec(), data: TensorData::Complex(data) }
    }
    /// An integer tensor.
    pub fn int(shape: &[usize], data: Vec<i64>) -> Tensor {
        Tensor { shape: shape.to_vec(), data: TensorData::Int(data) }
    }
    /// A real scalar (shape `[]`).
    pub fn scalar(x: f64) -> Tensor {
        Tensor::real(&[], vec![x])
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// The IR dtype of the tensor.
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }
    /// The real elements, when the tensor is real.
    pub fn as_real(&self) -> Option<&[f64]> {
        match &self.data {
            TensorData::Real(v) => Some(v),
            _ => None,
        }
    }
    /// The complex elements, when the tensor is complex.
    pub fn as_complex(&self) -> Option<&[Complex64]> {
        match &self.data {
            TensorData::Complex(v) => Some(v),
            _ => None,
        }
    }
    /// The integer elements, when the tensor is an integer tensor.
    pub fn as_int(&self) -> Option<&[i64]> {
        match &self.data {
            TensorData::Int(v) => Some(v),
            _ => None,
        }
    }
    /// Every element as a complex number (reals and integers get imaginary part 0).
    pub fn to_complex_vec(&self) -> Vec<Complex64> {
        match &self.data {
            TensorData::Real(v) => v.iter().map(|&x| Complex64::new(x, 0.0)).collect(),
            TensorData::Complex(v) => v.clone(),
            TensorData::Int(v) => v.iter().map(|&x| Complex64::new(x as f64, 0.0)).collect(),
        }
    }
    /// Every element as a real number (integers converted; complex values give an error).
    pub fn to_real_vec(&self) -> Result<Vec<f64>, String> {
        match &self.data {
            TensorData::Real(v) => Ok(v.clone()),
            TensorData::Int(v) => Ok(v.iter().map(|&x| x as f64).collect()),
            TensorData::Complex(_) => Err("expected a real tensor, got a complex one".into()),
        }
    }
    /// The largest absolute elementwise difference to `other` (shapes and dtypes must agree).
    pub fn max_abs_diff(&self, other: &Tensor) -> Option<f64> {
        if self.shape != other.shape || self.dtype() != other.dtype() {
            return None;
        }
        let a = self.to_complex_vec();
        let b = other.to_complex_vec();
        Some(a.iter().zip(&b).map(|(x, y)| (x - y).norm()).fold(0.0, f64::max))
    }
}
