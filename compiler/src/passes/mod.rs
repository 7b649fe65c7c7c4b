//! The pass pipeline. Every pass is a file of its own; [`pipeline::compile`] runs them in order
//! and verifies the IR after each one in debug builds.

pub mod autodiff;
pub mod cast;
pub mod distribute;
pub mod fusion;
pub mod liveness;
pub mod memplan;
pub mod optimizer;
pub mod pipeline;
pub mod remat;
pub mod rewrite;
pub mod schedule;
pub mod siblings;
pub mod views;

use crate::ir::*;
use fusion::{GroupId, KernelGroup};
use memplan::ArenaPlan;
use serde::Serialize;

/// A real→complex cast the compiler placed (or folded into its consumer).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CastSite {
    /// The `ToComplex` node, or the consumer it was folded into; `None` once a later rewrite
    /// merged that node into another (a view hoisting the consumer, a distributed sum).
    pub value: Option<Value>,
    /// Source line (filled in by [`PipelineFacts::set_lines`]; 0 until then).
    pub line: usize,
    /// Source span of the cast or of the consumer it was folded into.
    pub span: cvc_grammar::Span,
    /// What happened: `folded into conv2d`, `materialised before fft`, ...
    pub what: String,
}

/// Facts the passes report, for `cvc plan` and the tests.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PipelineFacts {
    /// Pass names in the order they ran.
    pub passes: Vec<String>,
    /// Casts placed or folded.
    pub casts: Vec<CastSite>,
    /// `(param, grad)` pairs from autodiff.
    pub grads: Vec<(Value, Value)>,
    /// Real/imag combines whose parts were stored separately and copied (must be 0).
    pub combines_materialized: usize,
    /// Values recomputed instead of stored (rematerialisation), with why.
    pub recomputed: Vec<(Value, String)>,
    /// The chunk length of chunked back-propagation through time, when some recurrence's
    /// backward runs in chunks (see `autodiff::run_chunked`).
    pub rnn_chunk: Option<usize>,
}

impl PipelineFacts {
    /// The parameter gradients: values every rewrite keeps and the memory plan keeps stored
    /// to the step's end (the runtime reads them back), even when no update reads them.
    pub fn kept(&self) -> Vec<Value> {
        self.grads.iter().map(|&(_, d)| d).collect()
    }

    /// Rewrites the recorded values through the map of a rewrite. A parameter or gradient
    /// without a counterpart is an internal error; a cast site or recomputed value whose node
    /// the rewrite removed keeps no value (a cast site stays reported: the cast still happens,
    /// inside the rewritten consumer) or is no longer reported (a recomputed value).
    pub fn remap(&mut self, map: &rewrite::ValueMap) -> Result<(), String> {
        for (p, d) in &mut self.grads {
            *d = map.get(*d).map_err(|e| format!("the gradient of parameter {p}: {e}"))?;
            *p = map.get(*p).map_err(|e| format!("parameter {p}: {e}"))?;
        }
        for c in &mut self.casts {
            c.value = c.value.and_then(|v| map.lookup(v));
        }
        self.recomputed.retain_mut(|(v, _)| match map.lookup(*v) {
            Some(n) => {
                *v = n;
                true
            }
            None => false,
        });
        Ok(())
    }

    /// Fills in the source line of every reported site from the `.cvnn` text.
    pub fn set_lines(&mut self, src: &str) {
        for c in &mut self.casts {
            if c.span.end > 0 && (c.span.end as usize) <= src.len() {
                c.line = c.span.line_col(src).0;
            }
        }
    }
}

/// A compiled program: the final graph, its kernel groups in schedule order, the memory plan.
#[derive(Clone, Debug)]
pub struct Program {
    /// The graph after all passes.
    pub graph: Graph,
    /// Kernel groups.
    pub groups: Vec<KernelGroup>,
    /// Execution order: indices into `groups`.
    pub order: Vec<GroupId>,
    /// Static memory plan.
    pub plan: ArenaPlan,
    /// What the passes did.
    pub facts: PipelineFacts,
}

impl Program {
    /// Groups in execution order.
    pub fn scheduled(&self) -> impl Iterator<Item = &KernelGroup> {
        self.order.iter().map(|&i| &self.groups[i])
    }
}
