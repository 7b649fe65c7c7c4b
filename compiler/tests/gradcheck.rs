//! Gradient checks of autodiff: every differentiable op, with random shapes, dtypes, flags and
//! geometries, against central finite differences in f64 on the real and imaginary parts of
//! every input. Seeds are fixed per case (`CVC_SEED` varies them; see `docs/TESTING.md`).

use cvc_compiler::interp::check::{check_coordinates, random_tensor, GradCheckConfig};
use cvc_compiler::interp::{evaluate, SplitMix64, Tensor, TensorData};
use cvc_compiler::ir::builder::Builder;
use cvc_compiler::ir::verify::verify;
use cvc_compiler::ir::*;
use cvc_compiler::passes::autodiff::{gradients, gradients_chunked};
use std::collections::HashMap;

#[path = "../../tests/src/seed.rs"]
mod seed;

const F: DType = DType::F32;
const C: DType = DType::C64;

/// Where an input's random values lie (to stay off kinks and out of domain errors).
#[derive(Clone, Copy, PartialEq)]
enum Domain {
    /// Standard normal.
    Normal,
    /// In `[0.5, ∞)`.
    Positive,
    /// `|x| ≥ 0.5`, random sign.
    AwayFromZero,
}

/// One input of a case: dtype, shape, domain.
#[derive(Clone)]
struct Spec {
    dtype: DType,
    shape: Vec<usize>,
    domain: Domain,
}

fn spec(dtype: DType, shape: &[usize]) -> Spec {
    Spec { dtype, shape: shape.to_vec(), domain: Domain::Normal }
}

fn spec_in(dtype: DType, shape: &[usize], domain: Domain) -> Spec {
    Spec { dtype, shape: shape.to_vec(), domain }
}

type BuildFn<'a> = dyn Fn(&mut Builder, &[Value]) -> Result<Value, String> + 'a;

/// `Σ Re(conj(w)·out)` for a random fixed `w` of `out`'s type (real: `Σ w·out`), as a scalar.
fn weighted_sum(b: &mut Builder, out: Value, w_name: &str) -> Result<Value, String> {
    let ty = b.graph.ty(out).clone();
    let w = b.leaf(Op::Input { name: w_name.into() }, ty.clone());
    let prod = if ty.dtype.is_complex() {
        let cw = b.unary(UnaryOp::Conj, w)?;
        let p = b.mul(cw, out)?;
        b.unary(UnaryOp::Real, p)?
    } else {
        b.mul(w, out)?
    };
    let axes: Vec<usize> = (0..ty.shape.rank()).collect();
    let s = if axes.is_empty() { prod } else { b.sum(prod, &axes)? };
    b.reshape(s, Shape::scalar())
}

fn shaped(mut t: Tensor, domain: Domain) -> Tensor {
    let f = |x: f64| match domain {
        Domain::Normal => x,
        Domain::Positive => 0.5 + x.abs(),
        Domain::AwayFromZero => x.signum() * (0.5 + x.abs()),
    };
    match &mut t.data {
        TensorData::Real(v) => v.iter_mut().for_each(|x| *x = f(*x)),
        TensorData::Complex(v) => v.iter_mut().for_each(|z| {
            z.re = f(z.re);
            z.im = f(z.im);
        }),
        TensorData::Int(_) => {}
    }
    t
}

/// Builds `build(inputs)`, differentiates the weighted sum of it w.r.t. every input, and
/// compares with finite differences.
fn run_case(
    seed: u64,
    specs: &[Spec],
    batch: usize,
    max_coords: Option<usize>,
    rnn_chunk: Option<usize>,
    build: &BuildFn,
) -> Result<(), String> {
    let mut rng = SplitMix64::new(seed);
    let mut g = Graph::new("gradcheck", Mode::Train);
    let (xs, loss) = {
        let mut b = Builder::new(&mut g);
        let xs: Vec<Value> = specs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let shape =
                    Shape(s.shape.iter().map(|&d| if d == 0 { Dim::Batch } else { Dim::Fixed(d) }).collect());
                b.leaf(Op::Input { name: format!("x{i}") }, TensorType::new(s.dtype, shape))
            })
            .collect();
        let out = build(&mut b, &xs)?;
        (xs, weighted_sum(&mut b, out, "w")?)
    };
    g.loss = Some(loss);
    let fwd = g.clone();
    let grads = gradients_chunked(&mut g, loss, &xs, rnn_chunk)?;
    verify(&g)?;
    for (&x, &dx) in xs.iter().zip(&grads) {
        if g.ty(x) != g.ty(dx) {
            return Err(format!("gradient type {} for input {}", g.ty(dx), g.ty(x)));
        }
        if g.node(dx).origin.role != Role::Backward && !matches!(g.node(dx).op, Op::Scalar { .. }) {
            return Err(format!("gradient {dx} is not a backward node"));
        }
    }
    let mut leaves = HashMap::new();
    for (h, n) in g.nodes.iter() {
        if !matches!(n.op, Op::Input { .. } | Op::Param { .. } | Op::State { .. }) {
            continue;
        }
        let shape = n.ty.shape.resolve(batch);
        let domain = xs.iter().position(|&x| x == h).map_or(Domain::Normal, |i| specs[i].domain);
        leaves.insert(h, shaped(random_tensor(n.ty.dtype, &shape, 3, &mut rng), domain));
    }
    let pairs: Vec<(Value, Value)> =
        xs.iter().copied().zip(grads).filter(|&(x, _)| g.ty(x).dtype != DType::I32).collect();
    let cfg = GradCheckConfig { eps: 1e-6, tol: 1e-6, max_coords };
    check_coordinates(&fwd, &g, batch, &leaves, loss, &pairs, cfg, &mut rng)?;
    Ok(())
}

