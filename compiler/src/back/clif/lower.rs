//! Lowers one `Elementwise` or `Reduce` kernel group to a Cranelift function.
//!
//! Every kernel has the signature `fn(arena_base: i64, lo: i64, hi: i64)`: it runs the
//! iterations `lo..hi` of its outermost loop, so the runtime can split a kernel across
//! threads. Shapes are resolved at the plan's batch size and slot offsets are constants, so
//! the body is plain pointer arithmetic: each operand has a byte stride per loop (0 for a
//! broadcast axis), adjacent axes with compatible strides are merged, and the pointers are
//! advanced by addition. Complex values are lowered to `(re, im)` pairs of f32; reductions
//! loop over the kept axes outside and the reduced axes inside, summing in f64.
//!
//! The innermost loop is vectorised with `f32x4`: four elements per iteration, then a scalar
//! tail. Contiguous operands are vector loads (complex ones de-interleaved into a re and an
//! im vector by two shuffles), broadcast operands are splats, other strides gather lane by
//! lane; helper calls (exp, log, ...) run per lane. Sums keep `f32x4` partial sums that are
//! added into the f64 total when the reduction ends; max reductions stay scalar.

use super::helpers::Helper;
use crate::ir::*;
use crate::passes::fusion::{GroupKind, KernelGroup};
use crate::passes::Program;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    self, types, AbiParam, Endianness, FuncRef, Function, InstBuilder, MemFlagsData, Signature,
};
use cranelift_codegen::isa::CallConv;
use cranelift_codegen::isa::TargetFrontendConfig;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use std::collections::HashMap;

/// Imports a helper into a function being built (the JIT declares it in its module; the text
/// emitter names it by symbol).
pub type Importer<'a> = dyn FnMut(&mut Function, Helper) -> FuncRef + 'a;

/// A lowered kernel: its function and the extent of its outermost loop.
pub struct LoweredKernel {
    /// The Cranelift function.
    pub func: Function,
    /// Iterations of the outermost loop (the `hi` of a whole run).
    pub rows: usize,
    /// Elements of the iteration domain (for deciding whether to split across threads).
    pub work: usize,
}

/// The signature of every kernel: `(arena_base, lo, hi)`, all i64.
pub fn kernel_signature(call_conv: CallConv) -> Signature {
    let mut sig = Signature::new(call_conv);
    for _ in 0..3 {
        sig.params.push(AbiParam::new(types::I64));
    }
    sig
}

/// One loop of a nest: its extent and the byte stride of every operand stream.
#[derive(Clone, Debug)]
struct Loop {
    ext: usize,
    strides: Vec<i64>,
}

/// A value inside the element loop: real, or a complex `(re, im)` pair.
#[derive(Clone, Copy)]
enum V {
    R(ir::Value),
    C(ir::Value, ir::Value),
}

/// Byte strides of a tensor of `shape` read broadcast over `domain` (0 on broadcast axes).
fn broadcast_strides(shape: &[usize], domain: &[usize], elem: usize) -> Vec<i64> {
    let mut own = vec![0i64; shape.len()];
    let mut s = elem as i64;
    for i in (0..shape.len()).rev() {
        own[i] = s;
        s *= shape[i] as i64;
    }
    let lead = domain.len() - shape.len().min(domain.len());
    (0..domain.len())
        .map(|d| {
            if d < lead {
                return 0;
            }
            let j = d - lead;
            if shape[j] == 1 && domain[d] != 1 {
                0
            } else {
                own[j]
            }
        })
        .collect()
}

/// Merges loops that address memory as one (`outer stride = inner stride × inner extent` for
/// every stream) and drops extent-1 loops.
fn collapse(loops: Vec<Loop>) -> Vec<Loop> {
    let mut out: Vec<Loop> = Vec::new();
    for l in loops.into_iter().filter(|l| l.ext != 1) {
        if let Some(prev) = out.last_mut() {
            let merge = prev.strides.iter().zip(&l.strides).all(|(&p, &c)| p == c * l.ext as i64);
            if merge {
                prev.ext *= l.ext;
                prev.strides = l.strides;
                continue;
            }
        }
        out.push(l);
    }
    out
}

/// The code emitted once per element (or per vector of elements) of a loop nest, given the
/// stream pointers of that iteration.
type ElementBody<'a, E> = dyn FnMut(&mut E, &[ir::Value]) -> Result<(), String> + 'a;

/// Lanes of the vectorised inner loop.
const LANES: usize = 4;

struct Emitter<'f, 'i> {
    b: FunctionBuilder<'f>,
    import: &'i mut Importer<'i>,
    helpers: HashMap<Helper, FuncRef>,
    /// Whether the code being emitted is the vector body (values are `f32x4`).
    vec: bool,
    /// Byte strides of the streams along the vectorised loop (valid while `vec`).
    strides: Vec<i64>,
}

fn vflags() -> MemFlagsData {
    MemFlagsData::new().with_endianness(Endianness::Little)
}

