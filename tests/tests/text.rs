//! The front end on unusual text: CR-only line ends and a UTF-8 byte-order mark give the
//! same checks, spans and rendered diagnostics as the plain LF file; diagnostics output is
//! bounded however many errors a file has and however long its lines are; a constant of
//! 100,000 terms checks in linear time.

use cvc_compiler::front::{self, check_bytes, check_source, render_all};
use cvc_compiler::ir::Mode;
use std::time::{Duration, Instant};

/// A model with an error on line 5 (`conv2` is not an operator), after a comment line.
const WITH_ERROR: &str = "# a comment\nmodel M {\n  input x: c64[B, 1, 16]\n  # another\n  h = x |> conv2(4, kernel = 3) |> crelu\n  output h\n}\n";

const GOOD: &str = "# header comment\nmodel M {\n  input x: c64[B, 4]\n  input label: class[B] of 2\n  # the head\n  logits = x |> linear(2) |> abs\n  output logits\n  loss cross_entropy(logits, label)\n}\n";

fn cr_only(s: &str) -> String {
    s.replace('\n', "\r")
}

fn crlf(s: &str) -> String {
    s.replace('\n', "\r\n")
}

fn bom(s: &str) -> String {
    format!("\u{feff}{s}")
}

/// Renders the errors of `src` without colour.
fn errors(src: &str) -> String {
    let d = check_source("m.cvnn", src, Mode::Train).expect_err("the source has an error");
    render_all("m.cvnn", src, &d, false)
}

/// The reference: the diagnostic of the LF text, whose position is found independently
/// (the line holding `conv2`, the column of its first byte).
#[test]
fn lf_reference_points_at_the_bad_operator() {
    let line = WITH_ERROR.lines().position(|l| l.contains("conv2")).unwrap() + 1;
    let col = WITH_ERROR.lines().nth(line - 1).unwrap().find("conv2").unwrap() + 1;
    let out = errors(WITH_ERROR);
    assert!(out.contains(&format!("(m.cvnn:{line}:{col})")), "{out}");
    assert!(out.contains(&format!("{line} │   h = x |> conv2(4")), "{out}");
}

/// CR-only, CRLF and BOM variants render exactly as the LF text does: the message's
/// `file:line:col`, ariadne's header and the excerpt agree (before, a CR-only file gave
/// line 1 in the message and another line in the excerpt, and its first comment swallowed
/// the whole file).
#[test]
fn cr_only_crlf_and_bom_render_like_lf() {
    let want = errors(WITH_ERROR);
    for (what, src) in [
        ("CR", cr_only(WITH_ERROR)),
        ("CRLF", crlf(WITH_ERROR)),
        ("BOM", bom(WITH_ERROR)),
        ("BOM+CR", bom(&cr_only(WITH_ERROR))),
    ] {
        let got = errors(&src);
        // CRLF excerpts keep their CR at the end of the shown line; compare without it.
        assert_eq!(got.replace('\r', ""), want, "{what}");
        // Through the byte entry point (the one `cvc check` uses) too.
        let d = check_bytes("m.cvnn", src.as_bytes(), Mode::Train).err().unwrap();
        assert_eq!(render_all("m.cvnn", &src, &d, false).replace('\r', ""), want, "{what} (bytes)");
    }
}

/// A syntax error (reported by the parser, not the checker) is placed the same way.
#[test]
fn parse_errors_render_like_lf_too() {
    let src = GOOD.replace("output logits", "output logits )");
    let want = errors(&src);
    assert!(want.contains("(m.cvnn:7:17)"), "{want}");
    for variant in [cr_only(&src), bom(&src), bom(&cr_only(&src))] {
        assert_eq!(errors(&variant), want, "{variant:?}");
    }
}

/// The same model checks identically whatever its line ends and with a BOM: same layer
/// table (with the same line numbers) and the same graph.
#[test]
fn cr_only_and_bom_sources_check_like_lf() {
    let want = check_source("m.cvnn", GOOD, Mode::Train).unwrap();
    // (CRLF adds a byte per line, so only its graph's spans differ.)
    for (src, same_offsets) in
        [(cr_only(GOOD), true), (crlf(GOOD), false), (bom(GOOD), true), (bom(&cr_only(GOOD)), true)]
    {
        let got = check_source("m.cvnn", &src, Mode::Train)
            .unwrap_or_else(|d| panic!("{:?} should check:\n{}", src, render_all("m.cvnn", &src, &d, false)));
        assert_eq!(got.table, want.table, "{src:?}");
        assert_eq!(got.graph.nodes.len(), want.graph.nodes.len(), "{src:?}");
        if same_offsets {
            assert_eq!(format!("{:?}", got.graph), format!("{:?}", want.graph), "{src:?}");
        }
    }
    let c = check_bytes("m.cvnn", bom(GOOD).as_bytes(), Mode::Train).unwrap();
    assert_eq!(c.src, GOOD);
}