fn check(name: &str, specs: &[Spec], build: &BuildFn) {
    check_full(name, specs, 1, None, build)
}

fn check_full(name: &str, specs: &[Spec], batch: usize, max_coords: Option<usize>, build: &BuildFn) {
    let seed = seed::seed_for(&format!("gradcheck::{name}"));
    if let Err(e) = run_case(seed, specs, batch, max_coords, None, build) {
        panic!("{name}: {e}\n  seed {seed:#x} (the line printed above says how to replay it)");
    }
}

#[test]
fn unary_ops() {
    use Domain::*;
    use UnaryOp::*;
    let cases: &[(UnaryOp, &[DType], Domain)] = &[
        (Neg, &[F, C], Normal),
        (Conj, &[F, C], Normal),
        (Real, &[F, C], Normal),
        (Imag, &[F, C], Normal),
        (Abs, &[F, C], AwayFromZero),
        (Abs2, &[F, C], Normal),
        (Angle, &[F, C], AwayFromZero),
        (ToComplex, &[F], Normal),
        (Exp, &[F], Normal),
        (Log, &[F], Positive),
        (Sqrt, &[F], Positive),
        (Rsqrt, &[F], Positive),
        (Recip, &[F], AwayFromZero),
        (Sin, &[F], Normal),
        (Cos, &[F], Normal),
        (Tanh, &[F], Normal),
        (Sigmoid, &[F], Normal),
        (Relu, &[F], AwayFromZero),
        (Step, &[F], AwayFromZero),
        (Gelu, &[F], Normal),
        (GeluGrad, &[F], Normal),
        (GeluTanh, &[F], Normal),
        (GeluTanhGrad, &[F], Normal),
    ];
    for &(op, dtypes, domain) in cases {
        for &dt in dtypes {
            check(&format!("{op:?} {dt}"), &[spec_in(dt, &[2, 3], domain)], &|b, x| b.unary(op, x[0]));
        }
    }
}

#[test]
fn stop_grad_blocks_the_gradient() {
    let mut g = Graph::new("stop", Mode::Train);
    let mut b = Builder::new(&mut g);
    let x = b.leaf(Op::Input { name: "x".into() }, TensorType::new(C, Shape::fixed(&[3])));
    let s = b.unary(UnaryOp::StopGrad, x).unwrap();
    let a = b.unary(UnaryOp::Abs2, s).unwrap();
    let l = b.sum(a, &[0]).unwrap();
    let l = b.reshape(l, Shape::scalar()).unwrap();
    let dx = gradients(&mut g, l, &[x]).unwrap()[0];
    verify(&g).unwrap();
    let mut rng = SplitMix64::new(seed::seed_for("gradcheck::stop_grad_blocks_the_gradient"));
    let leaves = HashMap::from([(x, random_tensor(C, &[3], 1, &mut rng))]);
    let vals = evaluate(&g, 1, &leaves).unwrap();
    let d = vals[dx.index()].as_ref().unwrap();
    assert_eq!(d.shape, vec![3]);
    assert!(d.to_complex_vec().iter().all(|z| z.norm() == 0.0), "{d:?}");
}

#[test]
fn binary_ops_broadcast_and_mixed_dtypes() {
    use BinaryOp::*;
    let shapes: &[(&[usize], &[usize])] =
        &[(&[2, 3], &[2, 3]), (&[2, 3], &[3]), (&[2, 1], &[1, 3]), (&[], &[2, 3])];
    let all = [(F, F), (C, C), (F, C), (C, F)];
    for &(sa, sb) in shapes {
        for op in [Add, Sub, Mul] {
            for (da, db) in all {
                check(&format!("{op:?} {da}{sa:?} {db}{sb:?}"), &[spec(da, sa), spec(db, sb)], &|b, x| {
                    b.binary(op, x[0], x[1])
                });
            }
        }
        for (da, db) in all {
            let specs = [spec(da, sa), spec_in(db, sb, Domain::AwayFromZero)];
            check(&format!("Div {da}{sa:?} {db}{sb:?}"), &specs, &|b, x| b.div(x[0], x[1]));
        }
        for op in [Max, Complex, Greater, Equal] {
            check(&format!("{op:?} {sa:?} {sb:?}"), &[spec(F, sa), spec(F, sb)], &|b, x| {
                b.binary(op, x[0], x[1])
            });
        }
    }
}

