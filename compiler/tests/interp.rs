//! The reference interpreter against independent references: hand-computed values, a
//! direct convolution written differently, adjoint identities, and PyTorch's optimizer
//! formulas re-implemented on R² vectors.

use cvc_compiler::config::{Optimizer, OptimizerKind};
use cvc_compiler::interp::check::random_tensor;
use cvc_compiler::interp::*;
use cvc_compiler::ir::builder::Builder;
use cvc_compiler::ir::*;
use cvc_compiler::passes::{autodiff, optimizer};
use num_complex::Complex64;
use std::collections::HashMap;

#[path = "../../tests/src/seed.rs"]
mod seed;

fn c(re: f64, im: f64) -> Complex64 {
    Complex64::new(re, im)
}

/// Evaluates `op` on constant inputs (as `Input` leaves) and returns its value.
fn eval_op(op: Op, inputs: &[Tensor], shape: Option<Shape>) -> Tensor {
    let mut g = Graph::new("op", Mode::Train);
    let mut b = Builder::new(&mut g);
    let xs: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            b.leaf(Op::Input { name: format!("x{i}") }, TensorType::new(t.dtype(), Shape::fixed(&t.shape)))
        })
        .collect();
    let y = b.add_shaped(op, &xs, shape.as_ref()).unwrap();
    let leaves: HashMap<Value, Tensor> = xs.into_iter().zip(inputs.iter().cloned()).collect();
    evaluate(&g, 4, &leaves).unwrap()[y.index()].clone().unwrap()
}

fn assert_close(got: &Tensor, want: &Tensor, tol: f64) {
    assert_eq!(got.shape, want.shape);
    assert_eq!(got.dtype(), want.dtype(), "{got:?} vs {want:?}");
    let d = got.max_abs_diff(want).unwrap();
    assert!(d <= tol, "difference {d}: got {got:?}, want {want:?}");
}

/// A direct convolution: zero-pad explicitly, then slide the kernel (groups as slices).
fn conv_reference(x: &Tensor, w: &Tensor, g: ConvGeom, conj: [bool; 2]) -> Tensor {
    let (xv, wv) = (x.to_complex_vec(), w.to_complex_vec());
    let cj = |z: Complex64, f: bool| if f { z.conj() } else { z };
    let [n, ch, h, wd] = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
    let [o, cg, kh, kw] = [w.shape[0], w.shape[1], w.shape[2], w.shape[3]];
    let (hp, wp) = (h + 2 * g.pad[0], wd + 2 * g.pad[1]);
    let mut padded = vec![c(0.0, 0.0); n * ch * hp * wp];
    for b in 0..n {
        for k in 0..ch {
            for i in 0..h {
                for j in 0..wd {
                    padded[((b * ch + k) * hp + i + g.pad[0]) * wp + j + g.pad[1]] =
                        cj(xv[((b * ch + k) * h + i) * wd + j], conj[0]);
                }
            }
        }
    }
    let ho = (hp - g.dilation[0] * (kh - 1) - 1) / g.stride[0] + 1;
    let wo = (wp - g.dilation[1] * (kw - 1) - 1) / g.stride[1] + 1;
    let per_group = o / g.groups;
    let mut y = vec![c(0.0, 0.0); n * o * ho * wo];
    for b in 0..n {
        for oc in 0..o {
            let first = (oc / per_group) * cg;
            for i in 0..ho {
                for j in 0..wo {
                    let mut acc = c(0.0, 0.0);
                    for k in 0..cg {
                        for a in 0..kh {
                            for bb in 0..kw {
                                let pi = i * g.stride[0] + a * g.dilation[0];
                                let pj = j * g.stride[1] + bb * g.dilation[1];
                                acc += padded[((b * ch + first + k) * hp + pi) * wp + pj]
                                    * cj(wv[((oc * cg + k) * kh + a) * kw + bb], conj[1]);
                            }
                        }
                    }
                    y[((b * o + oc) * ho + i) * wo + j] = acc;
                }
            }
        }
    }
    Tensor::complex(&[n, o, ho, wo], y)
}

fn geometries() -> [ConvGeom; 3] {
    [
        ConvGeom { stride: [1, 1], pad: [0, 0], dilation: [1, 1], groups: 1 },
        ConvGeom { stride: [2, 1], pad: [1, 2], dilation: [1, 2], groups: 2 },
        ConvGeom { stride: [1, 3], pad: [2, 1], dilation: [2, 1], groups: 4 },
    ]
}