impl Emitter<'_, '_> {
    fn f32c(&mut self, x: f64) -> ir::Value {
        let c = self.b.ins().f32const(x as f32);
        if self.vec {
            self.b.ins().splat(types::F32X4, c)
        } else {
            c
        }
    }

    /// `cc(a, b) ? x : y`, lane-wise in vector code.
    fn choose(&mut self, cc: FloatCC, a: ir::Value, b: ir::Value, x: ir::Value, y: ir::Value) -> ir::Value {
        let c = self.b.ins().fcmp(cc, a, b);
        if self.vec {
            let m = self.b.ins().bitcast(types::F32X4, vflags(), c);
            self.b.ins().bitselect(m, x, y)
        } else {
            self.b.ins().select(c, x, y)
        }
    }

    fn helper_ref(&mut self, h: Helper) -> FuncRef {
        match self.helpers.get(&h) {
            Some(&f) => f,
            None => {
                let f = (self.import)(self.b.func, h);
                self.helpers.insert(h, f);
                f
            }
        }
    }

    fn call(&mut self, h: Helper, args: &[ir::Value]) -> ir::Value {
        let fr = self.helper_ref(h);
        if !self.vec {
            let inst = self.b.ins().call(fr, args);
            return self.b.inst_results(inst)[0];
        }
        let mut lanes = Vec::with_capacity(LANES);
        for lane in 0..LANES as u8 {
            let a: Vec<ir::Value> = args.iter().map(|&v| self.b.ins().extractlane(v, lane)).collect();
            let inst = self.b.ins().call(fr, &a);
            lanes.push(self.b.inst_results(inst)[0]);
        }
        self.build(&lanes)
    }

    /// A vector from `LANES` scalars.
    fn build(&mut self, lanes: &[ir::Value]) -> ir::Value {
        let mut v = self.b.ins().splat(types::F32X4, lanes[0]);
        for (i, &x) in lanes.iter().enumerate().skip(1) {
            v = self.b.ins().insertlane(v, x, i as u8);
        }
        v
    }

    /// Byte shuffle of two `f32x4` (lanes of `a` are bytes 0..16, of `b` 16..32).
    fn shuffle(&mut self, a: ir::Value, b: ir::Value, lanes: [u8; 4]) -> ir::Value {
        let mut mask = Vec::with_capacity(16);
        for l in lanes {
            for byte in 0..4 {
                mask.push(l * 4 + byte);
            }
        }
        let imm = self.b.func.dfg.immediates.push(mask.into());
        let a8 = self.b.ins().bitcast(types::I8X16, vflags(), a);
        let b8 = self.b.ins().bitcast(types::I8X16, vflags(), b);
        let r = self.b.ins().shuffle(a8, b8, imm);
        self.b.ins().bitcast(types::F32X4, vflags(), r)
    }

    /// Runs `body` once per iteration of `loops`, with the stream pointers of that iteration.
    /// Loop `vector_at` (an index into `loops`) runs `LANES` iterations at a time: everything
    /// nested in it is emitted as vector code (`self.vec`, lane `l` at `l ×` that loop's
    /// stride), followed by a scalar tail.
    fn nest(
        &mut self,
        loops: &[Loop],
        ptrs: &[ir::Value],
        range: Option<(ir::Value, ir::Value)>,
        vector_at: Option<usize>,
        body: &mut ElementBody<Self>,
    ) -> Result<(), String> {
        let Some(l) = loops.first() else {
            return body(self, ptrs);
        };
        let (lo, hi) = match range {
            Some(r) => r,
            None => (self.b.ins().iconst(types::I64, 0), self.b.ins().iconst(types::I64, l.ext as i64)),
        };
        let ivar = self.b.declare_var(types::I64);
        self.b.def_var(ivar, lo);
        let mut pvars: Vec<Variable> = Vec::with_capacity(ptrs.len());
        for (&p, &s) in ptrs.iter().zip(&l.strides) {
            let v = self.b.declare_var(types::I64);
            let start = if s == 0 || range.is_none() {
                p
            } else {
                let off = self.b.ins().imul_imm_s(lo, s);
                self.b.ins().iadd(p, off)
            };
            self.b.def_var(v, start);
            pvars.push(v);
        }
        let exit = self.b.create_block();
        let here = vector_at == Some(0) && l.ext >= LANES && !self.vec;
        let deeper = vector_at.and_then(|d| d.checked_sub(1));
        let mut passes = vec![(false, 1i64)];
        if here {
            passes.insert(0, (true, LANES as i64));
        }
        let mut next = self.b.create_block();
        self.b.ins().jump(next, &[]);
        for (k, &(is_vec, step)) in passes.iter().enumerate() {
            let header = next;
            let inner = self.b.create_block();
            let after = if k + 1 < passes.len() { self.b.create_block() } else { exit };
            next = after;
            self.b.switch_to_block(header);
            let i = self.b.use_var(ivar);
            let last = self.b.ins().iadd_imm_s(i, step - 1);
            let go = self.b.ins().icmp(IntCC::SignedLessThan, last, hi);
            self.b.ins().brif(go, inner, &[], after, &[]);
            self.b.switch_to_block(inner);
            let cur: Vec<ir::Value> = pvars.iter().map(|&v| self.b.use_var(v)).collect();
            if is_vec {
                self.vec = true;
                self.strides = l.strides.clone();
                let r = self.nest(&loops[1..], &cur, None, None, body);
                self.vec = false;
                r?;
            } else {
                self.nest(&loops[1..], &cur, None, deeper, body)?;
            }
            let i = self.b.use_var(ivar);
            let i1 = self.b.ins().iadd_imm_s(i, step);
            self.b.def_var(ivar, i1);
            for (&v, &s) in pvars.iter().zip(&l.strides) {
                if s != 0 {
                    let p = self.b.use_var(v);
                    let p1 = self.b.ins().iadd_imm_s(p, s * step);
                    self.b.def_var(v, p1);
                }
            }
            self.b.ins().jump(header, &[]);
        }
        self.b.switch_to_block(exit);
        Ok(())
    }

