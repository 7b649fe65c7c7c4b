//! Documentation the code generates: the operator table of `docs/LANGUAGE.md` must be the one
//! rendered from the operator signatures (`front::layers::operator_table_markdown`).
//! `CVC_BLESS=1 cargo test -p cvc-compiler --test docs` rewrites it in place.

use std::path::Path;

const BEGIN: &str = "<!-- operator table: generated from compiler/src/front/layers/ (CVC_BLESS=1 cargo test -p cvc-compiler --test docs) -->\n";
const END: &str = "<!-- end of operator table -->\n";

#[test]
fn language_doc_operator_table_is_generated() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/LANGUAGE.md");
    let doc = std::fs::read_to_string(&path).expect("docs/LANGUAGE.md reads");
    let (Some(b), Some(e)) = (doc.find(BEGIN), doc.find(END)) else {
        panic!("docs/LANGUAGE.md lacks the operator table markers:\n{BEGIN}{END}");
    };
    assert!(b < e, "operator table markers out of order");
    let current = &doc[b + BEGIN.len()..e];
    let want = cvc_compiler::front::layers::operator_table_markdown();
    // Operators and arguments the hand-written table used to miss.
    for word in ["`fft2(", "`ifft2(", "norm =", "init"] {
        assert!(want.contains(word), "the rendered table lacks {word}:\n{want}");
    }
    if current == want {
        return;
    }
    if std::env::var("CVC_BLESS").is_ok_and(|v| v == "1") {
        let new = format!("{}{want}{}", &doc[..b + BEGIN.len()], &doc[e..]);
        std::fs::write(&path, new).expect("docs/LANGUAGE.md writes");
        return;
    }
    panic!(
        "docs/LANGUAGE.md's operator table differs from the operator signatures; run\n  \
         CVC_BLESS=1 cargo test -p cvc-compiler --test docs\n--- in the doc\n{current}--- rendered\n{want}"
    );
}
