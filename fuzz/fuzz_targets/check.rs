//! Fuzz target: the whole front end (UTF-8 check, parser, resolver, lowering, train
//! section) on arbitrary bytes. Any panic is a bug; diagnostics must render.
#![no_main]

use cvc_compiler::front::{check_bytes, render_all};
use cvc_compiler::ir::Mode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for mode in [Mode::Train, Mode::Eval] {
        if let Err(diags) = check_bytes("fuzz.cvnn", data, mode) {
            let src = String::from_utf8_lossy(data);
            let _ = render_all("fuzz.cvnn", &src, &diags, false);
        }
    }
});