#[test]
fn select_routes_gradients() {
    for (da, db) in [(F, F), (C, F), (F, C), (C, C)] {
        let specs = [spec(F, &[2, 1]), spec(da, &[2, 3]), spec(db, &[3])];
        check(&format!("select {da} {db}"), &specs, &|b, x| b.add(Op::Select, &[x[0], x[1], x[2]]));
    }
}

#[test]
fn reductions() {
    let cases: &[(&[usize], &[usize])] =
        &[(&[3, 4], &[0]), (&[3, 4], &[1]), (&[3, 4], &[0, 1]), (&[2, 3, 4], &[0, 2])];
    for &(shape, axes) in cases {
        for (op, dtypes) in [(ReduceOp::Sum, [F, C]), (ReduceOp::MaxMag, [F, C]), (ReduceOp::Max, [F, F])] {
            for dt in dtypes {
                let r = Op::Reduce { op, axes: axes.to_vec() };
                check(&format!("{op:?} {dt}{shape:?} axes {axes:?}"), &[spec(dt, shape)], &|b, x| {
                    b.add(r.clone(), &[x[0]])
                });
            }
        }
    }
}

#[test]
fn layout_ops() {
    for dt in [F, C] {
        check("reshape", &[spec(dt, &[2, 3, 4])], &|b, x| b.reshape(x[0], Shape::fixed(&[6, 4])));
        check("expand", &[spec(dt, &[3, 1])], &|b, x| b.expand(x[0], Shape::fixed(&[2, 3, 4])));
        check("permute", &[spec(dt, &[2, 3, 4])], &|b, x| {
            b.add(Op::Permute { perm: vec![2, 0, 1] }, &[x[0]])
        });
        check("slice", &[spec(dt, &[2, 5, 3])], &|b, x| {
            b.add(Op::Slice { axis: 1, start: 1, len: 3 }, &[x[0]])
        });
        check("pad", &[spec(dt, &[2, 3])], &|b, x| b.add(Op::Pad { axis: 1, before: 2, after: 1 }, &[x[0]]));
    }
    for (da, db) in [(F, F), (F, C), (C, F), (C, C)] {
        let specs = [spec(da, &[2, 3]), spec(db, &[2, 2]), spec(F, &[2, 1])];
        check(&format!("concat {da} {db}"), &specs, &|b, x| {
            b.add(Op::Concat { axis: 1 }, &[x[0], x[1], x[2]])
        });
    }
    // The batch dimension resolves at evaluation; a batch mean uses Scalar{batch_exp: -1}.
    check_full("batch mean", &[spec(C, &[0, 3])], 3, None, &|b, x| {
        let s = b.sum(x[0], &[0])?;
        let inv_b = b.add(Op::Scalar { value: 1.0, batch_exp: -1 }, &[])?;
        b.mul(s, inv_b)
    });
}

#[test]
fn matmul_all_flags_and_dtypes() {
    let (m, k, n) = (2, 3, 4);
    for flags in 0..16u32 {
        let trans = [flags & 1 != 0, flags & 2 != 0];
        let conj = [flags & 4 != 0, flags & 8 != 0];
        let sa = if trans[0] { [k, m] } else { [m, k] };
        let sb = if trans[1] { [n, k] } else { [k, n] };
        for (da, db) in [(C, C), (F, C), (C, F), (F, F)] {
            let mm = Op::MatMul { trans, conj, sum_batch: false };
            check(
                &format!("matmul trans {trans:?} conj {conj:?} {da} {db}"),
                &[spec(da, &sa), spec(db, &sb)],
                &|b, x| b.add(mm.clone(), &[x[0], x[1]]),
            );
        }
    }
}

/// Batched matmuls: both operands batched (the batch `B` among the leading axes), either one
/// 2-D and broadcast, and the summed form; all transposes, a few conjugations and dtypes.
#[test]
fn matmul_batched_broadcast_and_summed() {
    let (m, k, n) = (2, 3, 2);
    // (leading axes of a, of b, sum_batch); 0 is the batch B (resolved to 2 below).
    let forms: [(&[usize], &[usize], bool); 5] = [
        (&[0, 2], &[0, 2], false),
        (&[3], &[], false),
        (&[], &[0, 2], false),
        (&[0], &[0], true),
        (&[2, 2], &[2, 2], true),
    ];
    for (pa, pb, sum_batch) in forms {
        for flags in [0u32, 1, 2, 3, 5, 10, 15] {
            let trans = [flags & 1 != 0, flags & 2 != 0];
            let conj = [flags & 4 != 0, flags & 8 != 0];
            let sa: Vec<usize> = pa.iter().copied().chain(if trans[0] { [k, m] } else { [m, k] }).collect();
            let sb: Vec<usize> = pb.iter().copied().chain(if trans[1] { [n, k] } else { [k, n] }).collect();
            for (da, db) in [(C, C), (F, C), (C, F), (F, F)] {
                let mm = Op::MatMul { trans, conj, sum_batch };
                check_full(
                    &format!("matmul {pa:?}·{pb:?} sum {sum_batch} trans {trans:?} conj {conj:?} {da} {db}"),
                    &[spec(da, &sa), spec(db, &sb)],
                    2,
                    None,
                    &|b, x| b.add(mm.clone(), &[x[0], x[1]]),
                );
            }
        }
    }
}