    /// The address of lane `l` of a strided vector access at `ptr`: `ptr` and the lane's byte
    /// offset as the load's immediate when it fits an `i32` (with room for a complex value's
    /// imaginary part), else `ptr + l·stride` computed in 64 bits and offset 0 (strides of
    /// hundreds of MiB, which only tensors past 2³¹ bytes have).
    fn lane_address(&mut self, ptr: ir::Value, l: usize, stride: i64) -> (ir::Value, i32) {
        let off = l as i64 * stride;
        match i32::try_from(off) {
            Ok(o) if o.checked_add(4).is_some() => (ptr, o),
            _ => (self.b.ins().iadd_imm_s(ptr, off), 0),
        }
    }

    fn load_scalar(&mut self, dtype: DType, ptr: ir::Value, off: i32) -> V {
        let fl = MemFlagsData::trusted();
        match dtype {
            DType::F32 => V::R(self.b.ins().load(types::F32, fl, ptr, off)),
            DType::I32 => {
                let i = self.b.ins().load(types::I32, fl, ptr, off);
                V::R(self.b.ins().fcvt_from_sint(types::F32, i))
            }
            DType::C64 => {
                let re = self.b.ins().load(types::F32, fl, ptr, off);
                let im = self.b.ins().load(types::F32, fl, ptr, off + 4);
                V::C(re, im)
            }
        }
    }

    /// Loads stream `k`'s element(s) at `ptr`: one scalar, or `LANES` of them in vector code.
    fn load(&mut self, dtype: DType, ptr: ir::Value, k: usize) -> V {
        if !self.vec {
            return self.load_scalar(dtype, ptr, 0);
        }
        let stride = self.strides[k];
        let fl = MemFlagsData::trusted();
        if stride == 0 {
            let one = self.load_scalar(dtype, ptr, 0);
            return match one {
                V::R(x) => V::R(self.b.ins().splat(types::F32X4, x)),
                V::C(r, i) => V::C(self.b.ins().splat(types::F32X4, r), self.b.ins().splat(types::F32X4, i)),
            };
        }
        if stride == dtype.bytes() as i64 {
            return match dtype {
                DType::F32 => V::R(self.b.ins().load(types::F32X4, fl, ptr, 0)),
                DType::I32 => {
                    let i = self.b.ins().load(types::I32X4, fl, ptr, 0);
                    V::R(self.b.ins().fcvt_from_sint(types::F32X4, i))
                }
                DType::C64 => {
                    let a = self.b.ins().load(types::F32X4, fl, ptr, 0);
                    let b = self.b.ins().load(types::F32X4, fl, ptr, 16);
                    let re = self.shuffle(a, b, [0, 2, 4, 6]);
                    let im = self.shuffle(a, b, [1, 3, 5, 7]);
                    V::C(re, im)
                }
            };
        }
        let lanes: Vec<V> = (0..LANES)
            .map(|l| {
                let (p, off) = self.lane_address(ptr, l, stride);
                self.load_scalar(dtype, p, off)
            })
            .collect();
        let re: Vec<ir::Value> = lanes
            .iter()
            .map(|v| match v {
                V::R(x) | V::C(x, _) => *x,
            })
            .collect();
        let re = self.build(&re);
        match dtype {
            DType::C64 => {
                let im: Vec<ir::Value> = lanes
                    .iter()
                    .map(|v| match v {
                        V::C(_, i) => *i,
                        V::R(x) => *x,
                    })
                    .collect();
                V::C(re, self.build(&im))
            }
            _ => V::R(re),
        }
    }

