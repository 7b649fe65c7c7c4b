//! Front end: resolve names, expand blocks, check arguments, infer shapes and dtypes, lower to IR.

pub mod layers;
pub mod train;