/// The gradient of a weight broadcast over the batch is one summed matmul: no `[P.., m, n]`
/// temporary and no separate reduction; and the gradients of a summed product are matmuls.
#[test]
fn matmul_gradients_stay_matmuls() {
    for (sx, sw, trans, sum_batch) in [
        (vec![Dim::Batch, Dim::Fixed(5), Dim::Fixed(4)], vec![3, 4], [false, true], false),
        (vec![Dim::Batch, Dim::Fixed(4), Dim::Fixed(5)], vec![4, 3], [true, false], false),
        (vec![Dim::Fixed(2), Dim::Batch, Dim::Fixed(5), Dim::Fixed(4)], vec![4, 3], [false, false], false),
    ] {
        let mut g = Graph::new("mm", Mode::Train);
        let mut b = Builder::new(&mut g);
        let x = b.leaf(Op::Input { name: "x".into() }, TensorType::new(C, Shape(sx)));
        let w = b.leaf(Op::Input { name: "w".into() }, TensorType::new(C, Shape::fixed(&sw)));
        let y = b.add(Op::MatMul { trans, conj: [false, false], sum_batch }, &[x, w]).unwrap();
        let p = b.unary(UnaryOp::Abs2, y).unwrap();
        let axes: Vec<usize> = (0..b.graph.ty(p).shape.rank()).collect();
        let l = b.sum(p, &axes).unwrap();
        let l = b.reshape(l, Shape::scalar()).unwrap();
        let n_fwd = g.nodes.len();
        let [dx, dw] = gradients(&mut g, l, &[x, w]).unwrap()[..] else { panic!("two gradients") };
        verify(&g).unwrap();
        let node = g.node(dw);
        assert!(matches!(node.op, Op::MatMul { sum_batch: true, .. }), "dw is {:?}", node.op);
        assert!(matches!(g.node(dx).op, Op::MatMul { sum_batch: false, .. }), "dx is {:?}", g.node(dx).op);
        let mm: Vec<_> = g.nodes.iter().skip(n_fwd).filter(|(_, n)| n.op.is_contraction()).collect();
        assert_eq!(mm.len(), 2, "one matmul per gradient");
        assert!(
            g.nodes.iter().skip(n_fwd).all(|(_, n)| !matches!(n.op, Op::Reduce { .. })),
            "no reduction in the backward of a matmul"
        );
    }
    // The summed product's gradients are broadcast products, again without reductions.
    let mut h = Graph::new("summed", Mode::Train);
    let mut b = Builder::new(&mut h);
    let shape = Shape(vec![Dim::Fixed(2), Dim::Batch, Dim::Fixed(5), Dim::Fixed(4)]);
    let a = b.leaf(Op::Input { name: "a".into() }, TensorType::new(C, shape.clone()));
    let c = b.leaf(Op::Input { name: "c".into() }, TensorType::new(F, shape));
    let s =
        b.add(Op::MatMul { trans: [true, false], conj: [false, false], sum_batch: true }, &[a, c]).unwrap();
    let p = b.unary(UnaryOp::Abs2, s).unwrap();
    let l = b.sum(p, &[0, 1]).unwrap();
    let l = b.reshape(l, Shape::scalar()).unwrap();
    let n_fwd = h.nodes.len();
    let grads = gradients(&mut h, l, &[a, c]).unwrap();
    verify(&h).unwrap();
    for d in grads {
        // (the real operand's gradient is the real part of a matmul)
        let d = if h.node(d).op == Op::Unary(UnaryOp::Real) { h.node(d).inputs[0] } else { d };
        assert!(matches!(h.node(d).op, Op::MatMul { sum_batch: false, .. }), "{:?}", h.node(d).op);
    }
    assert!(h.nodes.iter().skip(n_fwd).all(|(_, n)| !matches!(n.op, Op::Reduce { .. })));
}

/// Geometries exercised by the convolution checks: (stride, pad, dilation, groups).
fn geometries() -> Vec<ConvGeom> {
    vec![
        ConvGeom { stride: [1, 1], pad: [0, 0], dilation: [1, 1], groups: 1 },
        ConvGeom { stride: [2, 1], pad: [1, 0], dilation: [1, 1], groups: 2 },
        ConvGeom { stride: [1, 2], pad: [2, 1], dilation: [2, 1], groups: 1 },
    ]
}

const CONV_DTYPES: [(DType, DType); 4] = [(C, C), (F, C), (C, F), (F, F)];

