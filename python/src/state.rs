//! State dicts in PyTorch's names, converted at the boundary.
//!
//! cvc names a layer's tensors `<binding>.<op>_<k>.<param>` (the `k`-th `op` of a binding),
//! which is already a PyTorch module path, and stores every tensor in PyTorch's layout (a
//! `linear` weight is `[out, in]`, as `torch.nn.Linear`'s). One thing differs from
//! `torch.nn` and is converted here, both ways: `batchnorm` on a real input calls its affine
//! parameters `gamma`/`beta`; `torch.nn.BatchNorm*d` calls them `weight`/`bias`.
//! (`layernorm` and `rmsnorm` already use PyTorch's names and layouts: torch.nn's for real
//! inputs, complextorch's for complex.)
//!
//! Optimizer state (`<param>.<moment>`, `optimizer.*`) is left out of a module state dict
//! (as `torch.nn.Module.state_dict` leaves it out) unless asked for; it keeps cvc's names.

/// The layer op of a `<binding>.<op>_<k>.<param>` name and the param part.
fn split(name: &str) -> Option<(&str, &str)> {
    let mut parts = name.splitn(3, '.');
    let (_binding, layer, param) = (parts.next()?, parts.next()?, parts.next()?);
    let (op, k) = layer.rsplit_once('_')?;
    k.parse::<usize>().ok()?;
    Some((op, param))
}

/// The PyTorch name of cvc leaf `name`; `is_param` says whether a name is a parameter
/// (optimizer moments `<param>.<suffix>` keep cvc's names).
pub fn torch_name(name: &str, is_param: &dyn Fn(&str) -> bool) -> String {
    if !is_param(name) && name.rsplit_once('.').is_some_and(|(p, _)| is_param(p)) {
        return name.to_string();
    }
    match split(name) {
        Some(("batchnorm", p @ ("gamma" | "beta"))) => {
            let prefix = &name[..name.len() - p.len()];
            let torch = if p == "gamma" { "weight" } else { "bias" };
            format!("{prefix}{torch}")
        }
        _ => name.to_string(),
    }
}

/// Whether leaf `name` is optimizer state: `optimizer.*`, or a moment `<param>.<suffix>`.
pub fn is_optimizer_state(name: &str, is_param: &dyn Fn(&str) -> bool) -> bool {
    name.starts_with("optimizer.")
        || (!is_param(name) && name.rsplit_once('.').is_some_and(|(p, _)| is_param(p)))
}
