//! The tensor-core GEMM's convolution gathers, compiled for the host: the index each kernel's
//! patch operand reads (`IB(k, n)`) under the taps' table (`tctaps=table`), and under the
//! table with each pixel's mask of the kernel window (`tctaps=mask`), must equal the one it
//! computes from the indices (`tctaps=index`) for every tap, pixel and channel group, in 32-
//! and 64-bit indexing. No GPU: the generated C of both forms is extracted from the CUDA
//! module and compiled with the host's C compiler (`$CC`, else `cc` or `gcc`), which runs every
//! pair.

use cvc_compiler::back::cuda;
use cvc_compiler::config::Precision;
use cvc_compiler::front::check_source;
use cvc_compiler::ir::Mode;
use cvc_compiler::passes::pipeline::{compile, Options};
use cvc_compiler::target::{CudaTarget, KernelConfig};
use std::fmt::Write;

/// Convolutions of every gather form: padded, strided, rectangular, dilated and grouped
/// layers, a 1 × 1 layer and a strided transposed one, trained so that each has its weight
/// gradient and input gradient too.
const SOURCE: &str = r#"
model Gathers {
    input x:     c64[B, 4, 12, 10]
    input label: class[B] of 3
    y = x |> conv2d(8, kernel = 3, pad = 1, bias = false)
          |> conv2d(8, kernel = (3, 5), pad = (1, 2), stride = (2, 1), bias = false)
          |> conv2d(8, kernel = 3, pad = 2, dilation = 2, groups = 2, bias = false)
          |> conv2d(6, kernel = 1, bias = false)
          |> conv_transpose2d(4, kernel = 3, stride = 2, pad = 1, output_padding = 1, bias = false)
          |> flatten |> linear(3) |> abs
    output y
    loss cross_entropy(y, label)
}

train Gathers {
    data      = synthetic.random(count = 16, seed = 1)
    batch     = 3
    optimizer = sgd(lr = 1e-3)
}
"#;

/// One kernel's patch gather: its index type, `IB`'s body, the taps' table fill (table form
/// only) and the extents its fetch loop covers.
struct Gather {
    name: String,
    ix: String,
    body: String,
    fill: Option<(usize, String)>,
    k: usize,
    n: usize,
    groups: usize,
}

/// The text between `start` and the first `end` after it.
fn between<'a>(s: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let i = s.find(start)? + start.len();
    let j = s[i..].find(end)? + i;
    Some(&s[i..j])
}

/// The number before `u` that follows `prefix` in `s`.
fn number_after(s: &str, prefix: &str) -> Option<usize> {
    let rest = &s[s.find(prefix)? + prefix.len()..];
    rest[..rest.find('u')?].parse().ok()
}

/// The gathers of the module's implicit-GEMM kernels, by kernel name.
fn gathers(source: &str) -> Vec<Gather> {
    let mut out = Vec::new();
    for chunk in source.split("extern \"C\" __global__ void ").skip(1) {
        let name = chunk.split("(char* A)").next().and_then(|s| s.rsplit(' ').next()).unwrap_or("");
        let Some(body) = between(chunk, "auto IB = [&](ix k, ix n) -> ix {\n", "\n  };") else {
            continue;
        };
        // `(x < N && k < ke) ? IB(k, x)` in the B operand's fetch gives N; `ke = min(.., K)`.
        let n = chunk.find("? IB(k, x)").and_then(|at| {
            let before = &chunk[..at];
            number_after(&before[before.rfind("(x < ")?..], "(x < ")
        });
        let k = between(chunk, "ke = min(kb + (ix)", ");").and_then(|s| number_after(s, "(ix)"));
        let groups = number_after(chunk, "(ix)blockIdx.z % ");
        let ix = between(chunk, "typedef ", " ix;").unwrap_or("u32").to_string();
        let fill = chunk.find("__shared__ int2 taps[").map(|_| {
            let taps = between(chunk, "__shared__ int2 taps[", "]").and_then(|t| t.parse().ok()).unwrap_or(0);
            assert!(taps > 0, "{name}: the table's size was not found");
            let lp = between(chunk, "  for (u32 t = threadIdx.x;", "\n  __syncthreads();").unwrap_or("");
            (taps, lp.to_string())
        });
        let (Some(n), Some(k), Some(groups)) = (n, k, groups) else {
            panic!("{name}: the fetch loop's extents were not found");
        };
        out.push(Gather { name: name.to_string(), ix, body: body.to_string(), fill, k, n, groups });
    }
    out
}

