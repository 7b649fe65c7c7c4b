//! The CPU module (`back::cpu`): every launch addresses memory inside the arena, each launch
//! computes the group it names in schedule order, and operands are resolved as the IR says
//! (transposes as strides, slices as offsets). Values are tested end to end against the f64
//! interpreter in `tests/tests/cpu_vs_interp.rs`; these tests check the module itself.

use cvc_compiler::back::clif::host_config;
use cvc_compiler::back::cpu::{generate, ConvCall, CpuCall, CpuModule, StridedCopy};
use cvc_compiler::front::check_source;
use cvc_compiler::ir::builder::Builder;
use cvc_compiler::ir::*;
use cvc_compiler::passes::fusion::GroupKind;
use cvc_compiler::passes::pipeline::{compile, Options};
use cvc_compiler::passes::Program;

fn sources() -> Vec<(String, String)> {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut out = Vec::new();
    for dir in [format!("{root}/../examples"), format!("{root}/../tests/fixtures/ok")] {
        let mut paths: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .map(|e| e.expect("dir entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "cvnn"))
            .collect();
        paths.sort();
        for p in paths {
            let src = std::fs::read_to_string(&p).expect("readable fixture");
            out.push((p.file_name().expect("name").to_string_lossy().into_owned(), src));
        }
    }
    out
}

/// The highest byte a strided copy touches on either side, plus one.
fn copy_end(c: &StridedCopy) -> (usize, usize) {
    let reach = |strides: &[isize], words: usize| -> usize {
        let last: isize = c.shape.iter().zip(strides).map(|(&n, &s)| (n.max(1) as isize - 1) * s).sum();
        (last as usize + 1) * words * 4
    };
    (c.src + reach(&c.src_strides, c.src_words), c.dst + reach(&c.dst_strides, c.dst_words))
}

fn conv_ends(c: &ConvCall, call: &CpuCall) -> [usize; 3] {
    let w = |b: bool| if b { 8 } else { 4 };
    let [n, ci, h, wi] = c.shape.x;
    let [o, cg, kh, kw] = c.shape.w;
    let x = n * ci * h * wi;
    let wt = o * cg * kh * kw;
    let y = n * o * c.shape.out[0] * c.shape.out[1];
    match call {
        CpuCall::Conv(_) => [c.x + x * w(c.types.x), c.w + wt * w(c.types.w), c.y + y * c.out_words * 4],
        CpuCall::ConvTranspose(_) => {
            [c.x + y * w(c.types.x), c.w + wt * w(c.types.w), c.y + x * c.out_words * 4]
        }
        _ => [c.x + x * w(c.types.x), c.w + y * w(c.types.w), c.y + wt * c.out_words * 4],
    }
}

/// Every byte a launch reads or writes lies inside the arena.
fn assert_inside(name: &str, m: &CpuModule) {
    let arena = m.arena_bytes;
    for l in &m.launches {
        let ends: Vec<usize> = match &l.call {
            CpuCall::Loop { kernel } => {
                assert!(*kernel < m.loops.len(), "{name}: group {} names loop {kernel}", l.group);
                assert_eq!(m.loops[*kernel].group, l.group, "{name}: loop kernel of another group");
                vec![]
            }
            CpuCall::MatMul(mm) => {
                // The last batch's last element (batch strides of 0 reuse the first matrix).
                let end = |o: &cvc_compiler::back::cpu::MatOperand, rows: usize, cols: usize, bs: usize| {
                    let last = (rows as isize - 1) * o.rs + (cols as isize - 1) * o.cs;
                    let last = last as usize + (mm.batch - 1) * bs;
                    o.offset + (last + 1) * if o.complex { 8 } else { 4 }
                };
                let [sa, sb, sc] = mm.batch_strides;
                vec![
                    end(&mm.a, mm.m, mm.k, sa),
                    end(&mm.b, mm.k, mm.n, sb),
                    mm.c + (mm.m * mm.n + (mm.batch - 1) * sc) * if mm.c_complex { 8 } else { 4 },
                ]
            }
            CpuCall::Conv(c) | CpuCall::ConvTranspose(c) | CpuCall::WeightGrad(c) => {
                conv_ends(c, &l.call).to_vec()
            }
            CpuCall::Copy(c) => {
                let (s, d) = copy_end(c);
                vec![s, d]
            }
            CpuCall::Pad { out, bytes, copy } => {
                let (s, d) = copy_end(copy);
                assert!(d <= out + bytes, "{name}: pad copy leaves its output");
                vec![s, d, out + bytes]
            }
            CpuCall::Concat(pieces) => pieces.iter().flat_map(|c| <[usize; 2]>::from(copy_end(c))).collect(),
            CpuCall::OneHot { labels, out, rows, classes } => {
                vec![labels + rows * 4, out + rows * classes * 4]
            }
            CpuCall::Gather(r) => {
                vec![r.src + r.rows * r.row_words * 4, r.idx + r.n * 4, r.out + r.n * r.row_words * 4]
            }
            CpuCall::ScatterAdd(r) => {
                vec![r.src + r.n * r.row_words * 4, r.idx + r.n * 4, r.out + r.rows * r.row_words * 4]
            }
            CpuCall::Dropout { step, out, n, .. } => vec![step + 4, out + n * 4],
            CpuCall::Attention(a) => {
                let bh = a.b * a.h;
                let c64 = |rows: usize, cols: usize| bh * rows * cols * 8;
                let mut ends = vec![a.q + c64(a.t, a.d), a.k + c64(a.s, a.d)];
                ends.extend(a.v.map(|v| v + c64(a.s, a.dv)));
                ends.extend(a.lse.map(|l| l + bh * a.t * 4));
                ends.extend(a.o.map(|o| o + c64(a.t, a.dv)));
                ends.extend(a.d_o.map(|o| o + c64(a.t, a.dv)));
                ends.extend(a.mask.map(|m| m + a.b * a.s * 4));
                ends.extend(a.step.map(|s| s + 4));
                ends.push(
                    a.out
                        + match a.kind {
                            cvc_compiler::back::cpu::AttnKind::Lse => bh * a.t * 4,
                            cvc_compiler::back::cpu::AttnKind::Forward => c64(a.t, a.dv),
                            cvc_compiler::back::cpu::AttnKind::Grad(AttnWrt::Q) => c64(a.t, a.d),
                            cvc_compiler::back::cpu::AttnKind::Grad(AttnWrt::KV) => c64(a.s, a.d + a.dv),
                        },
                );
                ends
            }
            CpuCall::Fft(f) => {
                let n: usize = f.shape.iter().product();
                vec![f.src + n * 8, f.dst + n * 8]
            }
            CpuCall::Recurrence(r) => {
                let (h, g, s) = (r.spec.hidden, r.spec.cell.gates(), r.spec.cell.states());
                let steps = r.b * r.t * 8;
                let mut ends = vec![r.xp + steps * g * h, r.w + g * h * h * 8, r.bias + g * h * 8];
                ends.extend(r.hs.map(|o| o + steps * s * h));
                ends.extend(r.dhs.map(|o| o + steps * s * h));
                ends.extend(r.h0.map(|o| o + r.b * s * h * 8));
                ends.push(r.out + steps * if r.grad { r.spec.grad_width() } else { s * h });
                ends
            }
        };
        for e in ends {
            assert!(e <= arena, "{name}: group {} reaches byte {e} of a {arena}-byte arena", l.group);
        }
    }
}

fn program(name: &str, src: &str, mode: Mode, batch: usize) -> Program {
    let checked = check_source(name, src, mode).unwrap_or_else(|d| panic!("{name}: {d:?}"));
    compile(checked.graph, &Options { batch, ..Options::default() }).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The recurrent fixtures with chunked back-propagation through time: every recurrence call
/// (those from a checkpointed `h0` included) stays inside the arena, and the launch list
/// names the initial state of the calls that have one.
#[test]
fn chunked_recurrences_stay_inside_the_arena() {
    let config = host_config().expect("host ISA");
    for (name, src) in sources().into_iter().filter(|(n, _)| n.contains("recurrent") || n.contains("gru")) {
        let checked = check_source(&name, &src, Mode::Train).unwrap_or_else(|d| panic!("{name}: {d:?}"));
        let opts = Options { batch: 3, rnn_chunk: Some(2), ..Options::default() };
        let p = compile(checked.graph, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        let m = generate(&p, config).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_inside(&name, &m);
        let from_h0 =
            m.launches.iter().filter(|l| matches!(&l.call, CpuCall::Recurrence(r) if r.h0.is_some())).count();
        assert!(from_h0 > 0, "{name}: no recurrence from a checkpoint");
        assert_eq!(m.to_string().matches(" h0@").count(), from_h0, "{name}");
    }
}

#[test]
fn every_model_generates_a_module_that_stays_inside_its_arena() {
    let config = host_config().expect("host ISA");
    for (name, src) in sources() {
        for (mode, batch) in [(Mode::Train, 3), (Mode::Eval, 2)] {
            let checked = check_source(&name, &src, mode).unwrap_or_else(|d| panic!("{name}: {d:?}"));
            if mode == Mode::Train && checked.graph.loss.is_none() {
                continue; // inference-only fixture
            }
            let p = program(&name, &src, mode, batch);
            let m = generate(&p, config).unwrap_or_else(|e| panic!("{name}: {e}"));
            // One launch per non-view group, in schedule order; one per node of an attention
            // group with its log-sum-exp fused, back to back.
            let groups: Vec<usize> =
                p.order.iter().copied().filter(|&g| p.groups[g].kind != GroupKind::View).collect();
            let launched: Vec<usize> = m.launches.iter().map(|l| l.group).collect();
            let per_group =
                |g: usize| if p.groups[g].kind == GroupKind::Attention { p.groups[g].nodes.len() } else { 1 };
            let expected: Vec<usize> =
                groups.iter().flat_map(|&g| std::iter::repeat_n(g, per_group(g))).collect();
            assert_eq!(launched, expected, "{name}: launches follow the schedule");
            assert_eq!(m.arena_bytes, p.plan.arena_bytes);
            assert_inside(&name, &m);
            // The text form names every launch.
            assert_eq!(m.to_string().lines().filter(|l| l.starts_with("group")).count(), m.launches.len());
        }
    }
}

#[test]
fn transposes_become_strides_and_slices_offsets() {
    use Dim::{Batch as B, Fixed as F};
    let mut g = Graph::new("t", Mode::Eval);
    {
        let mut b = Builder::new(&mut g);
        // a is stored [K=5, M=B], read transposed; b is stored [N=7, K=5], read transposed.
        let a = b.leaf(Op::Input { name: "a".into() }, TensorType::new(DType::F32, Shape(vec![F(5), B])));
        let w = b.leaf(
            Op::Param { name: "w".into(), init: Init::Zeros },
            TensorType::new(DType::C64, Shape::fixed(&[7, 5])),
        );
        let m = b
            .add(Op::MatMul { trans: [true, true], conj: [false, true], sum_batch: false }, &[a, w])
            .expect("matmul");
        let s = b.add(Op::Slice { axis: 1, start: 2, len: 3 }, &[m]).expect("slice");
        b.graph.outputs.push(Output { name: "s".into(), value: s });
    }
    let p = compile(g, &Options { batch: 4, ..Options::default() }).expect("compiles");
    let m = generate(&p, host_config().expect("host ISA")).expect("generates");
    let mm = m
        .launches
        .iter()
        .find_map(|l| if let CpuCall::MatMul(mm) = &l.call { Some(*mm) } else { None })
        .expect("a matmul launch");
    assert_eq!((mm.m, mm.k, mm.n), (4, 5, 7));
    // aᵀ: element (i, k) of the product's left operand is a[k, i] at k·M + i.
    assert_eq!((mm.a.rs, mm.a.cs, mm.a.complex, mm.a.conj), (1, 4, false, false));
    // wᵀ: element (k, j) is w[j, k] at j·K + k; conjugated.
    assert_eq!((mm.b.rs, mm.b.cs, mm.b.complex, mm.b.conj), (1, 5, true, true));
    assert!(mm.c_complex);
    let copy = m
        .launches
        .iter()
        .find_map(|l| if let CpuCall::Copy(c) = &l.call { Some(c.clone()) } else { None })
        .expect("the slice is a copy");
    // Rows of 7 complex elements; the slice starts 2 elements in: 2 × 8 bytes.
    assert_eq!(copy.shape, vec![4, 3]);
    assert_eq!(copy.src, mm.c + 16);
    assert_eq!(copy.src_strides, vec![7, 1]);
    assert_eq!(copy.dst_strides, vec![3, 1]);
    assert_eq!((copy.src_words, copy.dst_words), (2, 2));
}

#[test]
fn batched_matmuls_fold_into_one_product_where_the_layout_allows() {
    let src = "model Seq {
    input x: c64[B, 6, 4]
    input label: class[B] of 3
    h = x |> linear(5)
    s = matmul(h, h, transpose_b = true, conj_b = true)
    logits = s |> abs |> flatten |> linear(3, real = true)
    loss cross_entropy(logits, label)
}
";
    let p = program("seq.cvnn", src, Mode::Train, 3);
    let m = generate(&p, host_config().expect("host ISA")).expect("generates");
    assert_inside("seq.cvnn", &m);
    let mms: Vec<_> = m
        .launches
        .iter()
        .filter_map(|l| if let CpuCall::MatMul(mm) = &l.call { Some(*mm) } else { None })
        .collect();
    let has = |what: &str, f: &dyn Fn(&cvc_compiler::back::cpu::MatMulCall) -> bool| {
        assert!(mms.iter().any(f), "{what}: {mms:#?}");
    };
    // x·Wᵀ over [B, 6, 4]: one 18×4·4×5 product (the batch folded into M).
    has("linear folded into M", &|c| (c.m, c.k, c.n, c.batch) == (18, 4, 5, 1));
    // Its weight gradient Σ gᵀ·conj(x): one 5×18·18×4 product (the batch folded into K).
    has("weight gradient folded into K", &|c| (c.m, c.k, c.n, c.batch) == (5, 18, 4, 1) && c.b.conj);
    // h·hᴴ: 3 products of 6×5·5×6 with batch strides (no fold: both operands batched).
    has("h·hᴴ as a batch", &|c| {
        (c.m, c.k, c.n, c.batch) == (6, 5, 6, 3)
            && c.batch_strides == [30, 30, 36]
            && c.b.conj
            && !c.sum_batch
    });
    assert!(m.to_string().contains("×3 batches (strides a 30, b 30, c 36)"), "{m}");
}
