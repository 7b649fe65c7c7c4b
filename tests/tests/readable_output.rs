//! Readable output (issue 16): the `cvc plan` summary fits a screen, `cvc fmt` formats every
//! example and fixture to text with the same AST and IR, and `cvc report` renders in a real
//! headless browser. One test binary for the three, so CI links it once.

use cvc_compiler::front::check_source;
use cvc_compiler::ir::Mode;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// The `cvc` binary of this test's profile, built once per run (as in `cli_check.rs`);
/// `CVC_BIN` overrides the path.
fn cvc() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(p) = std::env::var("CVC_BIN") {
            return PathBuf::from(p);
        }
        let exe = std::env::current_exe().expect("test executable path");
        let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>");
        let bin = profile_dir.join(format!("cvc{}", std::env::consts::EXE_SUFFIX));
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(root()).args(["build", "-p", "cvc-runtime", "--bin", "cvc"]);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        assert!(cmd.status().expect("run cargo build").success(), "building cvc failed");
        bin
    })
}

fn run(args: &[&str]) -> Output {
    Command::new(cvc()).current_dir(root()).args(args).output().expect("cvc runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn cvnn_files(dir: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
        .expect("folder exists")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cvnn"))
        .collect();
    v.sort();
    v
}

fn examples() -> Vec<PathBuf> {
    cvnn_files("examples")
}

// ------------------------------------------------------------------------------- cvc plan

/// The default plan of every example fits a screen and still names the essentials; the
/// verbose plan lists every launched kernel.
#[test]
fn plan_summary_fits_a_screen() {
    for f in examples() {
        let path = f.to_str().expect("utf-8 path");
        let out = run(&["plan", path]);
        assert!(out.status.success(), "{path}: {}", stderr(&out));
        let text = stdout(&out);
        let n = text.lines().count();
        assert!(n <= 40, "{path}: the summary has {n} lines:\n{text}");
        for needle in
            ["passes:", "kernels:", "casts:", "arena", "lower bound", "fragmentation", "peak at step"]
        {
            assert!(text.contains(needle), "{path}: no `{needle}` in\n{text}");
        }
        let json: serde_json::Value =
            serde_json::from_str(&stdout(&run(&["plan", "--json", path]))).expect("--json is JSON");
        // Every layer line of the summary has bytes and a `.cvnn` line that exist in the plan.
        let launched =
            json["kernels"].as_array().expect("kernels").iter().filter(|k| k["kind"] != "view").count();
        assert!(text.contains(&format!("kernels: {launched} (")), "{path}: kernel count differs from --json");
        // Each entry names its group (what the back ends' kernel names carry), once.
        let mut groups: Vec<u64> = json["kernels"]
            .as_array()
            .expect("kernels")
            .iter()
            .map(|k| k["group"].as_u64().unwrap_or_else(|| panic!("{path}: a kernel without `group`: {k}")))
            .collect();
        let n_groups = groups.len();
        groups.sort_unstable();
        groups.dedup();
        assert_eq!(groups.len(), n_groups, "{path}: a group listed twice in --json");
        assert!(
            groups.iter().all(|&g| (g as usize) < n_groups),
            "{path}: a group index past the plan's groups"
        );
        let verbose = stdout(&run(&["plan", "--verbose", path]));
        let kernel_lines = verbose
            .lines()
            .filter(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.len() > 3 && w[0].parse::<usize>().is_ok() && w[2].parse::<usize>().is_ok() && w[3] == "ops"
            })
            .count();
        assert_eq!(kernel_lines, launched, "{path}: --verbose does not list every kernel:\n{verbose}");
    }
}