fn as_complex(t: &Tensor) -> Tensor {
    Tensor::complex(&t.shape, t.to_complex_vec())
}

#[test]
fn conv2d_matches_a_direct_reference() {
    let s = seed::seed_for("interp::conv2d_matches_a_direct_reference");
    let mut rng = SplitMix64::new(s);
    for geom in geometries() {
        for (dx, dw) in [(DType::C64, DType::C64), (DType::F32, DType::C64), (DType::F32, DType::F32)] {
            for conj in [[false, false], [true, false], [false, true]] {
                let x = random_tensor(dx, &[2, 4, 6, 7], 1, &mut rng);
                let w = random_tensor(dw, &[8, 4 / geom.groups, 3, 2], 1, &mut rng);
                let y = eval_op(Op::Conv2d { geom, conj }, &[x.clone(), w.clone()], None);
                let want = conv_reference(&x, &w, geom, conj);
                let got = if y.dtype() == DType::F32 { as_complex(&y) } else { y };
                assert!(got.max_abs_diff(&want).unwrap() < 1e-12, "{geom:?} {conj:?} seed {s}");
            }
        }
    }
}

#[test]
fn conv_transpose_and_weight_grad_are_the_adjoints() {
    // ⟨conv(x, w), dy⟩ = ⟨x, conv_transpose(dy, w)⟩ = ⟨w, weight_grad(x, dy)⟩ (bilinear forms).
    let s = seed::seed_for("interp::conv_transpose_and_weight_grad_are_the_adjoints");
    let mut rng = SplitMix64::new(s);
    let dot = |a: &Tensor, b: &Tensor| -> Complex64 {
        a.to_complex_vec().iter().zip(b.to_complex_vec()).map(|(p, q)| p * q).sum()
    };
    for geom in geometries() {
        let (h, w_) = (6, 7);
        let x = random_tensor(DType::C64, &[2, 4, h, w_], 1, &mut rng);
        let w = random_tensor(DType::C64, &[8, 4 / geom.groups, 3, 2], 1, &mut rng);
        let y = eval_op(Op::Conv2d { geom, conj: [false, false] }, &[x.clone(), w.clone()], None);
        let dy = random_tensor(DType::C64, &y.shape, 1, &mut rng);
        let ct = Op::ConvTranspose2d { geom, out_hw: [h, w_], conj: [false, false] };
        let dx = eval_op(ct, &[dy.clone(), w.clone()], None);
        let wg = Op::Conv2dWeightGrad { geom, kernel: [3, 2], conj: [false, false] };
        let dw = eval_op(wg, &[x.clone(), dy.clone()], None);
        let (a, b, cc) = (dot(&y, &dy), dot(&x, &dx), dot(&w, &dw));
        assert!((a - b).norm() < 1e-10 && (a - cc).norm() < 1e-10, "{a} {b} {cc} seed {s}");
    }
}

#[test]
fn fft_known_values_and_norms() {
    let x = Tensor::complex(&[4], vec![c(0.0, 0.0), c(1.0, 0.0), c(0.0, 0.0), c(0.0, 0.0)]);
    let fwd =
        eval_op(Op::Fft { axis: 0, inverse: false, norm: FftNorm::Backward }, std::slice::from_ref(&x), None);
    let want = Tensor::complex(&[4], vec![c(1.0, 0.0), c(0.0, -1.0), c(-1.0, 0.0), c(0.0, 1.0)]);
    assert_close(&fwd, &want, 1e-15);
    let back = eval_op(Op::Fft { axis: 0, inverse: true, norm: FftNorm::Backward }, &[fwd], None);
    assert_close(&back, &x, 1e-15);
    let ortho =
        eval_op(Op::Fft { axis: 0, inverse: false, norm: FftNorm::Ortho }, std::slice::from_ref(&x), None);
    let half = Tensor::complex(&[4], want.to_complex_vec().iter().map(|z| z * 0.5).collect());
    assert_close(&ortho, &half, 1e-15);
    let fnorm = eval_op(Op::Fft { axis: 0, inverse: false, norm: FftNorm::Forward }, &[x], None);
    let quarter = Tensor::complex(&[4], want.to_complex_vec().iter().map(|z| z * 0.25).collect());
    assert_close(&fnorm, &quarter, 1e-15);
    // Along axis 0 of a 2×2: column-wise sums and differences.
    let m = Tensor::complex(&[2, 2], vec![c(1.0, 0.0), c(2.0, 0.0), c(3.0, 1.0), c(4.0, 0.0)]);
    let y = eval_op(Op::Fft { axis: 0, inverse: false, norm: FftNorm::Backward }, &[m], None);
    let want = Tensor::complex(&[2, 2], vec![c(4.0, 1.0), c(6.0, 0.0), c(-2.0, -1.0), c(-2.0, 0.0)]);
    assert_close(&y, &want, 1e-14);
}

