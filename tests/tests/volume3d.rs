//! The volume operators (`conv3d`, `conv_transpose3d`, `avgpool3d`, `maxpool3d`, `fft3`,
//! `ifft3`, `fft` along a volume's depth) against PyTorch: each case of
//! `tests/reference/volume3d/cases.json` (written by `make.py` next to it) is lowered by the
//! layer library, evaluated by the f64 interpreter and compared with PyTorch's output and
//! gradients; the same gradients are checked against central finite differences
//! (`cvc_tests::torch_cases`). The lowering's cost is checked on the graph it builds.

use cvc_compiler::ir::*;
use cvc_tests::torch_cases;

/// Every reference case, forward and backward, against PyTorch and finite differences.
#[test]
fn volume_operators_match_pytorch() {
    let cases = torch_cases::cases("volume3d");
    assert!(cases.len() >= 20, "cases.json holds {} cases", cases.len());
    let failed = torch_cases::failures("volume3d", &cases);
    assert!(failed.is_empty(), "{} of {} cases differ:\n{}", failed.len(), cases.len(), failed.join("\n"));
}

/// The forward graph of a one-layer model on `x: c64[B, 4, 6, 8, 8]`.
fn lowered(layer: &str) -> Graph {
    let src =
        format!("model M {{\n    input x: c64[B, 4, 6, 8, 8]\n    y = x |> {layer}\n    output y\n}}\n");
    match cvc_compiler::front::check_source("m.cvnn", &src, Mode::Eval) {
        Ok(c) => c.graph,
        Err(d) => panic!("{layer}: {:?}", d.first().map(|d| d.message.clone())),
    }
}

/// Elements of the largest value of `g` (batch 1).
fn largest(g: &Graph) -> usize {
    g.nodes.iter().map(|(_, n)| n.ty.shape.resolve(1).iter().product::<usize>()).max().unwrap_or(0)
}

/// `conv3d` is one `Conv2d` over the stacked depth taps, and `conv_transpose3d` one
/// `ConvTranspose2d`; no value is larger than the tap count times the (padded) input or
/// output, as docs/LANGUAGE.md states.
#[test]
fn volume_convolutions_are_one_2d_contraction_each() {
    let count = |g: &Graph, pick: fn(&Op) -> bool| g.nodes.iter().filter(|(_, n)| pick(&n.op)).count();
    let g = lowered("conv3d(4, kernel = 3, pad = 1)");
    assert_eq!(count(&g, |op| matches!(op, Op::Conv2d { .. })), 1);
    // Input 4·6·8·8; stacked taps: 4 channels · 3 taps · 6 slices · 10 rows · 8 (+ 2 rows).
    assert!(largest(&g) <= 3 * 4 * 6 * 10 * 8 + 3 * 4 * 2 * 8, "largest value {}", largest(&g));
    let g = lowered("conv_transpose3d(4, kernel = 3, stride = 2, pad = 1, output_padding = 1)");
    assert_eq!(count(&g, |op| matches!(op, Op::ConvTranspose2d { .. })), 1);
    // Output 4·12·16·16; the contraction's result holds 3 taps of 6 slices of 18 rows (and
    // one row past the last slice).
    assert!(largest(&g) <= 4 * 3 * (6 * 18 + 1) * 16, "largest value {}", largest(&g));
}