    fn store_scalar(&mut self, dtype: DType, v: V, ptr: ir::Value, off: i32) -> Result<(), String> {
        let fl = MemFlagsData::trusted();
        match (dtype, v) {
            (DType::F32, V::R(x)) => {
                self.b.ins().store(fl, x, ptr, off);
            }
            (DType::C64, v) => {
                let (re, im) = self.parts(v);
                self.b.ins().store(fl, re, ptr, off);
                self.b.ins().store(fl, im, ptr, off + 4);
            }
            (DType::I32, V::R(x)) => {
                let i = self.b.ins().fcvt_to_sint_sat(types::I32, x);
                self.b.ins().store(fl, i, ptr, off);
            }
            _ => return Err(format!("cannot store a complex value into a {dtype} buffer")),
        }
        Ok(())
    }

    /// Stores `v` to stream `k` at `ptr` (all lanes in vector code).
    fn store(&mut self, dtype: DType, v: V, ptr: ir::Value, k: usize) -> Result<(), String> {
        if !self.vec {
            return self.store_scalar(dtype, v, ptr, 0);
        }
        let stride = self.strides[k];
        let fl = MemFlagsData::trusted();
        if stride == dtype.bytes() as i64 {
            match (dtype, v) {
                (DType::F32, V::R(x)) => {
                    self.b.ins().store(fl, x, ptr, 0);
                    return Ok(());
                }
                (DType::C64, v) => {
                    let (re, im) = self.parts(v);
                    let lo = self.shuffle(re, im, [0, 4, 1, 5]);
                    let hi = self.shuffle(re, im, [2, 6, 3, 7]);
                    self.b.ins().store(fl, lo, ptr, 0);
                    self.b.ins().store(fl, hi, ptr, 16);
                    return Ok(());
                }
                _ => {}
            }
        }
        let (re, im) = match v {
            V::R(x) => (x, None),
            V::C(r, i) => (r, Some(i)),
        };
        for l in 0..LANES {
            let r = self.b.ins().extractlane(re, l as u8);
            let lane = match im {
                Some(i) => V::C(r, self.b.ins().extractlane(i, l as u8)),
                None => V::R(r),
            };
            let (p, off) = self.lane_address(ptr, l, stride);
            self.store_scalar(dtype, lane, p, off)?;
        }
        Ok(())
    }

    fn parts(&mut self, v: V) -> (ir::Value, ir::Value) {
        match v {
            V::C(re, im) => (re, im),
            V::R(x) => (x, self.f32c(0.0)),
        }
    }

    fn real(v: V, what: &str) -> Result<ir::Value, String> {
        match v {
            V::R(x) => Ok(x),
            V::C(..) => Err(format!("{what} of a complex value")),
        }
    }

    fn flag(&mut self, cc: FloatCC, a: ir::Value, b: ir::Value) -> ir::Value {
        let one = self.f32c(1.0);
        let zero = self.f32c(0.0);
        self.choose(cc, a, b, one, zero)
    }

    fn unary(&mut self, op: UnaryOp, x: V) -> Result<V, String> {
        use UnaryOp::*;
        Ok(match (op, x) {
            (Neg, V::R(a)) => V::R(self.b.ins().fneg(a)),
            (Neg, V::C(a, b)) => V::C(self.b.ins().fneg(a), self.b.ins().fneg(b)),
            (Conj | StopGrad | Real, V::R(a)) => V::R(a),
            (Conj, V::C(a, b)) => V::C(a, self.b.ins().fneg(b)),
            (StopGrad, c @ V::C(..)) => c,
            (Real, V::C(a, _)) => V::R(a),
            (Imag, V::R(_)) => V::R(self.f32c(0.0)),
            (Imag, V::C(_, b)) => V::R(b),
            (Abs, V::R(a)) => V::R(self.b.ins().fabs(a)),
            (Abs2, V::R(a)) => V::R(self.b.ins().fmul(a, a)),
            (Abs | Abs2, V::C(a, b)) => {
                let aa = self.b.ins().fmul(a, a);
                let s = self.b.ins().fma(b, b, aa);
                V::R(if op == Abs { self.b.ins().sqrt(s) } else { s })
            }
            (Angle, V::R(a)) => {
                let z = self.f32c(0.0);
                V::R(self.call(Helper::Atan2, &[z, a]))
            }
            (Angle, V::C(a, b)) => V::R(self.call(Helper::Atan2, &[b, a])),
            (ToComplex, V::R(a)) => V::C(a, self.f32c(0.0)),
            (ToComplex, c @ V::C(..)) => c,
            (op, v) => {
                let a = Self::real(v, &format!("{op:?}"))?;
                V::R(match op {
                    Exp => self.call(Helper::Exp, &[a]),
                    Log => self.call(Helper::Log, &[a]),
                    Sin => self.call(Helper::Sin, &[a]),
                    Cos => self.call(Helper::Cos, &[a]),
                    Tanh => self.call(Helper::Tanh, &[a]),
                    Sigmoid => self.call(Helper::Sigmoid, &[a]),
                    Gelu => self.call(Helper::GeluErf, &[a]),
                    GeluGrad => self.call(Helper::GeluErfGrad, &[a]),
                    GeluTanh => self.call(Helper::Gelu, &[a]),
                    GeluTanhGrad => self.call(Helper::GeluGrad, &[a]),
                    Sqrt => self.b.ins().sqrt(a),
                    Rsqrt => {
                        let s = self.b.ins().sqrt(a);
                        let one = self.f32c(1.0);
                        self.b.ins().fdiv(one, s)
                    }
                    Recip => {
                        let one = self.f32c(1.0);
                        self.b.ins().fdiv(one, a)
                    }
                    Relu => {
                        let z = self.f32c(0.0);
                        self.choose(FloatCC::GreaterThan, a, z, a, z)
                    }
                    Step => {
                        let z = self.f32c(0.0);
                        self.flag(FloatCC::GreaterThan, a, z)
                    }
                    // Complex-aware ops are matched with their operand above.
                    Neg | Conj | Real | Imag | Abs | Abs2 | Angle | ToComplex | StopGrad => {
                        return Err(format!("unary {op:?} of a real operand fell through"))
                    }
                })
            }
        })
    }