#[test]
fn conv2d_family() {
    let (n, c, h, w, o, kh, kw) = (2, 4, 5, 6, 4, 3, 2);
    for geom in geometries() {
        let ho = geom.out_extent(0, h, kh).unwrap();
        let wo = geom.out_extent(1, w, kw).unwrap();
        let cg = c / geom.groups;
        for cf in 0..4u32 {
            let conj = [cf & 1 != 0, cf & 2 != 0];
            for (da, db) in CONV_DTYPES {
                let what = format!("{geom:?} conj {conj:?} {da} {db}");
                let conv = Op::Conv2d { geom, conj };
                let specs = [spec(da, &[n, c, h, w]), spec(db, &[o, cg, kh, kw])];
                check_full(&format!("conv2d {what}"), &specs, 1, Some(24), &|b, x| {
                    b.add(conv.clone(), &[x[0], x[1]])
                });
                let ct = Op::ConvTranspose2d { geom, out_hw: [h, w], conj };
                let specs = [spec(da, &[n, o, ho, wo]), spec(db, &[o, cg, kh, kw])];
                check_full(&format!("conv_transpose2d {what}"), &specs, 1, Some(24), &|b, x| {
                    b.add(ct.clone(), &[x[0], x[1]])
                });
                let wg = Op::Conv2dWeightGrad { geom, kernel: [kh, kw], conj };
                let specs = [spec(da, &[n, c, h, w]), spec(db, &[n, o, ho, wo])];
                check_full(&format!("conv2d_weight_grad {what}"), &specs, 1, Some(24), &|b, x| {
                    b.add(wg.clone(), &[x[0], x[1]])
                });
            }
        }
    }
}

#[test]
fn fft_both_directions_all_norms() {
    for axis in [0, 1] {
        for inverse in [false, true] {
            for norm in [FftNorm::Backward, FftNorm::Ortho, FftNorm::Forward] {
                let op = Op::Fft { axis, inverse, norm };
                check(
                    &format!("fft axis {axis} inverse {inverse} {norm:?}"),
                    &[spec(C, &[3, 4])],
                    &|b, x| b.add(op.clone(), &[x[0]]),
                );
            }
        }
    }
}

#[test]
fn gather_and_scatter_add() {
    // Integer leaves are drawn in 0..3: repeated indices (their rows' gradients add up) and a
    // table row no index reads (zero gradient). The indices carry no gradient.
    fn indices(b: &mut Builder, dims: Vec<Dim>) -> Value {
        b.leaf(Op::Input { name: "idx".into() }, TensorType::new(DType::I32, Shape(dims)))
    }
    for dt in [F, C] {
        check(&format!("gather {dt}"), &[spec(dt, &[4, 3])], &|b, x| {
            let idx = indices(b, vec![Dim::Batch, Dim::Fixed(5)]);
            b.add(Op::Gather, &[x[0], idx])
        });
        check(&format!("scatter_add {dt}"), &[spec(dt, &[0, 5, 3])], &|b, x| {
            let idx = indices(b, vec![Dim::Batch, Dim::Fixed(5)]);
            b.add(Op::ScatterAdd { rows: 4 }, &[x[0], idx])
        });
    }
    check_full("gather batch 2", &[spec(C, &[4, 2])], 2, None, &|b, x| {
        let idx = indices(b, vec![Dim::Batch, Dim::Fixed(3)]);
        let rows = b.add(Op::Gather, &[x[0], idx])?;
        b.unary(UnaryOp::Abs2, rows)
    });
}

#[test]
fn constant_producers_carry_no_gradient() {
    // One-hot rows and dropout masks are constants: the gradient flows to the other operand.
    check("one_hot", &[spec(C, &[2, 3])], &|b, x| {
        let labels =
            b.leaf(Op::Input { name: "labels".into() }, TensorType::new(DType::I32, Shape::fixed(&[2])));
        let oh = b.add(Op::OneHot { classes: 3 }, &[labels])?;
        b.mul(x[0], oh)
    });
    check("dropout", &[spec(C, &[2, 3])], &|b, x| {
        let step = b.leaf(
            Op::State { name: "step".into(), init: Init::Zeros },
            TensorType::new(DType::I32, Shape::scalar()),
        );
        let mask =
            b.add_shaped(Op::DropoutMask { p: 0.5, salt: 7 }, &[step], Some(&Shape::fixed(&[2, 3])))?;
        b.mul(x[0], mask)
    });
}

#[test]
fn composite_chains_share_values() {
    // Several users of one value, a complex → real → complex round trip and a normalisation.
    check("chain", &[spec(C, &[2, 3]), spec(F, &[3])], &|b, x| {
        let a = b.unary(UnaryOp::Abs, x[0])?;
        let e = b.mul(a, x[1])?;
        let t = b.unary(UnaryOp::Tanh, e)?;
        let z = b.mul(x[0], t)?;
        let s = b.sum(z, &[1])?;
        let m = b.add(Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 1] }, &[a])?;
        let r = b.unary(UnaryOp::Recip, m)?;
        let y = b.mul(s, r)?;
        b.mul(y, x[0])
    });
}