/// `normalize_source` is idempotent and keeps byte offsets apart from the BOM.
#[test]
fn normalisation_keeps_offsets() {
    for src in [GOOD.to_string(), cr_only(GOOD), crlf(GOOD), "\r\r\n\r".to_string()] {
        let n = front::check::normalize_source(&src);
        assert_eq!(n.len(), src.len());
        assert_eq!(front::check::normalize_source(&n), n);
        assert!(!n.replace("\r\n", "").contains('\r'));
    }
    assert_eq!(front::check::normalize_source(&bom("ab")), "ab");
}

/// Other line separators that the excerpt renderer would break lines at (form feed, U+2028
/// inside a comment) do not shift the reported line.
#[test]
fn other_separators_do_not_shift_lines() {
    let src = WITH_ERROR.replace("# another", "# another\u{c} with\u{2028}separators");
    let out = errors(&src);
    assert!(out.contains("(m.cvnn:5:12)") && out.contains("5 │   h = x |> conv2(4"), "{out}");
}

/// Thousands of errors on one 24 KB line: the report stays small (capped count, windowed
/// excerpts) and says how many errors it left out. (Before: 578 MB.)
#[test]
fn diagnostics_on_one_long_line_are_bounded() {
    let mut src = String::from("model M {\n  input x: c64[B, 4]\n  y = x |> crelu\n  output y");
    while src.len() < 24_000 {
        src.push_str(", y");
    }
    src.push_str("\n}\n");
    let d = check_source("m.cvnn", &src, Mode::Train).expect_err("duplicate outputs are errors");
    let out = render_all("m.cvnn", &src, &d, false);
    assert!(out.len() < 64 * 1024, "{} bytes", out.len());
    if d.len() > front::limits::MAX_DIAGNOSTICS {
        let rest = d.len() - front::limits::MAX_DIAGNOSTICS;
        assert!(out.contains(&format!("{rest} more error")), "{out}");
    }
    // The window still shows the error's place: line 4, with `…` where the line was cut.
    assert!(out.contains("(m.cvnn:4:"), "{out}");
    assert!(out.contains('…'), "{out}");
}

/// Many separate errors (one per line) are capped at `MAX_DIAGNOSTICS` with a count.
#[test]
fn many_errors_are_capped_with_a_count() {
    let mut src = String::from("model M {\n  input x: c64[B, 4]\n");
    for i in 0..200 {
        src.push_str(&format!("  y{i} = x |> nosuchop{i}\n"));
    }
    src.push_str("  output y0\n}\n");
    let d = check_source("m.cvnn", &src, Mode::Train).err().unwrap();
    let out = render_all("m.cvnn", &src, &d, false);
    let shown = out.matches("unknown operator").count();
    assert!(shown <= front::limits::MAX_DIAGNOSTICS, "{shown} shown");
    if d.len() > front::limits::MAX_DIAGNOSTICS {
        assert!(out.contains(&format!("{} more error", d.len() - front::limits::MAX_DIAGNOSTICS)), "{out}");
    }
}

/// A constant of 100,000 terms checks quickly, with the exact sum (before: 101 s).
#[test]
fn a_constant_of_100k_terms_checks_in_linear_time() {
    let terms = 100_000;
    let sum = std::iter::repeat_n("1", terms).collect::<Vec<_>>().join(" + ");
    let src = format!(
        "model M {{\n  input x: c64[B, 4]\n  n = {sum} - {terms} + 2\n  y = x |> linear(n)\n  output y\n}}\n"
    );
    let start = Instant::now();
    let c = check_source("m.cvnn", &src, Mode::Eval)
        .unwrap_or_else(|d| panic!("{}", render_all("m.cvnn", &src, &d, false)));
    let took = start.elapsed();
    // n = 100000 - 100000 + 2 = 2: the linear layer has 2 outputs.
    assert_eq!(c.graph.outputs[0].name, "y");
    assert!(c.table.iter().any(|r| r.op.contains("linear(2)")), "{:?}", c.table);
    // Linear now: ~1.6 s of CPU in the dev profile (the parser crate unoptimised), far less
    // in release. The bound is generous for a loaded 2-core CI machine; the quadratic version
    // took 101 s in release.
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

/// A train setting of deeply nested sums (`((1 + 0) + 0) + ...`, 30 levels, inside the
/// bracket limit) checks at once: each level is evaluated once (before: twice per level,
/// 2^30 evaluations).
#[test]
fn nested_sums_in_a_train_section_check_in_linear_time() {
    let depth = 30;
    let value = format!("{}1{}", "(".repeat(depth), " + 0)".repeat(depth));
    let src =
        format!("{}train M {{\n  data = synthetic.random(count = 16)\n  epochs = {value} + 2\n}}\n", GOOD);
    let start = Instant::now();
    let c = check_source("m.cvnn", &src, Mode::Train)
        .unwrap_or_else(|d| panic!("{}", render_all("m.cvnn", &src, &d, false)));
    assert_eq!(c.train.epochs, 3);
    assert!(start.elapsed() < Duration::from_secs(5), "took {:?}", start.elapsed());
}
