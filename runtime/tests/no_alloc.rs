//! Proves the CPU back end's step does not touch the heap: a counting global allocator
//! records every allocation made (on any thread) while `step()` runs.

use cvc_compiler::ir::builder::Builder;
use cvc_compiler::ir::*;
use cvc_compiler::passes::pipeline::{compile, Options};
use cvc_runtime::backend::Backend;
use cvc_runtime::cpu::CpuBackend;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to the system allocator with the caller's arguments; the
// counter only observes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::SeqCst) {
            ALLOCS.fetch_add(1, Ordering::SeqCst);
        }
        System.alloc(l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::SeqCst) {
            ALLOCS.fetch_add(1, Ordering::SeqCst);
        }
        System.alloc_zeroed(l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if COUNTING.load(Ordering::SeqCst) {
            ALLOCS.fetch_add(1, Ordering::SeqCst);
        }
        System.realloc(p, l, n)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The counter is process-wide: tests hold this lock so another test's allocations (made
/// while it compiles) are never counted against a step.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Allocations made during two steps of a freshly loaded backend.
fn allocations_in_steps(program: &cvc_compiler::passes::Program) -> usize {
    // The counter itself works: one vector made while counting is one allocation.
    ALLOCS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let v = std::hint::black_box(vec![1u8; 3]);
    COUNTING.store(false, Ordering::SeqCst);
    drop(v);
    assert_eq!(ALLOCS.load(Ordering::SeqCst), 1, "the counting allocator must see allocations");
    let mut cpu = CpuBackend::new(program).expect("CPU backend loads");
    assert!(cpu.threads() >= 1);
    ALLOCS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let r1 = cpu.step();
    let r2 = cpu.step();
    COUNTING.store(false, Ordering::SeqCst);
    r1.and(r2).expect("steps run");
    ALLOCS.load(Ordering::SeqCst)
}

/// One test function runs every case: the counter is process-wide, and with two tests libtest's
/// main thread reports the first one's result (allocating) while the second is counting.
#[test]
fn steps_do_not_allocate() {
    training_step_of_seed_cnn_does_not_allocate();
    movement_fft_and_matmul_kernels_do_not_allocate();
}

fn training_step_of_seed_cnn_does_not_allocate() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/seed_cnn.cvnn");
    let src = std::fs::read_to_string(path).expect("examples/seed_cnn.cvnn exists");
    let checked = cvc_compiler::front::check_source(path, &src, Mode::Train).expect("seed_cnn checks");
    let opts = Options { batch: 4, optimizer: checked.train.optimizer.clone(), ..Options::default() };
    let program = compile(checked.graph, &opts).expect("seed_cnn compiles");
    assert_eq!(allocations_in_steps(&program), 0);
}

fn movement_fft_and_matmul_kernels_do_not_allocate() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    use Dim::{Batch as B, Fixed as F};
    let mut g = Graph::new("kernels", Mode::Eval);
    {
        let mut b = Builder::new(&mut g);
        let x =
            b.leaf(Op::Input { name: "x".into() }, TensorType::new(DType::C64, Shape(vec![B, F(8), F(16)])));
        let w = b.leaf(
            Op::Param { name: "w".into(), init: Init::Zeros },
            TensorType::new(DType::F32, Shape::fixed(&[128, 8])),
        );
        let step = b.leaf(
            Op::State { name: "t".into(), init: Init::Zeros },
            TensorType::new(DType::I32, Shape::scalar()),
        );
        let f = b.add(Op::Fft { axis: 2, inverse: false, norm: FftNorm::Ortho }, &[x]).unwrap();
        let p = b.add(Op::Permute { perm: vec![0, 2, 1] }, &[f]).unwrap();
        let padded = b.add(Op::Pad { axis: 2, before: 1, after: 1 }, &[p]).unwrap();
        let s = b.add(Op::Slice { axis: 2, start: 1, len: 8 }, &[padded]).unwrap();
        let flat = b.reshape(s, Shape(vec![Dim::Batch, F(128)])).unwrap();
        let m = b
            .add(Op::MatMul { trans: [false, false], conj: [false, false], sum_batch: false }, &[flat, w])
            .unwrap();
        let mask = b
            .add_shaped(Op::DropoutMask { p: 0.5, salt: 3 }, &[step], Some(&Shape(vec![B, F(8), F(16)])))
            .unwrap();
        let y = b.mul(x, mask).unwrap();
        let r = b.sum(y, &[1]).unwrap();
        b.graph.outputs.push(Output { name: "r".into(), value: r });
        b.graph.outputs.push(Output { name: "m".into(), value: m });
    }
    let program = compile(g, &Options { batch: 1, ..Options::default() }).expect("compiles");
    assert_eq!(allocations_in_steps(&program), 0);
}
