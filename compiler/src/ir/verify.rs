//! IR verifier: operands precede users, types match inference, assigns are never read.

use super::builder::infer;
use super::*;

/// Checks the IR invariants listed in the module doc of [`crate::ir`].
pub fn verify(g: &Graph) -> Result<(), String> {
    let mut assigned = vec![false; g.nodes.len()];
    for (h, n) in g.nodes.iter() {
        for &i in &n.inputs {
            if i >= h {
                return Err(format!("{h}: operand {i} does not precede its user"));
            }
            if assigned[i.index()] {
                return Err(format!("{h}: reads the result of assign {i}"));
            }
        }
        if matches!(n.op, Op::Assign) {
            assigned[h.index()] = true;
            if !g.node(n.inputs[0]).op.is_persistent() {
                return Err(format!("{h}: assign target {} is not a param or state", n.inputs[0]));
            }
        }
        if n.op.is_leaf() && !matches!(n.op, Op::Scalar { .. }) {
            continue;
        }
        let tys: Vec<&TensorType> = n.inputs.iter().map(|&i| g.ty(i)).collect();
        let ty = infer(&n.op, &tys, Some(&n.ty.shape)).map_err(|e| format!("{h}: {e}"))?;
        if ty != n.ty {
            return Err(format!("{h}: type {} but its op infers {ty}", n.ty));
        }
    }
    for o in &g.outputs {
        if o.value.index() >= g.nodes.len() {
            return Err(format!("output {} is dangling", o.name));
        }
    }
    Ok(())
}