#[test]
fn matmul_flags() {
    let a = Tensor::complex(&[2, 2], vec![c(1.0, 0.0), c(0.0, 1.0), c(2.0, 0.0), c(0.0, 0.0)]);
    let b = Tensor::complex(&[2, 1], vec![c(1.0, 0.0), c(1.0, -1.0)]);
    let plain = eval_op(
        Op::MatMul { trans: [false, false], conj: [false, false], sum_batch: false },
        &[a.clone(), b.clone()],
        None,
    );
    // [1·1 + i(1−i), 2·1] = [2 + i, 2].
    assert_close(&plain, &Tensor::complex(&[2, 1], vec![c(2.0, 1.0), c(2.0, 0.0)]), 1e-15);
    let ah = eval_op(
        Op::MatMul { trans: [true, false], conj: [true, false], sum_batch: false },
        &[a.clone(), b.clone()],
        None,
    );
    // Aᴴ = [[1, 2], [−i, 0]] ⇒ [1 + 2(1−i), −i] = [3 − 2i, −i].
    assert_close(&ah, &Tensor::complex(&[2, 1], vec![c(3.0, -2.0), c(0.0, -1.0)]), 1e-15);
    let r = Tensor::real(&[1, 2], vec![2.0, -1.0]);
    let b_row = Tensor::complex(&[1, 2], b.to_complex_vec());
    let bt = eval_op(
        Op::MatMul { trans: [false, true], conj: [false, true], sum_batch: false },
        &[r, b_row],
        None,
    );
    // [2, −1]·conj([1, 1−i]) = 2 − (1 + i) = 1 − i.
    assert_close(&bt, &Tensor::complex(&[1, 1], vec![c(1.0, -1.0)]), 1e-15);
}

/// One tensor line of `tests/reference/matmul/batched.txt`: `NAME DTYPE RANK DIMS... VALUES...`.
fn reference_tensor(line: &str, name: &str) -> Tensor {
    let mut w = line.split_whitespace();
    assert_eq!(w.next(), Some(name), "reference line order");
    let dtype = w.next().expect("dtype");
    let rank: usize = w.next().expect("rank").parse().expect("rank");
    let shape: Vec<usize> = (0..rank).map(|_| w.next().expect("dim").parse().expect("dim")).collect();
    let vals: Vec<f64> = w.map(|v| v.parse().expect("value")).collect();
    match dtype {
        "c64" => Tensor::complex(&shape, vals.chunks(2).map(|p| c(p[0], p[1])).collect()),
        _ => Tensor::real(&shape, vals),
    }
}

/// Batched, broadcast and summed matmuls against numpy (`tests/reference/matmul/make.py`).
#[test]
fn matmul_batched_vs_numpy() {
    let text = include_str!("../../tests/reference/matmul/batched.txt");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4 * 6, "six cases of four lines");
    for case in lines.chunks(4) {
        let head: Vec<&str> = case[0].split_whitespace().collect();
        assert_eq!(head[0], "case");
        let f: Vec<bool> = head[2..7].iter().map(|x| *x == "1").collect();
        let op = Op::MatMul { trans: [f[0], f[1]], conj: [f[2], f[3]], sum_batch: f[4] };
        let (a, b) = (reference_tensor(case[1], "a"), reference_tensor(case[2], "b"));
        let want = reference_tensor(case[3], "out");
        let got = eval_op(op, &[a, b], None);
        assert_eq!(got.shape, want.shape, "{}", head[1]);
        let d = got.max_abs_diff(&want).unwrap();
        assert!(d <= 1e-12, "{}: difference {d}", head[1]);
    }
}

