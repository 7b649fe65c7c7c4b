//! cvc's runtime.