    fn binary(&mut self, op: BinaryOp, x: V, y: V) -> Result<V, String> {
        use BinaryOp::*;
        Ok(match (op, x, y) {
            (Add, V::R(a), V::R(b)) => V::R(self.b.ins().fadd(a, b)),
            (Sub, V::R(a), V::R(b)) => V::R(self.b.ins().fsub(a, b)),
            (Mul, V::R(a), V::R(b)) => V::R(self.b.ins().fmul(a, b)),
            (Div, V::R(a), V::R(b)) => V::R(self.b.ins().fdiv(a, b)),
            (Add, V::C(a, b), V::R(c)) => V::C(self.b.ins().fadd(a, c), b),
            (Add, V::R(a), V::C(c, d)) => V::C(self.b.ins().fadd(a, c), d),
            (Sub, V::C(a, b), V::R(c)) => V::C(self.b.ins().fsub(a, c), b),
            (Sub, V::R(a), V::C(c, d)) => V::C(self.b.ins().fsub(a, c), self.b.ins().fneg(d)),
            (Add | Sub, V::C(a, b), V::C(c, d)) => {
                if op == Add {
                    V::C(self.b.ins().fadd(a, c), self.b.ins().fadd(b, d))
                } else {
                    V::C(self.b.ins().fsub(a, c), self.b.ins().fsub(b, d))
                }
            }
            (Mul, V::C(a, b), V::R(c)) | (Mul, V::R(c), V::C(a, b)) => {
                V::C(self.b.ins().fmul(a, c), self.b.ins().fmul(b, c))
            }
            (Mul, V::C(a, b), V::C(c, d)) => {
                let ac = self.b.ins().fmul(a, c);
                let bd = self.b.ins().fmul(b, d);
                let ad = self.b.ins().fmul(a, d);
                let bc = self.b.ins().fmul(b, c);
                V::C(self.b.ins().fsub(ac, bd), self.b.ins().fadd(ad, bc))
            }
            (Div, V::C(a, b), V::R(c)) => V::C(self.b.ins().fdiv(a, c), self.b.ins().fdiv(b, c)),
            (Div, x, V::C(c, d)) => {
                // x / (c + id) = x·(c − id) / (c² + d²)
                let (a, b) = self.parts(x);
                let cc = self.b.ins().fmul(c, c);
                let den = self.b.ins().fma(d, d, cc);
                let ac = self.b.ins().fmul(a, c);
                let re = self.b.ins().fma(b, d, ac);
                let bc = self.b.ins().fmul(b, c);
                let ad = self.b.ins().fmul(a, d);
                let im = self.b.ins().fsub(bc, ad);
                V::C(self.b.ins().fdiv(re, den), self.b.ins().fdiv(im, den))
            }
            (Max, V::R(a), V::R(b)) => V::R(self.choose(FloatCC::GreaterThanOrEqual, a, b, a, b)),
            (Complex, V::R(a), V::R(b)) => V::C(a, b),
            (Greater, V::R(a), V::R(b)) => V::R(self.flag(FloatCC::GreaterThan, a, b)),
            (Equal, V::R(a), V::R(b)) => V::R(self.flag(FloatCC::Equal, a, b)),
            (op, ..) => return Err(format!("binary {op:?} of complex operands")),
        })
    }

    fn select(&mut self, c: V, a: V, b: V) -> Result<V, String> {
        let c = Self::real(c, "select condition")?;
        let z = self.f32c(0.0);
        Ok(match (a, b) {
            (V::R(x), V::R(y)) => V::R(self.choose(FloatCC::GreaterThan, c, z, x, y)),
            (a, b) => {
                let (ar, ai) = self.parts(a);
                let (br, bi) = self.parts(b);
                let re = self.choose(FloatCC::GreaterThan, c, z, ar, br);
                let im = self.choose(FloatCC::GreaterThan, c, z, ai, bi);
                V::C(re, im)
            }
        })
    }
}

/// Everything the element body needs: which streams carry which inputs, and the nodes.
struct Body<'p> {
    g: &'p Graph,
    batch: usize,
    /// The inputs this body reads, each with its stream (its index in the pointers).
    inputs: Vec<(usize, Value)>,
    nodes: Vec<Value>,
}