#[test]
fn reductions_keep_axes_and_ties_take_the_first() {
    let z = Tensor::complex(&[1, 3], vec![c(3.0, 0.0), c(0.0, 3.0), c(-3.0, 0.0)]);
    let mm = eval_op(Op::Reduce { op: ReduceOp::MaxMag, axes: vec![1] }, &[z], None);
    assert_close(&mm, &Tensor::complex(&[1, 1], vec![c(3.0, 0.0)]), 0.0);
    let r = Tensor::real(&[2, 2], vec![-3.0, 3.0, 1.0, -2.0]);
    let mm = eval_op(Op::Reduce { op: ReduceOp::MaxMag, axes: vec![1] }, std::slice::from_ref(&r), None);
    assert_close(&mm, &Tensor::real(&[2, 1], vec![-3.0, -2.0]), 0.0);
    let mx = eval_op(Op::Reduce { op: ReduceOp::Max, axes: vec![0] }, std::slice::from_ref(&r), None);
    assert_close(&mx, &Tensor::real(&[1, 2], vec![1.0, 3.0]), 0.0);
    let s = eval_op(Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 1] }, &[r], None);
    assert_close(&s, &Tensor::real(&[1, 1], vec![-1.0]), 0.0);
}

#[test]
fn broadcasting_mixed_dtypes_and_layout() {
    let a = Tensor::real(&[2, 1], vec![1.0, 2.0]);
    let b = Tensor::complex(&[3], vec![c(0.0, 1.0), c(1.0, 0.0), c(2.0, -1.0)]);
    let s = eval_op(Op::Binary(BinaryOp::Mul), &[a.clone(), b.clone()], None);
    let want = vec![c(0.0, 1.0), c(1.0, 0.0), c(2.0, -1.0), c(0.0, 2.0), c(2.0, 0.0), c(4.0, -2.0)];
    assert_close(&s, &Tensor::complex(&[2, 3], want), 0.0);
    let d = eval_op(Op::Binary(BinaryOp::Div), &[b.clone(), Tensor::real(&[], vec![2.0])], None);
    assert_close(&d, &Tensor::complex(&[3], vec![c(0.0, 0.5), c(0.5, 0.0), c(1.0, -0.5)]), 0.0);
    let p = eval_op(Op::Pad { axis: 0, before: 1, after: 2 }, std::slice::from_ref(&a), None);
    assert_close(&p, &Tensor::real(&[5, 1], vec![0.0, 1.0, 2.0, 0.0, 0.0]), 0.0);
    let cat = eval_op(Op::Concat { axis: 0 }, &[Tensor::real(&[1], vec![5.0]), b.clone()], None);
    let want = vec![c(5.0, 0.0), c(0.0, 1.0), c(1.0, 0.0), c(2.0, -1.0)];
    assert_close(&cat, &Tensor::complex(&[4], want), 0.0);
    let m = Tensor::real(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let t = eval_op(Op::Permute { perm: vec![1, 0] }, std::slice::from_ref(&m), None);
    assert_close(&t, &Tensor::real(&[3, 2], vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]), 0.0);
    let sl = eval_op(Op::Slice { axis: 1, start: 1, len: 2 }, std::slice::from_ref(&m), None);
    assert_close(&sl, &Tensor::real(&[2, 2], vec![2.0, 3.0, 5.0, 6.0]), 0.0);
    let e = eval_op(Op::Expand, &[a], Some(Shape::fixed(&[2, 2])));
    assert_close(&e, &Tensor::real(&[2, 2], vec![1.0, 1.0, 2.0, 2.0]), 0.0);
    let cond = Tensor::real(&[3], vec![1.0, -1.0, 0.0]);
    let sel = eval_op(Op::Select, &[cond, Tensor::real(&[], vec![9.0]), b], None);
    assert_close(&sel, &Tensor::complex(&[3], vec![c(9.0, 0.0), c(1.0, 0.0), c(2.0, -1.0)]), 0.0);
}

#[test]
fn one_hot_dropout_and_scalars() {
    let labels = Tensor::int(&[3], vec![2, -1, 7]);
    let oh = eval_op(Op::OneHot { classes: 3 }, &[labels], None);
    assert_close(&oh, &Tensor::real(&[3, 3], vec![0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]), 0.0);
    let p = 0.25;
    let mask =
        eval_op(Op::DropoutMask { p, salt: 3 }, &[Tensor::int(&[], vec![5])], Some(Shape::fixed(&[64, 64])));
    let v = mask.as_real().unwrap();
    for (i, &m) in v.iter().enumerate() {
        let want = if dropout_keep(p, 3, 5, i as u32) { 1.0 / (1.0 - p) } else { 0.0 };
        assert_eq!(m, want);
    }
    let kept = v.iter().filter(|&&m| m > 0.0).count() as f64 / v.len() as f64;
    assert!((kept - 0.75).abs() < 0.03, "kept fraction {kept}");
    let s = eval_op(Op::Scalar { value: 2.0, batch_exp: -1 }, &[], None);
    assert_close(&s, &Tensor::real(&[], vec![0.5]), 0.0); // batch 4
}

