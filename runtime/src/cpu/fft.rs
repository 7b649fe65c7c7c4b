//! Discrete Fourier transforms along one axis with rustfft; plans and buffers made at load.

use cvc_compiler::back::cpu::FftCall;
use num_complex::Complex;
use rustfft::{Fft, FftPlanner};
use std::sync::Arc;

/// One planned transform of a `[outer, n, inner]` complex tensor along the middle axis.
pub struct AxisFft {
    plan: Arc<dyn Fft<f32>>,
    n: usize,
    outer: usize,
    inner: usize,
    scale: f32,
    src: usize,
    dst: usize,
    line: Vec<Complex<f32>>,
    scratch: Vec<Complex<f32>>,
}

impl AxisFft {
    /// Bytes of the line and scratch buffers this transform owns (for the memory report).
    pub fn buffer_bytes(&self) -> usize {
        (self.line.len() + self.scratch.len()) * std::mem::size_of::<Complex<f32>>()
    }

    /// Plans the transform the compiler described.
    pub fn new(call: &FftCall) -> AxisFft {
        let FftCall { ref shape, axis, inverse, scale, src, dst } = *call;
        let n = shape[axis];
        let mut planner = FftPlanner::<f32>::new();
        let plan = if inverse { planner.plan_fft_inverse(n) } else { planner.plan_fft_forward(n) };
        let scratch = vec![Complex::new(0.0, 0.0); plan.get_inplace_scratch_len()];
        AxisFft {
            plan,
            n,
            outer: shape[..axis].iter().product(),
            inner: shape[axis + 1..].iter().product(),
            scale: scale as f32,
            src,
            dst,
            line: vec![Complex::new(0.0, 0.0); n],
            scratch,
        }
    }

    /// Runs the transform over the arena at `base`.
    ///
    /// # Safety
    /// `src` and `dst` must address the planned tensor inside the arena.
    pub unsafe fn run(&mut self, base: *mut u8) {
        let src = base.add(self.src) as *const Complex<f32>;
        let dst = base.add(self.dst) as *mut Complex<f32>;
        let (n, inner) = (self.n, self.inner);
        for o in 0..self.outer {
            for i in 0..inner {
                for j in 0..n {
                    self.line[j] = *src.add((o * n + j) * inner + i);
                }
                if n > 0 {
                    self.plan.process_with_scratch(&mut self.line, &mut self.scratch);
                }
                for j in 0..n {
                    *dst.add((o * n + j) * inner + i) = self.line[j] * self.scale;
                }
            }
        }
    }
}