/// The layers listed at the peak are the largest, with their bytes summed from the JSON
/// plan's tensors, and the remainder adds up to the rest.
#[test]
fn plan_summary_groups_the_peak_by_layer() {
    let path = "examples/complex_resnet.cvnn";
    let text = stdout(&run(&["plan", path]));
    let json: serde_json::Value =
        serde_json::from_str(&stdout(&run(&["plan", "--json", path]))).expect("json");
    let mut by_layer: Vec<((String, u64), u64)> = Vec::new();
    for t in json["live_at_peak"].as_array().expect("live") {
        let key = (t["label"].as_str().expect("label").to_string(), t["line"].as_u64().expect("line"));
        let b = t["bytes"].as_u64().expect("bytes");
        match by_layer.iter_mut().find(|(k, _)| *k == key) {
            Some((_, s)) => *s += b,
            None => by_layer.push((key, b)),
        }
    }
    by_layer.sort_by_key(|x| std::cmp::Reverse(x.1));
    let listed: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("peak at step")).skip(1).collect();
    let largest = &by_layer[0];
    let first = listed[0];
    assert!(
        first.contains(&largest.0 .0) && first.contains(&format!("line {:>3}", largest.0 .1)),
        "largest layer {largest:?} is not first: {first}"
    );
    let more = listed.iter().find(|l| l.trim_start().starts_with("and ")).expect("an `and K more` line");
    let k: usize = more.split_whitespace().nth(1).expect("count").parse().expect("number");
    assert_eq!(k, by_layer.len() - 10, "{more}");
}

// -------------------------------------------------------------------------------- cvc fmt