#[test]
fn initialisers_are_deterministic_and_scaled() {
    let init = Init::Glorot { fan_in: 30, fan_out: 20 };
    let a = init_tensor(&init, DType::C64, &[100, 100], &mut SplitMix64::new(3));
    let b = init_tensor(&init, DType::C64, &[100, 100], &mut SplitMix64::new(3));
    assert_eq!(a, b);
    let z = a.as_complex().unwrap();
    let var_re = z.iter().map(|z| z.re * z.re).sum::<f64>() / z.len() as f64;
    let var_im = z.iter().map(|z| z.im * z.im).sum::<f64>() / z.len() as f64;
    assert!((var_re - 0.02).abs() < 0.002 && (var_im - 0.02).abs() < 0.002, "{var_re} {var_im}");
    let r = init_tensor(&Init::He { fan_in: 8 }, DType::F32, &[10000], &mut SplitMix64::new(4));
    let v = r.as_real().unwrap().iter().map(|x| x * x).sum::<f64>() / 10000.0;
    assert!((v - 0.25).abs() < 0.025, "{v}");
    let ray = init_tensor(
        &Init::Rayleigh { fan_in: 50, fan_out: 50 },
        DType::C64,
        &[10000],
        &mut SplitMix64::new(5),
    );
    let mean = ray.as_complex().unwrap().iter().map(|z| z.norm()).sum::<f64>() / 10000.0;
    let want = 0.1 * (std::f64::consts::PI / 2.0).sqrt();
    assert!((mean - want).abs() < 0.01 * want * 3.0, "{mean} vs {want}");
    let u = init_tensor(&Init::Uniform { bound: 0.5 }, DType::F32, &[1000], &mut SplitMix64::new(6));
    assert!(u.as_real().unwrap().iter().all(|x| x.abs() <= 0.5));
    let k = init_tensor(&Init::Constant(0.1), DType::F32, &[2], &mut SplitMix64::new(6));
    assert_eq!(k, Tensor::real(&[2], vec![0.1, 0.1]));
}

/// A model `loss = Σ |W + b − T|²` with a complex weight `W: c64[2, 3]`, a real bias
/// `b: f32[3]` and a target input `T: c64[2, 3]`, differentiated and given `opt`'s update.
fn model(opt: &Optimizer) -> Graph {
    let mut g = Graph::new("opt", Mode::Train);
    let mut b = Builder::new(&mut g);
    let w_ty = TensorType::new(DType::C64, Shape::fixed(&[2, 3]));
    let w = b.leaf(
        Op::Param { name: "lin.weight".into(), init: Init::Glorot { fan_in: 3, fan_out: 2 } },
        w_ty.clone(),
    );
    let bias = TensorType::new(DType::F32, Shape::fixed(&[3]));
    let bias = b.leaf(Op::Param { name: "lin.bias".into(), init: Init::Uniform { bound: 0.5 } }, bias);
    let t = b.leaf(Op::Input { name: "target".into() }, w_ty);
    let y = b.add2(w, bias).unwrap();
    let d = b.sub(y, t).unwrap();
    let a = b.unary(UnaryOp::Abs2, d).unwrap();
    let s = b.sum(a, &[0, 1]).unwrap();
    let l = b.reshape(s, Shape::scalar()).unwrap();
    g.loss = Some(l);
    g.outputs.push(Output { name: "loss".into(), value: l });
    let facts = autodiff::run(&mut g).unwrap();
    optimizer::run(&mut g, &facts.grads, opt).unwrap();
    g
}

/// A parameter's components as a real vector (PyTorch's `view_as_real`).
fn r2(t: &Tensor) -> Vec<f64> {
    match &t.data {
        TensorData::Real(v) => v.clone(),
        TensorData::Complex(v) => v.iter().flat_map(|z| [z.re, z.im]).collect(),
        TensorData::Int(_) => panic!("integer parameter"),
    }
}

