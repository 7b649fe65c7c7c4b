//! The CPU back end's exact GELU (`cvc_gelu_erff`, `cvc_gelu_erf_gradf`, built on musl's
//! `erff`) against the f64 forms of the interpreter, on a dense grid of f32 inputs: the error
//! is printed and bounded (a few f32 ulps of the result, plus an absolute floor where the
//! result cancels towards 0 in the left tail).

use cvc_compiler::back::clif::helpers::{cvc_gelu_erf_gradf, cvc_gelu_erff};
use cvc_compiler::interp::{gelu, gelu_grad};

/// Largest error over `[-10, 10]` in steps of 2⁻¹², in units of `f32::EPSILON · max(|f|, 1)`.
fn worst(f32_fn: extern "C" fn(f32) -> f32, f64_fn: fn(f64) -> f64) -> (f64, f32) {
    let mut worst = (0.0f64, 0.0f32);
    let mut x = -10.0f32;
    while x <= 10.0 {
        let want = f64_fn(x as f64);
        let got = f32_fn(x) as f64;
        let err = (got - want).abs() / (f32::EPSILON as f64 * want.abs().max(1.0));
        if err > worst.0 {
            worst = (err, x);
        }
        x += 1.0 / 4096.0;
    }
    worst
}

#[test]
fn exact_gelu_on_the_cpu_is_within_a_few_ulp_of_f64() {
    let (e, at) = worst(cvc_gelu_erff, gelu);
    println!("gelu: worst error {e:.2} ulp(max(|f|, 1)) at x = {at}");
    assert!(e <= 2.0, "gelu: {e} ulp at {at}");
    let (e, at) = worst(cvc_gelu_erf_gradf, gelu_grad);
    println!("gelu': worst error {e:.2} ulp(max(|f|, 1)) at x = {at}");
    assert!(e <= 2.0, "gelu': {e} ulp at {at}");
}

#[test]
fn exact_gelu_is_not_the_tanh_form() {
    // The two differ by about 1e-4 at x = 2: a test against the wrong form would fail.
    let tanh_form =
        |x: f64| 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh());
    let d = (gelu(2.0) - tanh_form(2.0)).abs();
    assert!(d > 5e-5, "{d}");
    assert!((gelu(2.0) as f32 - cvc_gelu_erff(2.0)).abs() < 1e-6);
}