impl Body<'_> {
    /// Evaluates the nodes (a `Reduce` among them is skipped) at one element, starting from
    /// the values in `given` (a reduction's result, for its epilogue).
    fn eval(
        &self,
        em: &mut Emitter,
        ptrs: &[ir::Value],
        given: &[(Value, V)],
    ) -> Result<HashMap<Value, V>, String> {
        let mut vals: HashMap<Value, V> = given.iter().copied().collect();
        for &(k, v) in &self.inputs {
            let x = em.load(self.g.ty(v).dtype, ptrs[k], k);
            vals.insert(v, x);
        }
        for &v in &self.nodes {
            let n = self.g.node(v);
            let arg = |i: usize| -> Result<V, String> {
                vals.get(&n.inputs[i])
                    .copied()
                    .ok_or_else(|| format!("{v}: operand {} not available", n.inputs[i]))
            };
            let x = match &n.op {
                Op::Scalar { value, batch_exp } => {
                    V::R(em.f32c(value * (self.batch as f64).powi(*batch_exp)))
                }
                Op::Unary(u) => em.unary(*u, arg(0)?)?,
                Op::Binary(b) => em.binary(*b, arg(0)?, arg(1)?)?,
                Op::Select => em.select(arg(0)?, arg(1)?, arg(2)?)?,
                Op::Assign | Op::Reduce { .. } => continue,
                // Leaves are loop inputs, and fusion keeps contractions, movement and views out
                // of loop groups: reaching one here is a fusion bug.
                op @ (Op::Input { .. }
                | Op::Param { .. }
                | Op::State { .. }
                | Op::Reshape
                | Op::Expand
                | Op::Permute { .. }
                | Op::Slice { .. }
                | Op::Pad { .. }
                | Op::Concat { .. }
                | Op::MatMul { .. }
                | Op::Conv2d { .. }
                | Op::ConvTranspose2d { .. }
                | Op::Conv2dWeightGrad { .. }
                | Op::Fft { .. }
                | Op::OneHot { .. }
                | Op::DropoutMask { .. }
                | Op::AttnLse { .. }
                | Op::Attention { .. }
                | Op::AttentionGrad { .. }
                | Op::Recurrence { .. }
                | Op::RecurrenceGrad { .. }
                | Op::Gather
                | Op::ScatterAdd { .. }) => {
                    return Err(format!("{v}: {} cannot be fused into a loop", op.mnemonic()))
                }
            };
            vals.insert(v, x);
        }
        Ok(vals)
    }
}

fn resolve(s: &Shape, batch: usize) -> Vec<usize> {
    s.resolve(batch)
}

