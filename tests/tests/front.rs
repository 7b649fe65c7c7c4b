//! Front-end tests: one insta snapshot per fixture (`ok/`: AST outline + layer table;
//! `err/`: the rendered diagnostics), a print → parse round trip, span hygiene, the public
//! API's contract, and a seeded mutation run that must never panic.

use cvc_compiler::front::{self, check_bytes, check_source, render_all, Checked};
use cvc_compiler::ir::{DType, Dim, Mode, Op, Shape};
use cvc_grammar::ast::*;
use cvc_grammar::Span;
use std::fmt::Write as _;
use std::path::{Path as FsPath, PathBuf};

fn root() -> PathBuf {
    FsPath::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

fn cvnn_in(dir: &FsPath) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("fixture dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cvnn"))
        .collect();
    v.sort();
    v
}

// ------------------------------------------------------------------ AST outline (valid .cvnn)

fn expr_text(e: &Expr, top: bool) -> String {
    match &e.kind {
        ExprKind::Int(n) => n.to_string(),
        ExprKind::Float(x) => format!("{x:?}"),
        ExprKind::Size(text) => text.clone(),
        ExprKind::Bool(b) => b.to_string(),
        ExprKind::Str(s) => format!(
            "\"{}\"",
            s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n").replace('\t', "\\t")
        ),
        ExprKind::Range(a, b) => format!("{a:?}..{b:?}"),
        ExprKind::Name(n) => n.clone(),
        ExprKind::Tuple(items) => {
            format!("({})", items.iter().map(|i| expr_text(i, true)).collect::<Vec<_>>().join(", "))
        }
        ExprKind::Call { callee, args } => format!("{}({})", callee.text(), args_text(args)),
        ExprKind::Arith { first, rest } => {
            let mut s = expr_text(first, false);
            for (op, _, r) in rest {
                write!(s, " {} {}", op.symbol(), expr_text(r, false)).unwrap();
            }
            format!("({s})")
        }
        ExprKind::Pipe { head, stages } => {
            let mut s = expr_text(head, false);
            for st in stages {
                write!(s, " |> {}", stage_text(st)).unwrap();
            }
            if top {
                s
            } else {
                format!("({s})")
            }
        }
    }
}

