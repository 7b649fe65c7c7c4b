//! State dicts in PyTorch's names and layouts, converted at the boundary.
//!
//! cvc names a layer's tensors `<binding>.<op>_<k>.<param>` (the `k`-th `op` of a binding),
//! which is already a PyTorch module path. Two things differ from `torch.nn` and are
//! converted here, both ways:
//! - `linear` stores its weight as `[in, out]` (the IR computes `x · W`); `torch.nn.Linear`
//!   keeps `[out, in]`: the weight is transposed.
//! - `batchnorm` on a real input calls its affine parameters `gamma`/`beta`;
//!   `torch.nn.BatchNorm*d` calls them `weight`/`bias`. (`layernorm` and `rmsnorm` already
//!   use PyTorch's names and layouts: torch.nn's for real inputs, complextorch's for complex.)
//!
//! Optimizer state (`<param>.<moment>`, `optimizer.*`) is left out of a module state dict
//! (as `torch.nn.Module.state_dict` leaves it out) unless asked for; it keeps cvc's names,
//! with moments in their parameter's PyTorch layout.

use cvc_runtime::backend::{HostData, HostTensor};

/// How one cvc leaf appears in a PyTorch state dict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TorchName {
    /// The PyTorch name.
    pub name: String,
    /// Whether the tensor is transposed (a `linear` weight, or a moment of one).
    pub transpose: bool,
}

/// The layer op of a `<binding>.<op>_<k>.<param>` name and the param part.
fn split(name: &str) -> Option<(&str, &str)> {
    let mut parts = name.splitn(3, '.');
    let (_binding, layer, param) = (parts.next()?, parts.next()?, parts.next()?);
    let (op, k) = layer.rsplit_once('_')?;
    k.parse::<usize>().ok()?;
    Some((op, param))
}

/// The PyTorch name and layout of cvc leaf `name`; `param_of` says whether a name is a
/// parameter (for optimizer moments `<param>.<suffix>`).
pub fn torch_name(name: &str, is_param: &dyn Fn(&str) -> bool) -> TorchName {
    if !is_param(name) {
        if let Some((p, _suffix)) = name.rsplit_once('.') {
            if is_param(p) {
                let of = torch_name(p, is_param);
                return TorchName { name: name.to_string(), transpose: of.transpose };
            }
        }
    }
    match split(name) {
        Some(("linear", "weight")) => TorchName { name: name.to_string(), transpose: true },
        Some(("batchnorm", p @ ("gamma" | "beta"))) => {
            let prefix = &name[..name.len() - p.len()];
            let torch = if p == "gamma" { "weight" } else { "bias" };
            TorchName { name: format!("{prefix}{torch}"), transpose: false }
        }
        _ => TorchName { name: name.to_string(), transpose: false },
    }
}

/// Whether leaf `name` is optimizer state: `optimizer.*`, or a moment `<param>.<suffix>`.
pub fn is_optimizer_state(name: &str, is_param: &dyn Fn(&str) -> bool) -> bool {
    name.starts_with("optimizer.")
        || (!is_param(name) && name.rsplit_once('.').is_some_and(|(p, _)| is_param(p)))
}

/// The 2-D transpose of `t` (complex elements move as pairs); other ranks unchanged.
pub fn transpose(t: &HostTensor) -> HostTensor {
    let [r, c] = t.shape[..] else { return t.clone() };
    let data = match &t.data {
        HostData::F32(v) => {
            let w = v.len() / (r * c).max(1);
            let mut out = vec![0.0f32; v.len()];
            for i in 0..r {
                for j in 0..c {
                    let (src, dst) = ((i * c + j) * w, (j * r + i) * w);
                    out[dst..dst + w].copy_from_slice(&v[src..src + w]);
                }
            }
            HostData::F32(out)
        }
        HostData::I32(v) => {
            let mut out = vec![0i32; v.len()];
            for i in 0..r {
                for j in 0..c {
                    out[j * r + i] = v[i * c + j];
                }
            }
            HostData::I32(out)
        }
    };
    HostTensor { dtype: t.dtype, shape: vec![c, r], data }
}