/// PyTorch's update rules on R² vectors, written from torch/optim/{sgd,adam,adamw}.py.
struct Reference {
    opt: Optimizer,
    t: i32,
    buf: Vec<Vec<f64>>,
    m: Vec<Vec<f64>>,
    v: Vec<Vec<f64>>,
}

impl Reference {
    fn new(opt: Optimizer, sizes: &[usize]) -> Self {
        let z = || sizes.iter().map(|&n| vec![0.0; n]).collect();
        Reference { opt, t: 0, buf: z(), m: z(), v: z() }
    }

    fn step(&mut self, params: &mut [Vec<f64>], grads: &[Vec<f64>], lr: f64) {
        self.t += 1;
        let wd = self.opt.weight_decay;
        for (k, (p, g)) in params.iter_mut().zip(grads).enumerate() {
            for i in 0..p.len() {
                match self.opt.kind {
                    OptimizerKind::Sgd { momentum, nesterov } => {
                        let mut d = g[i] + wd * p[i];
                        if momentum != 0.0 {
                            let b = &mut self.buf[k][i];
                            *b = if self.t == 1 { d } else { momentum * *b + d };
                            d = if nesterov { d + momentum * *b } else { *b };
                        }
                        p[i] -= lr * d;
                    }
                    OptimizerKind::Adam { beta1, beta2, eps }
                    | OptimizerKind::AdamW { beta1, beta2, eps } => {
                        let decoupled = matches!(self.opt.kind, OptimizerKind::AdamW { .. });
                        let mut d = g[i];
                        if decoupled {
                            p[i] *= 1.0 - lr * wd;
                        } else {
                            d += wd * p[i];
                        }
                        let (m, v) = (&mut self.m[k][i], &mut self.v[k][i]);
                        *m = beta1 * *m + (1.0 - beta1) * d;
                        *v = beta2 * *v + (1.0 - beta2) * d * d;
                        let bc1 = 1.0 - beta1.powi(self.t);
                        let bc2 = 1.0 - beta2.powi(self.t);
                        let denom = v.sqrt() / bc2.sqrt() + eps;
                        p[i] -= lr / bc1 * *m / denom;
                    }
                }
            }
        }
    }
}