/// Lowers group `gid` of `program` (an `Elementwise` or `Reduce` group).
pub fn lower_group(
    program: &Program,
    gid: usize,
    config: TargetFrontendConfig,
    import: &mut Importer,
) -> Result<LoweredKernel, String> {
    let g = &program.graph;
    let grp: &KernelGroup = &program.groups[gid];
    let batch = program.plan.batch;
    let domain = resolve(&grp.domain, batch);
    let work: usize = domain.iter().product();
    let slot_of = |v: Value| -> Result<i64, String> {
        program
            .plan
            .slot(v)
            .map(|s| s.offset as i64)
            .ok_or_else(|| format!("value {v} ({}) has no arena slot", g.node(v).op.mnemonic()))
    };
    // Streams: the inputs, then the stored outputs.
    let mut bases = Vec::new();
    let mut strides: Vec<Vec<i64>> = Vec::new();
    for &v in &grp.inputs {
        let t = g.ty(v);
        bases.push(slot_of(v)?);
        strides.push(broadcast_strides(&resolve(&t.shape, batch), &domain, t.dtype.bytes()));
    }
    // A reduction's parts: prologue, the `Reduce` node, epilogue (`fusion::merge_epilogues`).
    let parts = match grp.kind {
        GroupKind::Elementwise => None,
        GroupKind::Reduce => Some(grp.reduce_parts(g).ok_or("a reduce group without a reduction")?),
        k => return Err(format!("group {gid} is {k:?}, not a loop kernel")),
    };
    let outputs: Vec<Value> = match parts {
        Some((_, red, [])) => vec![red],
        _ => grp.outputs.clone(),
    };
    for &v in &outputs {
        let t = g.ty(v);
        bases.push(slot_of(v)?);
        strides.push(broadcast_strides(&resolve(&t.shape, batch), &domain, t.dtype.bytes()));
    }
    let dim_loop = |d: usize| Loop { ext: domain[d], strides: strides.iter().map(|s| s[d]).collect() };
    let reduced: Vec<usize> = match parts {
        Some((_, red, _)) => match &g.node(red).op {
            Op::Reduce { axes, .. } => axes.clone(),
            _ => return Err(format!("group {gid}: its reduction is not a `Reduce`")),
        },
        None => Vec::new(),
    };
    let mut outer = collapse((0..domain.len()).filter(|d| !reduced.contains(d)).map(dim_loop).collect());
    let inner = collapse(reduced.iter().map(|&d| dim_loop(d)).collect());
    if outer.is_empty() {
        outer.push(Loop { ext: 1, strides: vec![0; bases.len()] });
    }
    let rows = outer[0].ext;
    // The loop to vectorise: the innermost one of at least LANES iterations (elementwise);
    // for a sum, the innermost reduced loop when it is that long, else a kept loop (each lane
    // then sums its own output). Max reductions stay scalar.
    let deepest = |ls: &[Loop]| ls.iter().rposition(|l| l.ext >= LANES);
    let (outer_vec, inner_vec) = match parts {
        None => (deepest(&outer), None),
        Some((_, red, _)) => match &g.node(red).op {
            Op::Reduce { op: ReduceOp::Sum, .. } => match inner.last() {
                Some(l) if l.ext >= LANES => (None, Some(inner.len() - 1)),
                _ => (deepest(&outer), None),
            },
            _ => (None, None),
        },
    };

    let mut func = Function::with_name_signature(
        ir::UserFuncName::user(0, gid as u32),
        kernel_signature(config.default_call_conv),
    );
    let mut fctx = FunctionBuilderContext::new();
    let b = FunctionBuilder::new(&mut func, &mut fctx);
    let mut em = Emitter { b, import, helpers: HashMap::new(), vec: false, strides: Vec::new() };
    let entry = em.b.create_block();
    em.b.append_block_params_for_function_params(entry);
    em.b.switch_to_block(entry);
    let params = em.b.block_params(entry).to_vec();
    let (base, lo, hi) = (params[0], params[1], params[2]);
    let ptrs: Vec<ir::Value> = bases.iter().map(|&o| em.b.ins().iadd_imm_s(base, o)).collect();
    let n_in = grp.inputs.len();
    // The streams whose values `nodes` read (all inputs, for an elementwise group).
    let body_of = |nodes: &[Value]| Body {
        g,
        batch,
        inputs: grp
            .inputs
            .iter()
            .copied()
            .enumerate()
            .filter(|&(_, v)| parts.is_none() || nodes.iter().any(|&n| g.node(n).inputs.contains(&v)))
            .collect(),
        nodes: nodes.to_vec(),
    };

    match parts {
        None => {
            let body = body_of(&grp.nodes);
            em.nest(&outer, &ptrs, Some((lo, hi)), outer_vec, &mut |em, p| {
                let vals = body.eval(em, p, &[])?;
                for (k, &o) in outputs.iter().enumerate() {
                    let n = g.node(o);
                    let src = if matches!(n.op, Op::Assign) { n.inputs[1] } else { o };
                    let v = *vals.get(&src).ok_or_else(|| format!("output {o} not computed"))?;
                    em.store(n.ty.dtype, v, p[n_in + k], n_in + k)?;
                }
                Ok(())
            })?;
        }
        Some((pro, red, epi)) => {
            let rn = g.node(red);
            let Op::Reduce { op, .. } = rn.op else { unreachable!("checked above") };
            let src = rn.inputs[0];
            let complex = g.ty(src).dtype.is_complex();
            let mut pro_red = pro.to_vec();
            pro_red.push(red);
            let (prologue, epilogue) = (body_of(&pro_red), body_of(epi));
            em.nest(&outer, &ptrs, Some((lo, hi)), outer_vec, &mut |em, p| {
                let acc = reduce_init(em, op);
                em.nest(&inner, p, None, inner_vec, &mut |em, q| {
                    let vals = prologue.eval(em, q, &[])?;
                    let x = *vals.get(&src).ok_or("reduction operand not computed")?;
                    reduce_step(em, op, &acc, x);
                    Ok(())
                })?;
                let v = reduce_finish(em, op, &acc, complex);
                if epi.is_empty() {
                    return em.store(rn.ty.dtype, v, p[n_in], n_in);
                }
                // The epilogue at this output element: its operands are broadcast along the
                // reduced axes, so the outer loops' pointers address them.
                let vals = epilogue.eval(em, p, &[(red, v)])?;
                for (k, &o) in outputs.iter().enumerate() {
                    let x = *vals.get(&o).ok_or_else(|| format!("epilogue output {o} not computed"))?;
                    em.store(g.ty(o).dtype, x, p[n_in + k], n_in + k)?;
                }
                Ok(())
            })?;
        }
    }
    em.b.ins().return_(&[]);
    em.b.seal_all_blocks();
    em.b.finalize(config);
    Ok(LoweredKernel { func, rows, work })
}

/// Accumulator variables of a reduction.
struct Acc {
    a: Variable,
    b: Variable,
    m: Variable,
    /// `f32x4` partial sums of the vector loop (re, im).
    va: Variable,
    vb: Variable,
}