/// The module's CUDA source with the kernel choices `spec`, on `mma.sync`: its kernels gather
/// through one lambda per operand (`IB`), where the `wgmma` kernels inline the same
/// declarations per element (they are run under an emulated `wgmma` by `gemm_host.rs`).
fn module(program: &cvc_compiler::passes::Program, spec: &str) -> String {
    let spec = format!("mma=sync,{spec}");
    let kernels = KernelConfig::parse(&spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    let target = CudaTarget::h200().with_precision(Precision::Tf32).with_kernels(kernels);
    cuda::generate(program, &target).unwrap_or_else(|e| panic!("{spec}: {e}")).source
}

/// A C program that evaluates both forms of every kernel's gather over all (g, k, n) and
/// prints one line per kernel: its name, the pairs compared, the pairs that differ and the
/// pairs that read an element (not padding).
fn host_program(pairs: &[(Gather, Gather)]) -> String {
    let mut c = String::from(
        "#include <stdio.h>\ntypedef unsigned int u32;\ntypedef unsigned long long u64;\n\
         typedef struct { int x, y; } int2;\nstatic int2 make_int2(int x, int y) { int2 r = { x, y }; return r; }\n\
         static struct { u32 x; } threadIdx;\n",
    );
    for (i, (table, index)) in pairs.iter().enumerate() {
        let (taps, fill) = table.fill.as_ref().expect("a table");
        // The block's threads fill the table in strides; one host thread fills all of it.
        let fill = fill.replace("t += ", "t += 1u + 0u * ");
        let _ = writeln!(c, "static int2 taps_{i}[{taps}];");
        let _ = writeln!(
            c,
            "static void fill_{i}(void) {{\n  for (u32 t = 0u;{}\n}}",
            fill.replace("taps[", &format!("taps_{i}["))
        );
        for (form, g) in [("table", table), ("index", index)] {
            let body = g.body.replace("taps[", &format!("taps_{i}["));
            let _ = writeln!(
                c,
                "static u64 ib_{form}_{i}(u64 g_, u64 k_, u64 n_) {{\n  typedef {} ix;\n  const ix g = (ix)g_, k = (ix)k_, n = (ix)n_;\n  (void)g;\n{body}\n}}",
                g.ix
            );
        }
    }
    c.push_str("int main(void) {\n");
    for (i, (t, _)) in pairs.iter().enumerate() {
        let _ = writeln!(
            c,
            "  {{\n    fill_{i}();\n    u64 total = 0, differ = 0, reads = 0;\n    \
             for (u64 g = 0; g < {}u; ++g)\n      for (u64 k = 0; k < {}u; ++k)\n        for (u64 n = 0; n < {}u; ++n) {{\n          \
             const u64 a = ib_table_{i}(g, k, n), b = ib_index_{i}(g, k, n);\n          \
             ++total; differ += a != b; reads += b != (u64)(({ix})~({ix})0);\n        }}\n    \
             printf(\"{name} %llu %llu %llu\\n\", total, differ, reads);\n  }}",
            t.groups,
            t.k,
            t.n,
            ix = t.ix,
            name = t.name
        );
    }
    c.push_str("  return 0;\n}\n");
    c
}

#[test]
fn tap_table_gathers_read_what_the_index_gathers_read() {
    let checked = check_source("gathers.cvnn", SOURCE, Mode::Train).unwrap_or_else(|d| panic!("{d:?}"));
    let opts = Options { batch: 3, optimizer: checked.train.optimizer.clone(), ..Options::default() };
    let program = compile(checked.graph, &opts).unwrap_or_else(|e| panic!("{e}"));
    let dir = std::env::temp_dir().join(format!("cvc-gather-host-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    // (The mask's table has a K tile of padding entries, zero here as statics are.)
    for (form, index) in [("table", ""), ("table", ",index=64"), ("mask", ""), ("mask", ",index=64")] {
        let (with, without) = (
            gathers(&module(&program, &format!("tctaps={form}{index}"))),
            gathers(&module(&program, &format!("tctaps=index{index}"))),
        );
        let pairs: Vec<(Gather, Gather)> = with
            .into_iter()
            .filter(|g| g.fill.is_some())
            .map(|t| {
                let i = without
                    .iter()
                    .position(|g| g.name == t.name)
                    .unwrap_or_else(|| panic!("{}: no index form", t.name));
                let g = &without[i];
                assert!(g.fill.is_none(), "{}: a table under tctaps=index", t.name);
                let copy = Gather {
                    name: g.name.clone(),
                    ix: g.ix.clone(),
                    body: g.body.clone(),
                    fill: None,
                    k: g.k,
                    n: g.n,
                    groups: g.groups,
                };
                (t, copy)
            })
            .collect();
        // Forward, weight gradient and input gradient (stride 1) kernels take a table: the
        // five layers' forward and weight-gradient gathers and the stride-1 input gradients;
        // under a mask, not the weight gradients (their pixel runs along K).
        let least = if form == "mask" { 6 } else { 8 };
        assert!(pairs.len() >= least, "only {} kernels with a taps' table, {form}{index}", pairs.len());
        if form == "mask" {
            assert!(pairs.iter().all(|(t, _)| t.body.contains("vm")), "a table without a mask under {form}");
        }
        for (t, g) in &pairs {
            assert_eq!((t.k, t.n, t.groups, &t.ix), (g.k, g.n, g.groups, &g.ix), "{}: extents", t.name);
        }
        let c = dir.join(format!("gathers-{form}{}.c", index.len()));
        let exe = dir.join(format!("gathers-{form}{}", index.len()));
        std::fs::write(&c, host_program(&pairs)).expect("the C source written");
        // `$CC`, else `cc`, else `gcc` (a fresh machine has gcc).
        let compilers: Vec<String> =
            std::env::var("CC").into_iter().chain(["cc".into(), "gcc".into()]).collect();
        let (cc, built) = compilers
            .iter()
            .find_map(|cc| {
                let run =
                    std::process::Command::new(cc).args(["-O1", "-std=c99", "-o"]).arg(&exe).arg(&c).output();
                run.ok().map(|out| (cc.clone(), out))
            })
            .unwrap_or_else(|| panic!("no host C compiler among {compilers:?} (it runs these gathers)"));
        assert!(built.status.success(), "{cc} {}: {}", c.display(), String::from_utf8_lossy(&built.stderr));
        let ran = std::process::Command::new(&exe).output().expect("the host program runs");
        assert!(ran.status.success(), "{}", String::from_utf8_lossy(&ran.stderr));
        let report = String::from_utf8_lossy(&ran.stdout).into_owned();
        let mut lines = 0;
        for line in report.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            let [name, total, differ, reads] = f[..] else { panic!("{line}") };
            let (total, differ, reads): (u64, u64, u64) =
                (total.parse().unwrap(), differ.parse().unwrap(), reads.parse().unwrap());
            assert_eq!(differ, 0, "{name}, {form}{index}: {differ} of {total} gathers differ");
            // Most pairs read an element; padding is a border.
            assert!(reads > total / 4, "{name}{index}: only {reads} of {total} gathers read an element");
            lines += 1;
        }
        assert_eq!(lines, pairs.len(), "{report}");
        eprintln!("{form}{index}: {} kernels' gathers agree\n{report}", pairs.len());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
