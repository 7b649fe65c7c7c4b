//! What the values of a compiled program hold, for memory reports: the kind of each stored
//! buffer (`cvc plan`, the arena timeline) and the source line it comes from. Shared by the
//! command line and the timeline, so neither imports the other.

use cvc_compiler::ir::{Graph, Role, Value};
use cvc_compiler::passes::Program;
use cvc_grammar::LineIndex;

/// 1-based source line of a value (0 when it has no span); `lines` indexes the source.
pub fn line_of(g: &Graph, v: Value, lines: &LineIndex) -> usize {
    let sp = g.span(v);
    if sp.end == 0 || sp.end as usize > lines.text_len() {
        return 0;
    }
    lines.line(sp.start as usize)
}

/// What a buffer holds, for reports and the timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum BufferKind {
    /// A trainable parameter.
    Param,
    /// The gradient of a parameter.
    Gradient,
    /// Optimizer moments, running statistics, counters.
    OptimizerState,
    /// A data input or forward activation.
    Activation,
    /// A backward or optimizer temporary.
    BackwardTemp,
}

impl BufferKind {
    /// Label for legends.
    pub fn name(self) -> &'static str {
        match self {
            BufferKind::Param => "parameter",
            BufferKind::Gradient => "gradient",
            BufferKind::OptimizerState => "optimizer state",
            BufferKind::Activation => "forward activation",
            BufferKind::BackwardTemp => "backward temporary",
        }
    }
    /// Classifies value `v` of a compiled program.
    pub fn of(p: &Program, v: Value) -> BufferKind {
        if p.facts.grads.iter().any(|&(_, d)| d == v) {
            return BufferKind::Gradient;
        }
        match p.graph.node(v).origin.role {
            Role::Param => BufferKind::Param,
            Role::State => BufferKind::OptimizerState,
            Role::Input | Role::Forward => BufferKind::Activation,
            Role::Backward | Role::Update => BufferKind::BackwardTemp,
        }
    }
}