/// Runs `steps` steps of `opt` in the interpreter and in the reference, comparing after each.
fn compare_optimizer(opt: Optimizer, steps: usize) {
    let s = seed::seed_for(&format!("interp::compare_optimizer {opt:?}"));
    let g = model(&opt);
    let mut sess = Session::new(&g, 1, s);
    let mut rng = SplitMix64::new(s ^ 1);
    let target = random_tensor(DType::C64, &[2, 3], 1, &mut rng);
    let inputs = HashMap::from([("target".to_string(), target.clone())]);
    let names = ["lin.weight", "lin.bias"];
    let mut params: Vec<Vec<f64>> = names.iter().map(|n| r2(&sess.state[*n])).collect();
    let mut reference = Reference::new(opt.clone(), &params.iter().map(Vec::len).collect::<Vec<_>>());
    let tv = r2(&target);
    for step in 0..steps {
        let lr = if step == 2 { opt.lr * 0.5 } else { opt.lr };
        sess.state.insert(optimizer::LR.into(), Tensor::scalar(lr));
        // ∂/∂(re, im) of Σ|W + b − T|²: 2(W + b − T) per component; the bias sums the real rows.
        let (w, b) = (&params[0], &params[1]);
        let gw: Vec<f64> =
            (0..12).map(|i| 2.0 * (w[i] + if i % 2 == 0 { b[(i / 2) % 3] } else { 0.0 } - tv[i])).collect();
        let gb: Vec<f64> = (0..3).map(|j| gw[2 * j] + gw[2 * (j + 3)]).collect();
        reference.step(&mut params, &[gw, gb], lr);
        let out = sess.step(&g, &inputs).unwrap();
        assert!(out.loss.is_some_and(f64::is_finite));
        for (k, name) in names.iter().enumerate() {
            let got = r2(&sess.state[*name]);
            for (a, b) in got.iter().zip(&params[k]) {
                assert!(
                    (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                    "{opt:?} step {step} {name}: {got:?} vs {:?} (seed {s})",
                    params[k]
                );
            }
        }
    }
}

#[test]
fn sgd_matches_pytorch() {
    let sgd = |momentum, nesterov, weight_decay| Optimizer {
        kind: OptimizerKind::Sgd { momentum, nesterov },
        lr: 0.05,
        weight_decay,
    };
    compare_optimizer(sgd(0.0, false, 0.0), 4);
    compare_optimizer(sgd(0.9, false, 0.0), 4);
    compare_optimizer(sgd(0.9, true, 0.01), 4);
    compare_optimizer(sgd(0.0, false, 0.1), 3);
}

#[test]
fn adam_and_adamw_match_pytorch() {
    let kind = OptimizerKind::Adam { beta1: 0.9, beta2: 0.999, eps: 1e-8 };
    compare_optimizer(Optimizer { kind: kind.clone(), lr: 1e-2, weight_decay: 0.0 }, 4);
    compare_optimizer(Optimizer { kind, lr: 1e-2, weight_decay: 0.05 }, 4);
    let kind = OptimizerKind::AdamW { beta1: 0.8, beta2: 0.99, eps: 1e-6 };
    compare_optimizer(Optimizer { kind, lr: 3e-2, weight_decay: 0.1 }, 4);
    let kind = OptimizerKind::Adam { beta1: 0.0, beta2: 0.5, eps: 1e-8 };
    compare_optimizer(Optimizer { kind, lr: 1e-2, weight_decay: 0.0 }, 3);
}

#[test]
fn optimizer_state_is_named_and_typed() {
    let g = model(&Optimizer {
        kind: OptimizerKind::Adam { beta1: 0.9, beta2: 0.999, eps: 1e-8 },
        lr: 1e-3,
        weight_decay: 0.0,
    });
    for (name, dtype) in [
        ("lin.weight.exp_avg", DType::C64),
        ("lin.weight.exp_avg_sq", DType::C64),
        ("lin.bias.exp_avg_sq", DType::F32),
        (optimizer::LR, DType::F32),
        (optimizer::STEP, DType::F32),
    ] {
        let v = g.find_leaf(name).unwrap_or_else(|| panic!("no state {name}"));
        assert!(matches!(g.node(v).op, Op::State { .. }));
        assert_eq!(g.node(v).origin.role, Role::State);
        assert_eq!(g.ty(v).dtype, dtype, "{name}");
    }
    let assigns = g.nodes.iter().filter(|(_, n)| matches!(n.op, Op::Assign)).count();
    assert_eq!(assigns, 2 + 2 * 2 + 1); // params, two moments each, the step count
    let sess = Session::new(&g, 1, 0);
    assert_eq!(sess.state[optimizer::LR], Tensor::scalar(1e-3));
}

#[test]
fn session_applies_assigns_and_counts_steps() {
    let mut g = Graph::new("count", Mode::Train);
    let mut b = Builder::new(&mut g);
    let acc = b.leaf(
        Op::State { name: "acc".into(), init: Init::Ones },
        TensorType::new(DType::C64, Shape::fixed(&[2])),
    );
    let step = b.leaf(
        Op::State { name: "step".into(), init: Init::Zeros },
        TensorType::new(DType::I32, Shape::scalar()),
    );
    let x = b.leaf(
        Op::Input { name: "x".into() },
        TensorType::new(DType::F32, Shape(vec![Dim::Batch, Dim::Fixed(2)])),
    );
    let s = b.sum(x, &[0]).unwrap();
    let s = b.reshape(s, Shape::fixed(&[2])).unwrap();
    let next = b.add2(acc, s).unwrap();
    b.add(Op::Assign, &[acc, next]).unwrap();
    let mask = b.add_shaped(Op::DropoutMask { p: 0.5, salt: 1 }, &[step], Some(&Shape::fixed(&[8]))).unwrap();
    g.outputs.push(Output { name: "mask".into(), value: mask });
    let mut sess = Session::new(&g, 3, 9);
    let inputs =
        HashMap::from([("x".to_string(), Tensor::real(&[3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))]);
    let first = sess.step(&g, &inputs).unwrap();
    sess.step(&g, &inputs).unwrap();
    assert_close(&sess.state["acc"], &Tensor::complex(&[2], vec![c(19.0, 0.0), c(25.0, 0.0)]), 0.0);
    assert_eq!(sess.state["step"], Tensor::int(&[], vec![2]));
    let want: Vec<f64> = (0..8).map(|i| if dropout_keep(0.5, 1, 0, i) { 2.0 } else { 0.0 }).collect();
    assert_close(&first.outputs["mask"], &Tensor::real(&[8], want), 0.0);
    assert!(sess.step(&g, &HashMap::new()).is_err());
}