/// `AttnLse` then `Attention` on `q, k, v` (`x[0..3]`), with a key mask drawn from a leaf
/// (about a third of the keys ignored) and the dropout step counter when `spec` asks for them.
fn attention_composite(b: &mut Builder, x: &[Value], spec: AttnSpec) -> Result<Value, String> {
    let (bt, s) = (b.graph.ty(x[1]).shape.0[0], b.graph.ty(x[1]).shape.0[1]);
    let mut extra = Vec::new();
    if spec.key_mask {
        let m = b.leaf(Op::Input { name: "mask_source".into() }, TensorType::new(F, Shape(vec![bt, s])));
        let cut = b.scalar(0.4, 0);
        extra.push(b.binary(BinaryOp::Greater, m, cut)?);
    }
    if spec.dropout.is_some() {
        extra.push(b.leaf(
            Op::State { name: "step".into(), init: Init::Zeros },
            TensorType::new(DType::I32, Shape::scalar()),
        ));
    }
    let lse_ops: Vec<Value> =
        [x[0], x[1]].into_iter().chain(extra.iter().copied().take(usize::from(spec.key_mask))).collect();
    let lse = b.add(Op::AttnLse { spec }, &lse_ops)?;
    let ops: Vec<Value> = [x[0], x[1], x[2], lse].into_iter().chain(extra).collect();
    b.add(Op::Attention { spec }, &ops)
}

#[test]
fn attention_full_derivative() {
    // The rule of `Attention` is the derivative of softmax attention through `lse` too:
    // finite differences move q and k, and with them lse.
    let base = AttnSpec {
        heads: AttnHeads::separate(2, 2),
        scale: 0.7,
        score: AttnScore::Real,
        causal: false,
        key_mask: false,
        dropout: None,
    };
    let cases = [
        ("real", base, [3, 3, 2, 2]),
        ("abs_cross", AttnSpec { score: AttnScore::Abs, scale: 0.5, ..base }, [4, 3, 2, 3]),
        ("causal", AttnSpec { causal: true, ..base }, [4, 3, 3, 2]),
        ("causal_abs", AttnSpec { causal: true, score: AttnScore::Abs, ..base }, [3, 5, 2, 1]),
        ("key_mask", AttnSpec { key_mask: true, ..base }, [3, 5, 2, 2]),
        ("dropout", AttnSpec { dropout: Some((0.4, 11)), ..base }, [3, 4, 2, 2]),
        (
            "everything",
            AttnSpec {
                score: AttnScore::Abs,
                causal: true,
                key_mask: true,
                dropout: Some((0.25, 3)),
                scale: 0.9,
                ..base
            },
            [4, 4, 3, 2],
        ),
    ];
    for (name, attn, [t, s, d, dv]) in cases {
        // q [B, T, H·D], k [B, S, H·D], v [B, S, H·Dv]; batch 2, 2 heads.
        let attn = AttnSpec { heads: AttnHeads { n: 2, d, dv, cols: [0; 3] }, ..attn };
        let specs = [spec(C, &[0, t, 2 * d]), spec(C, &[0, s, 2 * d]), spec(C, &[0, s, 2 * dv])];
        check_full(&format!("attention_{name}"), &specs, 2, None, &|b, x| attention_composite(b, x, attn));
    }
}

#[test]
fn attention_of_packed_operands() {
    // q, k and v read as columns of one tensor (a packed in-projection): the gradient of each
    // lands in its columns, the three joined by autodiff (one `Concat` where they tile the
    // tensor, pads and a sum where columns are left over, as here in `gap`).
    let (h, d, dv, t) = (2, 2, 3, 4);
    let base = AttnSpec {
        heads: AttnHeads { n: h, d, dv, cols: [0, h * d, 2 * h * d] },
        scale: 0.6,
        score: AttnScore::Real,
        causal: false,
        key_mask: false,
        dropout: None,
    };
    let w = 2 * h * d + h * dv;
    let gap = AttnSpec { heads: AttnHeads { cols: [1, 1 + h * d, 2 + 2 * h * d], ..base.heads }, ..base };
    let abs = AttnSpec { score: AttnScore::Abs, causal: true, ..base };
    for (name, attn, width) in [("tiled", base, w), ("gap", gap, w + 3), ("abs_causal", abs, w)] {
        check_full(&format!("attention_packed_{name}"), &[spec(C, &[0, t, width])], 2, None, &|b, x| {
            attention_composite(b, &[x[0], x[0], x[0]], attn)
        });
    }
    // Cross-attention: q on its own, k ‖ v packed (autodiff keeps dk ‖ dv whole).
    let cross = AttnSpec { heads: AttnHeads { n: h, d, dv, cols: [0, 0, h * d] }, ..base };
    let specs = [spec(C, &[0, t, h * d]), spec(C, &[0, 3, h * (d + dv)])];
    check_full("attention_packed_kv", &specs, 2, None, &|b, x| {
        attention_composite(b, &[x[0], x[1], x[1]], cross)
    });
}

/// The `.cvnn` files in `dir` (relative to the repository root), sorted.
fn cvnn_files(dir: &str) -> Vec<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cvnn"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .cvnn files in {}", dir.display());
    files
}

