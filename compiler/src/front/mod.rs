//! Front end: resolve names, expand blocks, check arguments, infer shapes and dtypes, lower to IR.
//!
//! [`check_source`] runs the whole front end on `.cvnn` text: `cvc_grammar::parse` → pick
//! the model ([`resolve`]) → [`lower`] (compile-time values, block expansion, one
//! [`layers::lower_layer`] call per operator) → [`train_check`] for the `train` section.
//!
//! ```
//! use cvc_compiler::front::check_source;
//! use cvc_compiler::ir::Mode;
//! let src = "model M {\n input x: c64[B, 8]\n y = x |> crelu\n output y\n}\n";
//! let checked = check_source("m.cvnn", src, Mode::Eval).unwrap();
//! assert_eq!(checked.graph.outputs[0].name, "y");
//! ```

pub mod check;
pub mod combinators;
pub mod layers;
pub mod limits;
pub mod lower;
pub mod resolve;
pub mod train;
pub mod train_check;

pub use check::{check_bytes, check_file, check_source, render_all};
pub use train::TrainConfig;

use crate::ir::{DType, Graph, Shape, TensorType, Value};
use cvc_grammar::Span;

/// A declared model input.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelInput {
    /// The input's name.
    pub name: String,
    /// Its type (class labels are i32 `[B]`).
    pub ty: TensorType,
    /// The class count of a `class[B] of N` input.
    pub classes: Option<usize>,
    /// The `ignore_index` a class loss (`cross_entropy`, `dice`) reads these labels with: the
    /// one label value admitted besides `0..classes`, skipped by the segmentation metrics.
    pub ignore_index: Option<i64>,
    /// The declaration.
    pub span: Span,
    /// The `Op::Input` leaf in the graph.
    pub value: Value,
}

/// One row of the `cvc check` layer table: an input or one operator application.
#[derive(Clone, Debug, PartialEq)]
pub struct TableRow {
    /// `<binding>/<op>` (or the input's name).
    pub label: String,
    /// The call with its arguments evaluated, e.g. `conv2d(32, kernel = 3, pad = 1)`.
    pub op: String,
    /// Output shape (batch symbolic).
    pub shape: Shape,
    /// Output dtype.
    pub dtype: DType,
    /// Complex scalars among the parameters this row created.
    pub params_complex: usize,
    /// Real scalars among the parameters this row created (2 per complex one).
    pub params_real: usize,
    /// 1-based source line.
    pub line: usize,
}

/// A checked model: its graph, inputs, parameters, layer table and training settings.
#[derive(Clone, Debug)]
pub struct Checked {
    /// The file name diagnostics use.
    pub file: String,
    /// The source text.
    pub src: String,
    /// The checked model's name.
    pub model: String,
    /// The lowered graph (outputs and loss set).
    pub graph: Graph,
    /// Declared inputs in source order.
    pub inputs: Vec<ModelInput>,
    /// Parameters in creation order.
    pub params: Vec<layers::ParamInfo>,
    /// One row per input and operator application.
    pub table: Vec<TableRow>,
    /// The train section's settings (defaults when there is none).
    pub train: TrainConfig,
    /// Whether the file has a train section.
    pub has_train_section: bool,
    /// Warnings about a source that compiles (bindings and outputs that reach no loss).
    pub warnings: Vec<crate::diag::Diagnostic>,
}
