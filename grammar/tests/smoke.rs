//! Parses the ring allreduce and a few tricky forms.
use collc_grammar::{parse, Limits};

#[test]
fn ring_parses() {
    let src =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../algorithms/allreduce/ring.coll")).unwrap();
    let file = parse(&src, &Limits::default()).unwrap();
    assert_eq!(file.algorithm.name.name, "ring");
    assert_eq!(file.doc.len(), 2);
    assert_eq!(file.algorithm.items.len(), 4);
}

#[test]
fn keyword_prefix_is_a_name() {
    let src = "algorithm a for allreduce { ranks p let ranksp = 1 fn f(x) = if x < 2 { x } else { f(x - 1) } }";
    let file = parse(src, &Limits::default()).unwrap();
    assert_eq!(file.algorithm.items.len(), 3);
}

#[test]
fn syntax_error_names_what_was_expected() {
    let err = parse("algorithm a for allreduce { send in[0] frm 0 to 1 }", &Limits::default()).unwrap_err();
    assert!(err.message.contains("`from`"), "{}", err.message);
}