/// Checks a whole network in train mode at batch 2: the gradient of its loss (or, for a
/// model without one, of a random weighted sum of its outputs) w.r.t. every parameter and
/// every real or complex input, along random directions (two loss evaluations per
/// direction keep whole networks affordable in a debug build), and, when `coords` is
/// given, coordinate by coordinate on that many random coordinates of up to six random leaves.
fn gradcheck_network(path: &std::path::Path, coords: Option<usize>) {
    use cvc_compiler::front::check_source;
    use cvc_compiler::interp::check::{check_coordinates, check_directions, random_inputs};
    use cvc_compiler::interp::Session;
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    let src = std::fs::read_to_string(path).unwrap();
    let checked = check_source(&name, &src, Mode::Train).unwrap_or_else(|d| panic!("{name}: {d:?}"));
    let seed = seed::seed_for(&format!("gradcheck::network {name}"));
    let started = std::time::Instant::now();
    let result = (|| -> Result<(), String> {
        let mut g = checked.graph.clone();
        let loss = match g.loss {
            Some(l) => l,
            None => {
                let outs: Vec<Value> =
                    g.outputs.iter().map(|o| o.value).filter(|&v| g.ty(v).dtype != DType::I32).collect();
                let mut b = Builder::new(&mut g);
                let mut total = None;
                for (k, out) in outs.into_iter().enumerate() {
                    let s = weighted_sum(&mut b, out, &format!("gradcheck.w{k}"))?;
                    total = Some(match total {
                        Some(t) => b.add2(t, s)?,
                        None => s,
                    });
                }
                total.ok_or("no real or complex output")?
            }
        };
        g.loss = Some(loss);
        let fwd = g.clone();
        let wrt: Vec<Value> = g
            .nodes
            .iter()
            .filter(|(_, n)| match n.op {
                Op::Param { .. } => true,
                Op::Input { .. } => n.ty.dtype != DType::I32,
                _ => false,
            })
            .map(|(h, _)| h)
            .collect();
        let grads = gradients(&mut g, loss, &wrt)?;
        verify(&g)?;
        let batch = 2;
        let mut rng = SplitMix64::new(seed);
        let mut leaves = random_inputs(&g, batch, 1.0, &mut rng);
        let session = Session::new(&g, batch, seed);
        for v in g.persistent() {
            leaves.insert(v, session.state[g.leaf_name(v).unwrap()].clone());
        }
        let pairs: Vec<(Value, Value)> = wrt.into_iter().zip(grads).collect();
        let cfg = GradCheckConfig { eps: 1e-6, tol: 1e-6, max_coords: None };
        check_directions(&fwd, &g, batch, &leaves, loss, &pairs, 2, cfg, &mut rng)?;
        if let Some(k) = coords {
            // A random handful of leaves, a few random coordinates each.
            let mut some = pairs.clone();
            while some.len() > 6 {
                some.swap_remove((rng.next_u64() % some.len() as u64) as usize);
            }
            let cfg = GradCheckConfig { max_coords: Some(k), ..cfg };
            check_coordinates(&fwd, &g, batch, &leaves, loss, &some, cfg, &mut rng)?;
        }
        Ok(())
    })();
    if let Err(e) = result {
        panic!("{name}: {e}\n  seed {seed:#x} (the line printed above says how to replay it)");
    }
    eprintln!("{name}: gradients agree ({:.1} s)", started.elapsed().as_secs_f64());
}

/// Every `examples/*.cvnn` network.
#[test]
fn example_networks() {
    for path in cvnn_files("examples") {
        // The full-size ViT (12 layers of dimension 192 over 256 tokens) costs tens of GFLOP
        // per evaluation on the f64 interpreter; `tests/fixtures/ok/vit_tiny.cvnn` (the same
        // layers at test size) is checked by `fixture_networks` instead.
        if HEAVY_EXAMPLES.iter().any(|h| path.ends_with(h)) {
            continue;
        }
        gradcheck_network(&path, None);
    }
}

/// Examples too large for finite differences on the interpreter, each with a test-size twin
/// among the fixtures.
const HEAVY_EXAMPLES: [&str; 2] = ["vit_sar.cvnn", "polsar_unet.cvnn"];

/// Every passing front-end fixture (every layer of the language, dropout, losses, blocks),
/// except copies of an example (checked above).
#[test]
fn fixture_networks() {
    let examples: Vec<String> =
        cvnn_files("examples").iter().filter_map(|p| std::fs::read_to_string(p).ok()).collect();
    for path in cvnn_files("tests/fixtures/ok") {
        if std::fs::read_to_string(&path).is_ok_and(|s| examples.contains(&s)) {
            continue;
        }
        gradcheck_network(&path, Some(4));
    }
}

/// The fused recurrences: `Recurrence`'s rule (`RecurrenceGrad` and the reductions of `dgh`
/// for `W_hh` and `b_hh`) against finite differences, GRU and LSTM, both directions.
#[test]
fn recurrence_full_derivative() {
    for cell in [RnnCell::Gru, RnnCell::Lstm] {
        for reverse in [false, true] {
            let (h, t) = (2, 4);
            let gw = cell.gates() * h;
            let rnn = RnnSpec { cell, hidden: h, reverse, init: false };
            let specs = [spec(C, &[0, t, gw]), spec(C, &[gw, h]), spec(C, &[gw])];
            check_full(&format!("recurrence_{cell:?}_{reverse}"), &specs, 2, None, &|b, x| {
                b.add(Op::Recurrence { spec: rnn }, &[x[0], x[1], x[2]])
            });
        }
    }
}

