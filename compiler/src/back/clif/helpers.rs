//! Scalar math the generated CPU kernels call: `extern "C"` functions the JIT links by name.
//!
//! Cranelift has no transcendental instructions; kernels import these symbols and the runtime
//! registers their addresses with the JIT builder ([`helpers`] lists both).

use cranelift_codegen::ir::{types, AbiParam, Signature};
use cranelift_codegen::isa::CallConv;

/// A scalar function a kernel can call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Helper {
    /// `e^x`.
    Exp,
    /// Natural log.
    Log,
    /// `sin x`.
    Sin,
    /// `cos x`.
    Cos,
    /// `tanh x`.
    Tanh,
    /// Logistic sigmoid.
    Sigmoid,
    /// GELU (tanh form).
    Gelu,
    /// GELU's derivative.
    GeluGrad,
    /// `atan2(y, x)`.
    Atan2,
    /// Exact GELU, `0.5x(1 + erf(x/√2))`.
    GeluErf,
    /// Exact GELU's derivative.
    GeluErfGrad,
}

/// Every helper with its symbol name and address, in a fixed order.
pub fn helpers() -> [(Helper, &'static str, *const u8); 11] {
    [
        (Helper::Exp, "cvc_expf", cvc_expf as *const u8),
        (Helper::Log, "cvc_logf", cvc_logf as *const u8),
        (Helper::Sin, "cvc_sinf", cvc_sinf as *const u8),
        (Helper::Cos, "cvc_cosf", cvc_cosf as *const u8),
        (Helper::Tanh, "cvc_tanhf", cvc_tanhf as *const u8),
        (Helper::Sigmoid, "cvc_sigmoidf", cvc_sigmoidf as *const u8),
        (Helper::Gelu, "cvc_geluf", cvc_geluf as *const u8),
        (Helper::GeluGrad, "cvc_gelu_gradf", cvc_gelu_gradf as *const u8),
        (Helper::Atan2, "cvc_atan2f", cvc_atan2f as *const u8),
        (Helper::GeluErf, "cvc_gelu_erff", cvc_gelu_erff as *const u8),
        (Helper::GeluErfGrad, "cvc_gelu_erf_gradf", cvc_gelu_erf_gradf as *const u8),
    ]
}

impl Helper {
    /// The symbol the JIT resolves.
    pub fn symbol(self) -> &'static str {
        match self {
            Helper::Exp => "cvc_expf",
            Helper::Log => "cvc_logf",
            Helper::Sin => "cvc_sinf",
            Helper::Cos => "cvc_cosf",
            Helper::Tanh => "cvc_tanhf",
            Helper::Sigmoid => "cvc_sigmoidf",
            Helper::Gelu => "cvc_geluf",
            Helper::GeluGrad => "cvc_gelu_gradf",
            Helper::Atan2 => "cvc_atan2f",
            Helper::GeluErf => "cvc_gelu_erff",
            Helper::GeluErfGrad => "cvc_gelu_erf_gradf",
        }
    }
    /// Number of f32 arguments (one result, f32).
    pub fn arity(self) -> usize {
        if self == Helper::Atan2 {
            2
        } else {
            1
        }
    }
    /// The Cranelift signature under `call_conv`.
    pub fn signature(self, call_conv: CallConv) -> Signature {
        let mut sig = Signature::new(call_conv);
        for _ in 0..self.arity() {
            sig.params.push(AbiParam::new(types::F32));
        }
        sig.returns.push(AbiParam::new(types::F32));
        sig
    }
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_A: f32 = 0.044_715;

/// `e^x`.
pub extern "C" fn cvc_expf(x: f32) -> f32 {
    x.exp()
}
/// `ln x`.
pub extern "C" fn cvc_logf(x: f32) -> f32 {
    x.ln()
}
/// `sin x`.
pub extern "C" fn cvc_sinf(x: f32) -> f32 {
    x.sin()
}
/// `cos x`.
pub extern "C" fn cvc_cosf(x: f32) -> f32 {
    x.cos()
}
/// `tanh x`.
pub extern "C" fn cvc_tanhf(x: f32) -> f32 {
    x.tanh()
}
/// `1 / (1 + e^-x)`.
pub extern "C" fn cvc_sigmoidf(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}
/// `0.5x(1 + tanh(√(2/π)(x + 0.044715x³)))`.
pub extern "C" fn cvc_geluf(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + GELU_A * x * x * x)).tanh())
}
/// Derivative of [`cvc_geluf`].
pub extern "C" fn cvc_gelu_gradf(x: f32) -> f32 {
    let u = SQRT_2_OVER_PI * (x + GELU_A * x * x * x);
    let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_A * x * x);
    let t = u.tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du
}
/// `0.5x(1 + erf(x/√2))`. `erff` is musl's (through the `libm` crate): a rational
/// approximation per interval with an error below 1 ulp, where the Abramowitz–Stegun 7.1.26
/// polynomial would be off by up to 1.5e-7 absolute (`compiler/tests/gelu.rs` measures the
/// error of this function against the f64 form).
pub extern "C" fn cvc_gelu_erff(x: f32) -> f32 {
    0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2))
}
/// Derivative of [`cvc_gelu_erff`]: `Φ(x) + x·φ(x)`.
pub extern "C" fn cvc_gelu_erf_gradf(x: f32) -> f32 {
    const INV_SQRT_2PI: f32 = 0.398_942_3;
    let cdf = 0.5 * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2));
    cdf + x * INV_SQRT_2PI * (-0.5 * x * x).exp()
}
/// `atan2(y, x)`.
pub extern "C" fn cvc_atan2f(y: f32, x: f32) -> f32 {
    y.atan2(x)
}
