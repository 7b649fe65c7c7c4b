//! Seeded initialisers as interpreter tensors (the draws themselves are [`crate::init`]'s).

use super::tensor::{Tensor, TensorData};
pub use crate::init::{name_hash, SplitMix64};
use crate::ir::{DType, Init};

/// A tensor of `dtype` and `shape` initialised by `init` from `rng` ([`crate::init::init_values`]).
pub fn init_tensor(init: &Init, dtype: DType, shape: &[usize], rng: &mut SplitMix64) -> Tensor {
    let values = crate::init::init_values(init, dtype, shape, rng);
    let data = match dtype {
        DType::F32 => TensorData::Real(values.iter().map(|z| z.re).collect()),
        DType::C64 => TensorData::Complex(values),
        DType::I32 => TensorData::Int(values.iter().map(|z| z.re as i64).collect()),
    };
    Tensor { shape: shape.to_vec(), data }
}
