//! CPU code generation: each `Elementwise`/`Reduce` kernel group of a [`Program`] becomes one
//! Cranelift function (see [`lower`]); the runtime JIT-compiles them (`runtime/src/cpu`).
//! Contractions, FFTs and data movement run as native Rust in the runtime instead.

pub mod helpers;
pub mod lower;

use crate::passes::fusion::GroupKind;
use crate::passes::Program;
use cranelift_codegen::ir::{ExtFuncData, ExternalName, Function};
use cranelift_codegen::isa::TargetFrontendConfig;
use helpers::Helper;
use std::fmt::Write as _;

/// Whether group kind `k` is compiled to a Cranelift loop kernel.
pub fn is_loop_kernel(k: GroupKind) -> bool {
    matches!(k, GroupKind::Elementwise | GroupKind::Reduce)
}

/// The frontend configuration of the host's ISA (calling convention, pointer width).
pub fn host_config() -> Result<TargetFrontendConfig, String> {
    let builder = cranelift_codegen::isa::lookup_by_name(std::env::consts::ARCH)
        .map_err(|e| format!("no Cranelift back end for {}: {e}", std::env::consts::ARCH))?;
    let flags = cranelift_codegen::settings::Flags::new(cranelift_codegen::settings::builder());
    let isa = builder.finish(flags).map_err(|e| format!("Cranelift ISA: {e}"))?;
    Ok(isa.frontend_config())
}

/// Imports `h` into `func` under its symbol name (used for the text form).
fn import_by_symbol(func: &mut Function, h: Helper) -> cranelift_codegen::ir::FuncRef {
    let cc = func.signature.call_conv;
    let sig = func.import_signature(h.signature(cc));
    func.import_function(ExtFuncData {
        name: ExternalName::testcase(h.symbol()),
        signature: sig,
        colocated: false,
        patchable: false,
    })
}

/// The Cranelift IR of every loop kernel of `program`, in schedule order, each preceded by a
/// comment naming its group and nodes.
pub fn emit_text(program: &Program) -> Result<String, String> {
    let mut out = String::new();
    let config = host_config()?;
    for &gid in &program.order {
        let grp = &program.groups[gid];
        if !is_loop_kernel(grp.kind) {
            continue;
        }
        let k = lower::lower_group(program, gid, config, &mut import_by_symbol)?;
        let nodes: Vec<String> =
            grp.nodes.iter().map(|&v| format!("{v}={}", program.graph.node(v).op.mnemonic())).collect();
        let _ = writeln!(out, "; group {gid} ({:?}, {} rows): {}", grp.kind, k.rows, nodes.join(" "));
        let _ = writeln!(out, "{}", k.func.display());
    }
    Ok(out)
}