/// A recurrence from a given initial state (`RnnSpec::init`): the gradient of `h0` (the first
/// step's carry, in `RecurrenceGrad`'s last row) and of everything else against finite
/// differences, GRU and LSTM, both directions, one step and several.
#[test]
fn recurrence_from_an_initial_state() {
    for cell in [RnnCell::Gru, RnnCell::Lstm] {
        for reverse in [false, true] {
            for t in [1, 4] {
                let h = 2;
                let (gw, sw) = (cell.gates() * h, cell.states() * h);
                let rnn = RnnSpec { cell, hidden: h, reverse, init: true };
                let specs = [spec(C, &[0, t, gw]), spec(C, &[gw, h]), spec(C, &[gw]), spec(C, &[0, sw])];
                check_full(&format!("recurrence_h0_{cell:?}_{reverse}_{t}"), &specs, 2, None, &|b, x| {
                    b.add(Op::Recurrence { spec: rnn }, &[x[0], x[1], x[2], x[3]])
                });
            }
        }
    }
}

/// Chunked back-propagation through time (`gradients_chunked`) against finite differences:
/// every chunk length from 1 to past `T`, dividing `T` or not, both cells and directions.
#[test]
fn chunked_recurrence_backward() {
    for cell in [RnnCell::Gru, RnnCell::Lstm] {
        for reverse in [false, true] {
            let (h, t) = (2, 5);
            let gw = cell.gates() * h;
            let rnn = RnnSpec { cell, hidden: h, reverse, init: false };
            let specs = [spec(C, &[0, t, gw]), spec(C, &[gw, h]), spec(C, &[gw])];
            for k in [1, 2, 3, 4, 6] {
                let name = format!("recurrence_chunked_{cell:?}_{reverse}_{k}");
                let seed = seed::seed_for(&format!("gradcheck::{name}"));
                let build =
                    |b: &mut Builder, x: &[Value]| b.add(Op::Recurrence { spec: rnn }, &[x[0], x[1], x[2]]);
                if let Err(e) = run_case(seed, &specs, 2, None, Some(k), &build) {
                    panic!("{name}: {e}\n  seed {seed:#x}");
                }
            }
        }
    }
}

/// Slices of one tensor that tile an axis (one range read twice, one piece sliced again on a
/// second axis) and a slice of a middle range, combined non-linearly.
fn sliced_pieces(b: &mut Builder, x: Value) -> Result<Value, String> {
    let sl = |b: &mut Builder, v: Value, axis: usize, start: usize, len: usize| {
        b.add(Op::Slice { axis, start, len }, &[v])
    };
    let a = sl(b, x, 1, 0, 2)?;
    let m = sl(b, x, 1, 2, 4)?;
    let m2 = sl(b, x, 1, 2, 4)?;
    let c = sl(b, x, 1, 6, 1)?;
    let (c0, c1) = (sl(b, c, 2, 0, 1)?, sl(b, c, 2, 1, 2)?);
    let mm = b.mul(m, m2)?;
    let cc = b.add(Op::Concat { axis: 2 }, &[c1, c0])?;
    let c2 = b.mul(cc, c)?;
    b.add(Op::Concat { axis: 1 }, &[c2, mm, a])
}

#[test]
fn sliced_pieces_take_their_gradient_as_one_concatenation() {
    for dt in [F, C] {
        check(&format!("sliced pieces {dt}"), &[spec(dt, &[2, 7, 3])], &|b, x| sliced_pieces(b, x[0]));
        // The gradient of `x` is one concatenation of its pieces' gradients: no pad remains
        // among its operands, so no full-size zero-padded copy is written per piece.
        let mut g = Graph::new("pieces", Mode::Train);
        let (x, loss) = {
            let mut b = Builder::new(&mut g);
            let x = b.leaf(Op::Input { name: "x".into() }, TensorType::new(dt, Shape::fixed(&[2, 7, 3])));
            let out = sliced_pieces(&mut b, x).expect("builds");
            (x, weighted_sum(&mut b, out, "w").expect("builds"))
        };
        g.loss = Some(loss);
        let dx = gradients(&mut g, loss, &[x]).expect("differentiates")[0];
        assert!(matches!(g.node(dx).op, Op::Concat { axis: 1 }), "{dt}: dx is {}", g.node(dx).op.mnemonic());
        let mut stack = vec![dx];
        let mut seen = std::collections::HashSet::new();
        while let Some(v) = stack.pop() {
            if !seen.insert(v) || g.node(v).origin.role != Role::Backward {
                continue;
            }
            assert!(!matches!(g.node(v).op, Op::Pad { .. }), "{dt}: a pad feeds dx: {v}");
            stack.extend(g.node(v).inputs.iter().copied());
        }
    }
}