fn args_text(args: &[Arg]) -> String {
    args.iter()
        .map(|a| match &a.name {
            Some(k) => format!("{} = {}", k.name, expr_text(&a.value, true)),
            None => expr_text(&a.value, true),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn stage_text(s: &Stage) -> String {
    if s.args.is_empty() {
        s.callee.text()
    } else {
        format!("{}({})", s.callee.text(), args_text(&s.args))
    }
}

/// The file printed back as canonical `.cvnn`: every arithmetic chain parenthesised, one
/// item a line, each item's source line in a trailing comment.
fn outline(f: &File, src: &str) -> String {
    let line = |s: Span| s.line_col(src).0;
    let mut out = String::new();
    for item in &f.items {
        match item {
            Item::Model(m) => {
                writeln!(out, "model {} {{  # line {}", m.name.name, line(m.span)).unwrap();
                for it in &m.items {
                    let (text, span) = match it {
                        ModelItem::Input(i) => {
                            let dims: Vec<String> =
                                i.ty.dims
                                    .iter()
                                    .map(|d| match &d.kind {
                                        DimKind::Int(n) => n.to_string(),
                                        DimKind::Name(n) => n.clone(),
                                    })
                                    .collect();
                            let of = i.ty.classes.map(|(n, _)| format!(" of {n}")).unwrap_or_default();
                            (
                                format!("input {}: {}[{}]{of}", i.name.name, i.ty.elem.name, dims.join(", ")),
                                i.span,
                            )
                        }
                        ModelItem::Param(p) => {
                            let dims: Vec<String> =
                                p.ty.dims
                                    .iter()
                                    .map(|d| match &d.kind {
                                        DimKind::Int(n) => n.to_string(),
                                        DimKind::Name(n) => n.clone(),
                                    })
                                    .collect();
                            (
                                format!(
                                    "param {}: {}[{}] = {}",
                                    p.name.name,
                                    p.ty.elem.name,
                                    dims.join(", "),
                                    expr_text(&p.init, true)
                                ),
                                p.span,
                            )
                        }
                        ModelItem::Block(b) => {
                            let params: Vec<&str> = b.params.iter().map(|p| p.name.as_str()).collect();
                            let body: Vec<String> = b.body.iter().map(stage_text).collect();
                            (
                                format!(
                                    "block {}({}) {{ {} }}",
                                    b.name.name,
                                    params.join(", "),
                                    body.join(" |> ")
                                ),
                                b.span,
                            )
                        }
                        ModelItem::Binding(b) => {
                            (format!("{} = {}", b.name.name, expr_text(&b.value, true)), b.span)
                        }
                        ModelItem::Output(o) => (
                            format!(
                                "output {}",
                                o.names.iter().map(|n| n.name.as_str()).collect::<Vec<_>>().join(", ")
                            ),
                            o.span,
                        ),
                        ModelItem::Loss(l) => (format!("loss {}", expr_text(&l.value, true)), l.span),
                    };
                    writeln!(out, "    {text}  # line {}", line(span)).unwrap();
                }
                out.push_str("}\n");
            }
            Item::Train(t) => {
                writeln!(out, "train {} {{  # line {}", t.model.name, line(t.span)).unwrap();
                for s in &t.settings {
                    writeln!(
                        out,
                        "    {} = {}  # line {}",
                        s.key.name,
                        expr_text(&s.value, true),
                        line(s.span)
                    )
                    .unwrap();
                }
                out.push_str("}\n");
            }
        }
    }
    out
}

fn strip_line_comments(s: &str) -> String {
    s.lines().map(|l| l.split("  # line").next().unwrap_or(l)).collect::<Vec<_>>().join("\n")
}

// ------------------------------------------------------------------ snapshots

#[test]
fn ok() {
    insta::glob!("../fixtures/ok", "*.cvnn", |path| {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let src = std::fs::read_to_string(path).unwrap();
        let ast = cvc_grammar::parse(&src).unwrap_or_else(|e| panic!("{name}: {}", e.message));
        let checked = match check_source(&name, &src, Mode::Train) {
            Ok(c) => c,
            Err(d) => panic!("{name} should check:\n{}", render_all(&name, &src, &d, false)),
        };
        let report = format!(
            "--- ast\n{}--- table\n{}",
            outline(&ast, &src),
            cvc_runtime::cli::check::table_text(&checked)
        );
        insta::assert_snapshot!(report);
    });
}

#[test]
fn err() {
    insta::glob!("../fixtures/err", "*.cvnn", |path| {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let bytes = std::fs::read(path).unwrap();
        let src = String::from_utf8_lossy(&bytes).into_owned();
        let diags = match check_bytes(&name, &bytes, Mode::Train) {
            Ok(_) => panic!("{name} should fail to check"),
            Err(d) => d,
        };
        assert!(!diags.is_empty(), "{name}: an error without a diagnostic");
        for d in &diags {
            assert!(d.primary.span.end as usize <= src.len(), "{name}: span past the end");
            assert!(d.primary.span.start <= d.primary.span.end, "{name}: reversed span");
        }
        let rendered = render_all(&name, &src, &diags, false);
        assert!(rendered.contains(&format!("{name}:")) || src.trim().is_empty(), "{name}: no file:line:col");
        insta::assert_snapshot!(rendered);
    });
}

// ------------------------------------------------------------------ properties of the parser

fn all_sources() -> Vec<(String, String)> {
    let mut files = cvnn_in(&root().join("examples"));
    files.extend(cvnn_in(&root().join("tests/fixtures/ok")));
    files.into_iter().map(|p| (p.display().to_string(), std::fs::read_to_string(&p).unwrap())).collect()
}

/// Printing the AST and parsing the print gives the same AST shape (the printer makes
/// every precedence explicit, so this checks `|>` < `+ -` < `* /` and left associativity).
#[test]
fn print_parse_round_trip() {
    for (name, src) in all_sources() {
        let a = cvc_grammar::parse(&src).unwrap();
        let printed = outline(&a, &src);
        let b = cvc_grammar::parse(&printed)
            .unwrap_or_else(|e| panic!("{name}: reprint does not parse: {}\n{printed}", e.message));
        let reprinted = outline(&b, &printed);
        assert_eq!(strip_line_comments(&printed), strip_line_comments(&reprinted), "{name}");
    }
}

#[test]
fn precedence_is_pipe_then_additive_then_multiplicative() {
    let src = "model M { input x: c64[B, 4]\n y = x + 2 * x - x / 2 |> crelu\n output y }";
    let f = cvc_grammar::parse(src).unwrap();
    let Item::Model(m) = &f.items[0] else { panic!() };
    let ModelItem::Binding(b) = &m.items[1] else { panic!() };
    assert_eq!(expr_text(&b.value, true), "(x + (2 * x) - (x / 2)) |> crelu");
}

fn check_span(what: &str, s: Span, src: &str, name: &str) {
    let text = &src[s.range()];
    assert!(!text.is_empty(), "{name}: empty span for {what}");
    assert_eq!(text, text.trim(), "{name}: span of {what} has surrounding whitespace: {text:?}");
    assert!(!text.ends_with('#'), "{name}: span of {what} runs into a comment");
}

fn walk_expr(e: &Expr, src: &str, name: &str) {
    check_span("expression", e.span, src, name);
    match &e.kind {
        ExprKind::Tuple(items) => items.iter().for_each(|i| walk_expr(i, src, name)),
        ExprKind::Call { args, .. } => args.iter().for_each(|a| {
            check_span("argument", a.span, src, name);
            walk_expr(&a.value, src, name)
        }),
        ExprKind::Arith { first, rest } => {
            walk_expr(first, src, name);
            rest.iter().for_each(|(_, s, r)| {
                check_span("operator", *s, src, name);
                walk_expr(r, src, name)
            });
        }
        ExprKind::Pipe { head, stages } => {
            walk_expr(head, src, name);
            for s in stages {
                check_span("stage", s.span, src, name);
                assert_eq!(&src[s.callee.span.range()], s.callee.text(), "{name}");
            }
        }
        _ => {}
    }
}

/// Every span covers exactly its text: no leading or trailing whitespace or comments
/// (which pest's implicit whitespace would otherwise leave at the end of optional parts).
#[test]
fn spans_are_tight() {
    for (name, src) in all_sources() {
        let f = cvc_grammar::parse(&src).unwrap();
        for item in &f.items {
            match item {
                Item::Model(m) => {
                    check_span("model", m.span, &src, &name);
                    assert_eq!(&src[m.name.span.range()], m.name.name);
                    for it in &m.items {
                        match it {
                            ModelItem::Input(i) => {
                                check_span("input", i.span, &src, &name);
                                check_span("input type", i.ty.span, &src, &name);
                            }
                            ModelItem::Param(p) => {
                                check_span("param", p.span, &src, &name);
                                check_span("param type", p.ty.span, &src, &name);
                                walk_expr(&p.init, &src, &name);
                            }
                            ModelItem::Block(b) => {
                                check_span("block", b.span, &src, &name);
                                b.body.iter().for_each(|s| check_span("block stage", s.span, &src, &name));
                            }
                            ModelItem::Binding(b) => {
                                check_span("binding", b.span, &src, &name);
                                assert!(src[b.span.range()].starts_with(&b.name.name));
                                walk_expr(&b.value, &src, &name);
                            }
                            ModelItem::Output(o) => check_span("output", o.span, &src, &name),
                            ModelItem::Loss(l) => {
                                check_span("loss", l.span, &src, &name);
                                walk_expr(&l.value, &src, &name);
                            }
                        }
                    }
                }
                Item::Train(t) => {
                    check_span("train", t.span, &src, &name);
                    for s in &t.settings {
                        check_span("setting", s.span, &src, &name);
                        walk_expr(&s.value, &src, &name);
                    }
                }
            }
        }
    }
}

#[test]
fn numbers_sizes_and_strings() {
    let src = r#"model M { input x: c64[B, 4] }
train M { memory_budget = 4GiB  split = 0.25  data = npz("a \"b\".npz")  optimizer = adam(lr = 1e-3) }"#;
    let f = cvc_grammar::parse(src).unwrap();
    let Item::Train(t) = &f.items[1] else { panic!() };
    assert_eq!(t.settings[0].value.kind, ExprKind::Size("4GiB".into()));
    assert_eq!(t.settings[1].value.kind, ExprKind::Float(0.25));
    let ExprKind::Call { callee, args } = &t.settings[2].value.kind else { panic!("npz call") };
    assert_eq!(callee.text(), "npz");
    assert_eq!(args[0].value.kind, ExprKind::Str("a \"b\".npz".into()));
    assert_eq!(&src[args[0].span.range()], r#""a \"b\".npz""#);
    let c = check_source("m.cvnn", src, Mode::Train).unwrap();
    assert_eq!(c.train.memory_budget, Some(4 * 1024 * 1024 * 1024));
    assert_eq!(c.train.split, 0.25);
    assert_eq!(c.train.optimizer.lr, 1e-3);
    for (text, bytes) in [("512MiB", 512u64 << 20), ("2GB", 2_000_000_000), ("1.5KiB", 1536), ("1000", 1000)]
    {
        let s = format!("model M {{ input x: c64[B, 4] }}\ntrain M {{ memory_budget = {text} }}");
        assert_eq!(
            check_source("m.cvnn", &s, Mode::Train).unwrap().train.memory_budget,
            Some(bytes),
            "{text}"
        );
    }
}

// ------------------------------------------------------------------ API contract

fn check_ok(path: &str, mode: Mode) -> Checked {
    let p = root().join(path);
    match front::check_file(&p, mode) {
        Ok(c) => c,
        Err((src, d)) => panic!("{path}:\n{}", render_all(path, &src, &d, false)),
    }
}

#[test]
fn examples_check_in_both_modes() {
    for p in cvnn_in(&root().join("examples")) {
        let rel = p.strip_prefix(root()).unwrap().display().to_string();
        for mode in [Mode::Train, Mode::Eval] {
            let c = check_ok(&rel, mode);
            assert_eq!(c.graph.mode, mode);
            assert_eq!(c.graph.name, c.model);
            assert!(c.has_train_section, "{rel} has a train section");
            let loss = c.graph.loss.expect("every example has a loss");
            assert_eq!(c.graph.ty(loss).dtype, DType::F32);
            assert_eq!(c.graph.ty(loss).shape, Shape::scalar());
            assert!(!c.graph.outputs.is_empty());
            cvc_compiler::ir::verify::verify(&c.graph).unwrap();
        }
    }
}

#[test]
fn seed_cnn_contract() {
    let c = check_ok("examples/seed_cnn.cvnn", Mode::Train);
    assert_eq!(c.model, "SeedCnn");
    // Inputs are Op::Input leaves; class labels are i32 [B].
    assert_eq!(c.inputs.len(), 2);
    assert_eq!(c.inputs[0].ty.dtype, DType::C64);
    assert_eq!(c.inputs[0].ty.shape, Shape(vec![Dim::Batch, Dim::Fixed(1), Dim::Fixed(64), Dim::Fixed(64)]));
    assert_eq!(c.inputs[1].classes, Some(10));
    assert_eq!(c.inputs[1].ty, cvc_compiler::ir::TensorType::new(DType::I32, Shape(vec![Dim::Batch])));
    for i in &c.inputs {
        assert_eq!(c.graph.node(i.value).op, Op::Input { name: i.name.clone() });
    }
    assert_eq!(c.graph.outputs.len(), 1);
    assert_eq!(c.graph.outputs[0].name, "logits");
    assert_eq!(c.graph.ty(c.graph.outputs[0].value).to_string(), "f32[B, 10]");
    // Parameter counts derived by hand: conv weights O·C·3·3 complex, no bias; naive
    // batchnorm has real γ, β for re and im (4 per channel); linear 16384·10 + 10 complex.
    let convs: Vec<usize> =
        c.table.iter().filter(|r| r.label == "logits/conv2d").map(|r| r.params_complex).collect();
    assert_eq!(convs, vec![32 * 9, 64 * 32 * 9, 64 * 64 * 9]);
    let lin = c.table.iter().find(|r| r.label == "logits/linear").unwrap();
    assert_eq!(lin.params_complex, 64 * 16 * 16 * 10 + 10);
    assert_eq!(lin.params_real, 2 * lin.params_complex);
    // Parameter names: `<binding>.<op>_<k>.`, k counting that op within the binding.
    for k in 0..3 {
        let prefix = format!("logits.conv2d_{k}.");
        assert!(c.params.iter().any(|p| p.name.starts_with(&prefix)), "no parameter named {prefix}*");
    }
    // Every table row's line points into the file.
    let lines = c.src.lines().count();
    assert!(c.table.iter().all(|r| r.line >= 1 && r.line <= lines));
    assert_eq!(c.train.batch, 64);
    assert_eq!(
        c.train.data,
        cvc_compiler::front::train::DataSource::SyntheticRandom { count: 4096, seed: 1 }
    );
}

#[test]
fn defaults_without_train_section() {
    let src = "model M {\n input x: c64[B, 4]\n y = x |> crelu\n output y\n}\n";
    let c = check_source("m.cvnn", src, Mode::Eval).unwrap();
    assert!(!c.has_train_section);
    assert_eq!(c.train, cvc_compiler::front::TrainConfig::defaults("M"));
    assert!(c.graph.loss.is_none());
}

#[test]
fn unreadable_and_non_utf8_files_are_diagnostics() {
    let missing = root().join("tests/fixtures/does_not_exist.cvnn");
    let (src, d) = front::check_file(&missing, Mode::Train).err().unwrap();
    assert!(src.is_empty());
    assert!(d[0].message.contains("no such file"), "{}", d[0].message);
    let (_, d) = front::check_file(&root().join("tests/fixtures"), Mode::Train).err().unwrap();
    assert!(d[0].message.starts_with("cannot read"), "{}", d[0].message);
    let d = check_bytes("x.cvnn", b"model M {\xff}", Mode::Train).err().unwrap();
    assert_eq!(d[0].primary.span, Span::new(9, 9));
}

// ------------------------------------------------------------------ mutation run

/// xorshift64*: a tiny deterministic generator for the mutation run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const TOKENS: [&str; 24] = [
    "|>", "(", ")", "{", "}", "[", "]", ",", "=", "+", "-", "*", "/", "..", "0", "-1", "1e9", "B", "x",
    "crelu", "block", "\n", "\"", "#",
];

fn mutate(rng: &mut Rng, src: &[u8], all: &[Vec<u8>]) -> Vec<u8> {
    let mut v = src.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(v.len() + 1);
        match rng.below(6) {
            0 if !v.is_empty() => {
                let end = (at + 1 + rng.below(8)).min(v.len());
                v.drain(at.min(end)..end);
            }
            1 => {
                let t = TOKENS[rng.below(TOKENS.len())].as_bytes();
                v.splice(at..at, t.iter().copied());
            }
            2 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next() as u8;
            }
            3 => {
                // Splice a piece of another file.
                let o = &all[rng.below(all.len())];
                let a = rng.below(o.len());
                let b = (a + rng.below(64)).min(o.len());
                v.splice(at..at, o[a..b].iter().copied());
            }
            4 => {
                // Change a number: 0, huge, negative.
                let n = ["0", "99999999999999999999", "-3", "65536", "1"][rng.below(5)];
                if let Some(p) = v.iter().skip(at).position(|c| c.is_ascii_digit()) {
                    let s = at + p;
                    let e = v[s..].iter().position(|c| !c.is_ascii_digit()).map_or(v.len(), |q| s + q);
                    v.splice(s..e, n.bytes());
                }
            }
            _ => {
                let a = rng.below(v.len() + 1);
                let b = (a + rng.below(40)).min(v.len());
                let piece = v[a..b].to_vec();
                v.splice(at..at, piece);
            }
        }
    }
    v
}

/// Ten thousand seeded mutations of the fixtures and examples: checking must return a
/// result or diagnostics, never panic, and every diagnostic must render (bounded: at most
/// `MAX_DIAGNOSTICS` excerpts); every mutant that checks is then planned (`cvc plan`'s
/// compile and summary, at batch 2), which must return a program or an error, never panic.
/// Takes ~30 s in the dev profile on 2 cores (`CVC_MUTATIONS` changes the count).
#[test]
fn mutated_sources_never_panic() {
    let seed = cvc_tests::seed::seed_for("front::mutated_sources_never_panic");
    let count: usize = std::env::var("CVC_MUTATIONS").ok().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    eprintln!("{count} mutations (CVC_MUTATIONS to change; CVC_SEED varies the seed)");
    let mut files: Vec<Vec<u8>> = all_sources().into_iter().map(|(_, s)| s.into_bytes()).collect();
    let good = files.len();
    files.extend(cvnn_in(&root().join("tests/fixtures/err")).iter().map(|p| std::fs::read(p).unwrap()));
    let mut rng = Rng(seed | 1);
    let (mut checked, mut planned) = (0usize, 0usize);
    let start = std::time::Instant::now();
    for i in 0..count {
        // One in four only changes numbers of a file that checks: those often still check,
        // so the planner sees odd sizes (0, 1, 65536, huge), not only the few mutants that
        // survive the parser.
        let m = if i % 4 == 3 {
            let base = rng.below(good);
            mutate_numbers(&mut rng, &files[base])
        } else {
            let base = rng.below(files.len());
            mutate(&mut rng, &files[base], &files)
        };
        if std::env::var_os("CVC_MUTATION_TRACE").is_some() {
            let dump = std::env::temp_dir().join("cvc-mutation-current.cvnn");
            let _ = std::fs::write(&dump, &m);
            eprintln!("mutation {i}: {} bytes", m.len());
        }
        let result = std::panic::catch_unwind(|| {
            let src = String::from_utf8_lossy(&m).into_owned();
            match check_bytes("m.cvnn", &m, Mode::Train) {
                Err(d) => {
                    let out = render_all("m.cvnn", &src, &d, false);
                    // Each excerpt shows at most a few lines of bounded width.
                    let bound = (d.len().min(front::limits::MAX_DIAGNOSTICS) + 1) * 64 * 1024;
                    assert!(out.len() <= bound, "{} bytes of diagnostics", out.len());
                    (false, false)
                }
                // The cheap recomputation's search (a few re-plans per compile) on one
                // mutant in eight: it has the same inputs as the rest of the planner.
                Ok(c) => (true, plan(&c, i % 8 == 0)),
            }
        });
        match result {
            Ok((c, p)) => {
                checked += usize::from(c);
                planned += usize::from(p);
            }
            Err(_) => {
                let dump = std::env::temp_dir().join(format!("cvc-mutation-{i}.cvnn"));
                let _ = std::fs::write(&dump, &m);
                panic!("mutation {i} (seed {seed:#x}) panicked; input written to {}", dump.display());
            }
        }
    }
    eprintln!("{checked} mutants checked, {planned} planned, in {:?}", start.elapsed());
    // The run must reach the planner: a mutator that only produced syntax errors would test
    // the parser alone.
    assert!(checked * 50 >= count, "only {checked} of {count} mutants checked");
}

/// Replaces one to three numbers of `src` with small, large, zero or negative ones.
fn mutate_numbers(rng: &mut Rng, src: &[u8]) -> Vec<u8> {
    let mut v = src.to_vec();
    for _ in 0..1 + rng.below(3) {
        let at = rng.below(v.len() + 1);
        let n = ["0", "1", "2", "3", "7", "64", "65536", "16777217", "99999999999999999999", "-1", "0.5"]
            [rng.below(11)];
        if let Some(p) = v.iter().skip(at).position(|c| c.is_ascii_digit()) {
            let s = at + p;
            let e = v[s..].iter().position(|c| !c.is_ascii_digit()).map_or(v.len(), |q| s + q);
            v.splice(s..e, n.bytes());
        }
    }
    v
}

/// Plans a checked mutant as `cvc plan --batch 2` does; true when a program came out.
fn plan(c: &Checked, cheap_remat: bool) -> bool {
    use cvc_compiler::passes::pipeline::{compile, Options};
    let mode = if c.graph.loss.is_some() {
        c.clone()
    } else {
        match check_source(&c.file, &c.src, Mode::Eval) {
            Ok(e) => e,
            Err(_) => return false,
        }
    };
    let opts = Options {
        batch: 2,
        optimizer: mode.train.optimizer.clone(),
        memory_budget: None,
        fuse: true,
        rnn_chunk: None,
        cheap_remat,
        ..Options::default()
    };
    match compile(mode.graph.clone(), &opts) {
        Ok(mut p) => {
            p.facts.set_lines(&mode.src);
            let _ = cvc_runtime::cli::plan::summary(&p, &mode.src, &mode.model);
            true
        }
        Err(_) => false,
    }
}