/// The AST of `src` as JSON without byte spans (formatting moves them).
fn ast_without_spans(src: &str) -> serde_json::Value {
    fn strip(v: &mut serde_json::Value) {
        match v {
            // A span is a `span` field, or a `{start, end}` object inside a tuple.
            serde_json::Value::Object(m)
                if m.len() == 2 && m.contains_key("start") && m.contains_key("end") =>
            {
                *v = serde_json::Value::Null;
            }
            serde_json::Value::Object(m) => {
                m.retain(|k, _| k != "span");
                m.values_mut().for_each(strip);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut v = serde_json::to_value(cvc_grammar::parse(src).expect("parses")).expect("AST serialises");
    strip(&mut v);
    v
}

/// The comments of a source in order, found by a scan of its own (strings may hold `#`).
fn comments(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in src.lines() {
        let mut in_string = false;
        let mut escaped = false;
        for (i, c) in line.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if in_string => escaped = true,
                '"' => in_string = !in_string,
                '#' if !in_string => {
                    out.push(line[i..].trim_end().to_string());
                    break;
                }
                _ => {}
            }
        }
    }
    out
}

/// The lowered IR of a model that checks (training step, or inference without a loss).
fn lowered_ir(src: &str) -> Option<String> {
    let c = check_source("m.cvnn", src, Mode::Train).ok()?;
    let c = if c.graph.loss.is_none() { check_source("m.cvnn", src, Mode::Eval).ok()? } else { c };
    Some(cvc_compiler::ir::print::print_graph(&c.graph, None))
}

/// Every example and every fixture that parses formats to text with the same AST (and the
/// same lowered IR when it checks), the same comments in the same order, and formatting is
/// idempotent.
#[test]
fn fmt_keeps_meaning_and_comments_of_every_example_and_fixture() {
    let mut files = examples();
    files.extend(cvnn_files("tests/fixtures/ok"));
    files.extend(cvnn_files("tests/fixtures/err"));
    let (mut formatted, mut checked) = (0, 0);
    for f in &files {
        let Ok(src) = std::fs::read_to_string(f) else { continue };
        if cvc_grammar::parse(&src).is_err() {
            assert!(cvc_grammar::format_source(&src).is_err(), "{}: formats but does not parse", f.display());
            continue;
        }
        let out =
            cvc_grammar::format_source(&src).unwrap_or_else(|e| panic!("{}: {}", f.display(), e.message));
        let name = f.display();
        assert_eq!(ast_without_spans(&src), ast_without_spans(&out), "{name}: the AST changed:\n{out}");
        assert_eq!(comments(&src), comments(&out), "{name}: comments changed:\n{out}");
        assert_eq!(cvc_grammar::format_source(&out).expect("formats"), out, "{name}: not idempotent");
        assert!(out.lines().all(|l| l == l.trim_end()), "{name}: trailing whitespace:\n{out}");
        if let Some(ir) = lowered_ir(&src) {
            assert_eq!(Some(ir), lowered_ir(&out), "{name}: the lowered IR changed");
            checked += 1;
        }
        formatted += 1;
    }
    assert!(formatted >= 40 && checked >= 15, "only {formatted} files formatted, {checked} checked");
}

/// Layout the formatter must undo: whitespace, line breaks and comments inserted at random
/// places of every example (seeded, `CVC_SEED` varies it). Whatever still parses formats to
/// the same AST, keeps its comments, and formats to a fixed point in one step.
#[test]
fn fmt_is_stable_under_random_layout() {
    let mut state = cvc_tests::seed::seed_for("fmt_is_stable_under_random_layout") | 1;
    let mut next = move || {
        // xorshift64*: a small, fixed generator for test inputs.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let (mut tried, mut parsed) = (0, 0);
    for f in examples() {
        let src = std::fs::read_to_string(&f).expect("example reads");
        for _ in 0..40 {
            let mut text = src.clone();
            for _ in 0..(1 + next() % 6) {
                let at = (next() as usize) % (text.len() + 1);
                // Next to existing whitespace, so that most layouts still parse.
                let b = text.as_bytes();
                let near_space = (at > 0 && b[at - 1].is_ascii_whitespace())
                    || b.get(at).is_some_and(u8::is_ascii_whitespace);
                if !text.is_char_boundary(at) || !near_space {
                    continue;
                }
                let piece = ["\n", "  ", "\n\n\n", "\t", " # note\n", "\n# own line\n", "\r\n"]
                    [(next() % 7) as usize];
                text.insert_str(at, piece);
            }
            tried += 1;
            if cvc_grammar::parse(&text).is_err() {
                continue;
            }
            parsed += 1;
            let out = cvc_grammar::format_source(&text).expect("what parses formats");
            assert_eq!(
                ast_without_spans(&text),
                ast_without_spans(&out),
                "AST changed for:\n{text}\n---\n{out}"
            );
            assert_eq!(comments(&text), comments(&out), "comments changed for:\n{text}\n---\n{out}");
            assert_eq!(
                cvc_grammar::format_source(&out).expect("formats"),
                out,
                "not idempotent for:\n{text}"
            );
        }
    }
    assert!(parsed * 4 > tried, "only {parsed} of {tried} layouts parsed");
}

/// A messy file comes out in the documented canonical style (the expectation is written by
/// hand from the style in `grammar/src/fmt.rs`).
#[test]
fn fmt_writes_the_canonical_style() {
    let messy = "\n\n# header comment\nmodel   M{input x :c64[B,4]\n  input label:class[B]  of 3   # labels\n\
block u( c ,k ){conv1d(c,kernel=k)\nbatchnorm\n  crelu}\nh = x|>u(4,3)\n   |> abs   # magnitude\n      |>linear( 3 ) |> real\n\n\n\n\
  # before output\noutput h\nloss cross_entropy( h , label )\n    # closing comment\n}\n\
train M{data=synthetic.rf(classes=3,snr_db=5..20, name=\"a#b\") # data\r\nbatch=8\noptimizer = adam(lr=-1e-3)   # negative\n}";
    let expected = "# header comment
model M {
    input x:     c64[B, 4]
    input label: class[B] of 3  # labels
    block u(c, k) { conv1d(c, kernel = k)
        batchnorm
        crelu }
    h = x |> u(4, 3)
        |> abs  # magnitude
        |> linear(3) |> real

    # before output
    output h
    loss cross_entropy(h, label)
    # closing comment
}

train M {
    data      = synthetic.rf(classes = 3, snr_db = 5..20, name = \"a#b\")  # data
    batch     = 8
    optimizer = adam(lr = -1e-3)  # negative
}
";
    let out = cvc_grammar::format_source(messy).expect("formats");
    assert_eq!(out, expected, "got:\n{out}");
    assert_eq!(cvc_grammar::format_source(&out).expect("formats"), out);
    // Comments ending consecutive lines share a column.
    let two = "model M {\n    input x: c64[B, 4]  # a\n    y = x |> crelu # b\n    output y\n}\n";
    let out = cvc_grammar::format_source(two).expect("formats");
    assert!(out.contains("input x: c64[B, 4]  # a\n    y = x |> crelu      # b\n"), "{out}");
}

/// The examples are formatted (so `cvc fmt --check examples/` passes in CI).
#[test]
fn fmt_check_passes_on_the_examples() {
    let out = run(&["fmt", "--check", "examples/"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(stdout(&out), "");
}

/// `--check` lists what would change and exits 1 without writing; without it the file is
/// rewritten; a file that does not parse is an error with its line and column, and the
/// other files are still formatted.
#[test]
fn fmt_check_and_write_on_the_command_line() {
    let dir = std::env::temp_dir().join(format!("cvc-fmt-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let messy = dir.join("messy.cvnn");
    let bad = dir.join("bad.cvnn");
    let src = "model M { input x: c64[B, 4]\n y = x|>crelu\n output y }\n";
    std::fs::write(&messy, src).expect("write");
    std::fs::write(&bad, "model M {\n    y = x -> crelu\n}\n").expect("write");
    let m = messy.to_str().expect("utf-8");
    let out = run(&["fmt", "--check", m]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(stdout(&out), format!("would reformat {m}\n"));
    assert_eq!(std::fs::read_to_string(&messy).expect("read"), src, "--check wrote the file");
    let out = run(&["fmt", bad.to_str().expect("utf-8"), m]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("bad.cvnn:2:"), "{}", stderr(&out));
    let formatted = std::fs::read_to_string(&messy).expect("read");
    assert_eq!(formatted, "model M {\n    input x: c64[B, 4]\n    y = x |> crelu\n    output y\n}\n");
    let out = run(&["fmt", "--check", m]);
    assert!(out.status.success(), "{}", stderr(&out));
    let leftovers: Vec<_> =
        std::fs::read_dir(&dir).expect("dir").map(|e| e.expect("entry").file_name()).collect();
    assert_eq!(leftovers.len(), 2, "temporary files left: {leftovers:?}");
    std::fs::remove_dir_all(&dir).expect("clean up");
}

// ----------------------------------------------------------------------------- cvc report

/// A headless Chromium: `CVC_BROWSER`, else `chromium`, `chromium-browser` or
/// `google-chrome` on PATH. Without one the test fails when `CVC_REQUIRE_BROWSER=1` (CI)
/// and is skipped loudly otherwise.
fn browser() -> Option<PathBuf> {
    let found = std::env::var_os("CVC_BROWSER").map(PathBuf::from).or_else(|| {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .flat_map(|d| ["chromium", "chromium-browser", "google-chrome"].map(|n| d.join(n)))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var("CVC_REQUIRE_BROWSER").as_deref() != Ok("1"),
            "CVC_REQUIRE_BROWSER=1 but no chromium found: install it (`apt-get install chromium`) or set CVC_BROWSER"
        );
        eprintln!("\n*** SKIPPED: no headless browser (chromium); the HTML report was not rendered ***\n");
    }
    found
}

/// Runs the browser on `page` with `args`, killed after 120 s; returns its stdout.
fn headless(browser: &Path, profile: &Path, args: &[&str], page: &Path) -> String {
    let url = format!("file://{}", page.display());
    let mut child = Command::new(browser)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(&url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("browser starts");
    let mut out = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).expect("browser output");
        s
    });
    let start = std::time::Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed().as_secs() > 120 {
            let _ = child.kill();
            panic!("the browser did not finish within 120 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    reader.join().expect("reader")
}

/// The pixels of an 8-bit RGB or RGBA PNG (width, height, bytes per pixel, rows), decoded
/// here so the test needs no image crate.
fn decode_png(bytes: &[u8]) -> (usize, usize, usize, Vec<u8>) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let (mut pos, mut idat, mut ihdr) = (8, Vec::new(), None);
    while pos + 8 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[pos..pos + 4].try_into().expect("4 bytes")) as usize;
        let kind = &bytes[pos + 4..pos + 8];
        let data = &bytes[pos + 8..pos + 8 + len];
        match kind {
            b"IHDR" => ihdr = Some(data.to_vec()),
            b"IDAT" => idat.extend_from_slice(data),
            _ => {}
        }
        pos += 12 + len;
    }
    let h = ihdr.expect("IHDR");
    let w = u32::from_be_bytes(h[0..4].try_into().expect("4")) as usize;
    let ht = u32::from_be_bytes(h[4..8].try_into().expect("4")) as usize;
    assert_eq!((h[8], h[12]), (8, 0), "8-bit, not interlaced");
    let bpp = match h[9] {
        2 => 3,
        6 => 4,
        t => panic!("PNG colour type {t}"),
    };
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::ZlibDecoder::new(&idat[..]), &mut raw).expect("inflate");
    let stride = w * bpp;
    assert_eq!(raw.len(), ht * (stride + 1), "image data size");
    let mut px = vec![0u8; ht * stride];
    for y in 0..ht {
        let filter = raw[y * (stride + 1)];
        for x in 0..stride {
            let v = raw[y * (stride + 1) + 1 + x];
            let a = if x >= bpp { px[y * stride + x - bpp] as i16 } else { 0 };
            let b = if y > 0 { px[(y - 1) * stride + x] as i16 } else { 0 };
            let c = if x >= bpp && y > 0 { px[(y - 1) * stride + x - bpp] as i16 } else { 0 };
            let pred = match filter {
                0 => 0,
                1 => a,
                2 => b,
                3 => (a + b) / 2,
                4 => {
                    let p = a + b - c;
                    let (pa, pb, pc) = ((p - a).abs(), (p - b).abs(), (p - c).abs());
                    if pa <= pb && pa <= pc {
                        a
                    } else if pb <= pc {
                        b
                    } else {
                        c
                    }
                }
                f => panic!("PNG filter {f}"),
            };
            px[y * stride + x] = v.wrapping_add(pred as u8);
        }
    }
    (w, ht, bpp, px)
}

/// The value of `attr` on the element with `id` in a dumped DOM.
fn attribute(dom: &str, id: &str, attr: &str) -> Option<String> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let start = dom[..at].rfind('<')?;
    let tag = &dom[start..start + dom[start..].find('>')?];
    let key = format!(" {attr}=\"");
    let v = tag.find(&key)? + key.len();
    Some(tag[v..v + tag[v..].find('"')?].to_string())
}

/// The page needs nothing from the network: the only URL in it is the SVG namespace name.
fn assert_self_contained(html: &str) {
    let urls = html.matches("http").count();
    let namespace = html.matches("http://www.w3.org/2000/svg").count();
    assert_eq!(urls, namespace, "the page refers to the network");
    for bad in ["<link", "<script src", "<img", "@import", "url("] {
        assert!(!html.contains(bad), "the page contains `{bad}`");
    }
}

/// `cvc train` writes `plan.json` into its run folder and `cvc report` turns the folder into
/// one page that a real headless browser renders without script errors: two curves per
/// chart, the bytes-alive curve and one arena rectangle per stored value.
#[test]
fn report_of_a_run_renders_in_a_headless_browser() {
    let dir = std::env::temp_dir().join(format!("cvc-report-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let model = dir.join("tiny.cvnn");
    std::fs::write(
        &model,
        "model Tiny {\n    input x: c64[B, 8]\n    input label: class[B] of 3\n\
         logits = x |> linear(16) |> crelu |> linear(3) |> abs\n    output logits\n\
         loss cross_entropy(logits, label)\n}\n\ntrain Tiny {\n    data = synthetic.random(count = 96, seed = 2)\n\
         split = 0.75\n    batch = 16\n    epochs = 3\n}\n",
    )
    .expect("write model");
    let run_dir = dir.join("run");
    let out = run(&[
        "train",
        model.to_str().expect("utf-8"),
        "--device",
        "cpu",
        "--out",
        run_dir.to_str().expect("utf-8"),
        "-q",
    ]);
    assert!(out.status.success(), "train: {}", stderr(&out));

    // plan.json agrees with the plan's own numbers: the most bytes alive at one step is the
    // lower bound, reached at the peak step, and no buffer leaves the arena.
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("plan.json")).expect("plan.json"))
            .expect("JSON");
    let alive: Vec<u64> =
        plan["alive_bytes"].as_array().expect("alive").iter().map(|v| v.as_u64().expect("u64")).collect();
    assert_eq!(alive.len() as u64, plan["steps"].as_u64().expect("steps"));
    assert_eq!(alive.iter().max().copied(), plan["lower_bound_bytes"].as_u64());
    assert_eq!(
        Some(alive[plan["peak_step"].as_u64().expect("peak") as usize]),
        plan["lower_bound_bytes"].as_u64()
    );
    let arena = plan["arena_bytes"].as_u64().expect("arena");
    let mut values = 0;
    for b in plan["buffers"].as_array().expect("buffers") {
        assert!(b["offset"].as_u64().expect("offset") + b["bytes"].as_u64().expect("bytes") <= arena);
        for v in b["values"].as_array().expect("values") {
            values += 1;
            let line = v["line"].as_u64().expect("line");
            assert!(line == 0 || plan["source_lines"][line.to_string()].is_string(), "{v}");
        }
    }
    assert!(values > 5, "{values} values");
    assert!(plan["measured_peak_bytes"].as_u64().is_some(), "the CPU measures its peak");

    let out = run(&["report", run_dir.to_str().expect("utf-8")]);
    assert!(out.status.success(), "report: {}", stderr(&out));
    let page = run_dir.join("report.html");
    let html = std::fs::read_to_string(&page).expect("report.html");
    assert_self_contained(&html);

    let Some(chromium) = browser() else { return };
    let profile = dir.join("profile");
    let dom = headless(&chromium, &profile, &["--dump-dom"], &page);
    assert_eq!(attribute(&dom, "render-status", "data-state").as_deref(), Some("rendered"), "{dom}");
    let errors = dom.split("id=\"script-errors\"").nth(1).and_then(|s| s.split_once('>')).map(|(_, r)| r);
    assert!(errors.is_some_and(|r| r.starts_with("</pre>")), "script errors: {dom}");
    // train and validation loss, train and validation accuracy.
    assert_eq!(attribute(&dom, "render-status", "data-curves").as_deref(), Some("4"));
    assert_eq!(dom.matches("class=\"curve\"").count(), 4);
    assert_eq!(attribute(&dom, "render-status", "data-buffers"), Some(values.to_string()));
    assert_eq!(dom.matches("class=\"buf\"").count(), values);
    assert!(attribute(&dom, "alive-curve", "d").is_some_and(|d| d.len() > 20), "no bytes-alive curve");
    assert_eq!(dom.matches("class=\"peak-bar\"").count(), 3, "lower bound, arena, measured peak");

    let shot = dir.join("shot.png");
    let arg = format!("--screenshot={}", shot.display());
    headless(&chromium, &profile, &[&arg, "--window-size=1200,1400", "--hide-scrollbars"], &page);
    let (w, h, bpp, px) = decode_png(&std::fs::read(&shot).expect("screenshot written"));
    assert_eq!((w, h), (1200, 1400));
    let background = &px[..bpp];
    let drawn = px.chunks(bpp).filter(|p| p[..3] != background[..3]).count();
    let mut colours: Vec<&[u8]> = px.chunks(bpp).step_by(97).collect();
    colours.sort();
    colours.dedup();
    assert!(drawn * 20 > w * h, "only {drawn} of {} pixels drawn: a blank page", w * h);
    assert!(colours.len() > 20, "{} colours: charts missing", colours.len());
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// A model file gives the page of its plan alone (no curves, no measured peak), which the
/// browser renders without errors; a folder that is no run is a user error.
#[test]
fn report_of_a_model_file_and_of_a_folder_that_is_no_run() {
    let dir = std::env::temp_dir().join(format!("cvc-report-model-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let page = dir.join("seed.html");
    let out =
        run(&["report", "examples/seed_cnn.cvnn", "--batch", "4", "--out", page.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let html = std::fs::read_to_string(&page).expect("page");
    assert_self_contained(&html);
    assert!(html.contains("\"batch\":4"), "the plan is for batch 4");
    let out = run(&["report", dir.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("neither metrics.jsonl nor plan.json"), "{}", stderr(&out));
    if let Some(chromium) = browser() {
        let dom = headless(&chromium, &dir.join("profile"), &["--dump-dom"], &page);
        assert_eq!(attribute(&dom, "render-status", "data-state").as_deref(), Some("rendered"), "{dom}");
        assert_eq!(attribute(&dom, "render-status", "data-curves").as_deref(), Some("0"));
        assert!(dom.contains("not measured"), "no measured peak without a run");
    }
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// `param` items get a line each and the spacing of bindings; the fixture is canonical.
#[test]
fn fmt_lays_out_param_items() {
    let messy = "model M {\n input x: c64[B, 4]\n  param   p :c64[ 4 ]=normal( std=0.5 ) param q: f32[1] = ones\n y = x*p*q\n output y\n}\n";
    let want = "model M {\n    input x: c64[B, 4]\n    param p: c64[4] = normal(std = 0.5)\n    param q: f32[1] = ones\n    y = x * p * q\n    output y\n}\n";
    assert_eq!(cvc_grammar::format_source(messy).expect("formats"), want);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let tokens = std::fs::read_to_string(root.join("fixtures/ok/tokens.cvnn")).expect("fixture");
    assert_eq!(cvc_grammar::format_source(&tokens).expect("formats"), tokens);
}