fn reduce_init(em: &mut Emitter, op: ReduceOp) -> Acc {
    let (ty, init) = match op {
        ReduceOp::Sum => (types::F64, 0.0),
        ReduceOp::Max | ReduceOp::MaxMag => (types::F32, f64::NEG_INFINITY),
    };
    let a = em.b.declare_var(ty);
    let b = em.b.declare_var(ty);
    let m = em.b.declare_var(types::F32);
    // Scalar accumulators even inside vector code (the vector sums are `va`/`vb`).
    let mi = em.b.ins().f32const(-1.0);
    let (x, z) = if ty == types::F64 {
        (em.b.ins().f64const(init), em.b.ins().f64const(0.0))
    } else {
        (em.b.ins().f32const(init as f32), em.b.ins().f32const(0.0))
    };
    em.b.def_var(a, x);
    em.b.def_var(b, z);
    em.b.def_var(m, mi);
    let va = em.b.declare_var(types::F32X4);
    let vb = em.b.declare_var(types::F32X4);
    let z32 = em.b.ins().f32const(0.0);
    let zv = em.b.ins().splat(types::F32X4, z32);
    em.b.def_var(va, zv);
    em.b.def_var(vb, zv);
    Acc { a, b, m, va, vb }
}

fn reduce_step(em: &mut Emitter, op: ReduceOp, acc: &Acc, x: V) {
    match op {
        ReduceOp::Sum if em.vec => {
            let (re, im) = match x {
                V::R(r) => (r, None),
                V::C(r, i) => (r, Some(i)),
            };
            let a = em.b.use_var(acc.va);
            let s = em.b.ins().fadd(a, re);
            em.b.def_var(acc.va, s);
            if let Some(im) = im {
                let b = em.b.use_var(acc.vb);
                let s = em.b.ins().fadd(b, im);
                em.b.def_var(acc.vb, s);
            }
        }
        ReduceOp::Sum => {
            let (re, im) = match x {
                V::R(r) => (r, None),
                V::C(r, i) => (r, Some(i)),
            };
            let a = em.b.use_var(acc.a);
            let r64 = em.b.ins().fpromote(types::F64, re);
            let s = em.b.ins().fadd(a, r64);
            em.b.def_var(acc.a, s);
            if let Some(im) = im {
                let b = em.b.use_var(acc.b);
                let i64v = em.b.ins().fpromote(types::F64, im);
                let s = em.b.ins().fadd(b, i64v);
                em.b.def_var(acc.b, s);
            }
        }
        ReduceOp::Max => {
            let r = match x {
                V::R(r) | V::C(r, _) => r,
            };
            let a = em.b.use_var(acc.a);
            let c = em.b.ins().fcmp(FloatCC::GreaterThan, r, a);
            let n = em.b.ins().select(c, r, a);
            em.b.def_var(acc.a, n);
        }
        ReduceOp::MaxMag => {
            let (re, im) = em.parts(x);
            let rr = em.b.ins().fmul(re, re);
            let mag = em.b.ins().fma(im, im, rr);
            let m = em.b.use_var(acc.m);
            let c = em.b.ins().fcmp(FloatCC::GreaterThan, mag, m);
            let (a, b) = (em.b.use_var(acc.a), em.b.use_var(acc.b));
            let nm = em.b.ins().select(c, mag, m);
            let na = em.b.ins().select(c, re, a);
            let nb = em.b.ins().select(c, im, b);
            em.b.def_var(acc.m, nm);
            em.b.def_var(acc.a, na);
            em.b.def_var(acc.b, nb);
        }
    }
}

/// The f64 sum of the four lanes of `f32x4` variable `v`.
fn hsum(em: &mut Emitter, v: Variable) -> ir::Value {
    let x = em.b.use_var(v);
    let mut s = em.b.ins().f64const(0.0);
    for l in 0..LANES as u8 {
        let e = em.b.ins().extractlane(x, l);
        let e = em.b.ins().fpromote(types::F64, e);
        s = em.b.ins().fadd(s, e);
    }
    s
}

fn reduce_finish(em: &mut Emitter, op: ReduceOp, acc: &Acc, complex: bool) -> V {
    if em.vec {
        // Vectorised over kept elements: each lane holds one output's sum.
        let a = em.b.use_var(acc.va);
        let b = em.b.use_var(acc.vb);
        return if complex { V::C(a, b) } else { V::R(a) };
    }
    if op == ReduceOp::Sum {
        for (scalar, vector) in [(acc.a, acc.va), (acc.b, acc.vb)] {
            let h = hsum(em, vector);
            let s = em.b.use_var(scalar);
            let t = em.b.ins().fadd(s, h);
            em.b.def_var(scalar, t);
        }
    }
    let a = em.b.use_var(acc.a);
    let b = em.b.use_var(acc.b);
    let (a, b) = if op == ReduceOp::Sum {
        (em.b.ins().fdemote(types::F32, a), em.b.ins().fdemote(types::F32, b))
    } else {
        (a, b)
    };
    if complex {
        V::C(a, b)
    } else {
        V::R(a)
    }
}
