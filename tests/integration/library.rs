//! The algorithm library as data: each `algorithms/**/*.coll` is named after what it declares, verifies for every
//! rank count from 2 to 16 in both placements (and with the last rank as root), and its `.sched` text at 2, 3 and 4
//! ranks is an insta snapshot, so any change to lowering, scheduling or fusion shows up in review.

use crate::corpus::{self, render_all};
use collc_compiler::emit::write_sched;
use collc_compiler::{compile, Bindings, Collective, Limits, Options, Placement};

/// Rank counts every library algorithm must verify for here; `collc check` covers 2..=64.
const RANKS: std::ops::RangeInclusive<u32> = 2..=16;

/// Whether the algorithm's collective has a root, so that it is also checked with a root other than 0.
fn has_root(source: &str) -> bool {
    let file = collc_grammar::parse(source, &Default::default()).expect("the library parses");
    matches!(
        file.algorithm.collective.name.parse(),
        Ok(Collective::Broadcast
            | Collective::Reduce
            | Collective::Gather
            | Collective::Scatter
            | Collective::SendRecv)
    )
}

#[test]
fn every_algorithm_verifies_for_2_to_16_ranks_in_both_placements() {
    let limits = Limits::default();
    let mut failures = Vec::new();
    let mut verified = 0;
    for algo in corpus::library() {
        let rooted = has_root(&algo.text);
        for n_ranks in RANKS {
            let file = collc_grammar::parse(&algo.text, &Default::default()).expect("the library parses");
            // Every node split of n_ranks, for an algorithm that declares one.
            let mut bindings: Vec<Bindings> = match collc_compiler::lower::node_split(&file.algorithm) {
                Some(_) => (1..=n_ranks)
                    .filter(|g| n_ranks % g == 0)
                    .map(|g| Bindings::ranks(n_ranks).with_default_split(&file.algorithm, g))
                    .collect(),
                None => vec![Bindings::ranks(n_ranks)],
            };
            if rooted {
                bindings.push(Bindings { root: Some(n_ranks - 1), ..Bindings::ranks(n_ranks) });
            }
            for binding in &bindings {
                for placement in Placement::BOTH {
                    match compile(&algo.text, binding, Options::placed(placement), &limits) {
                        Ok(_) => verified += 1,
                        Err(errors) => failures.push(format!(
                            "{} p={n_ranks} root={:?} {placement}:\n{}",
                            algo.name,
                            binding.root,
                            render_all(&errors, &algo.name, &algo.text)
                        )),
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} library builds failed:\n{}", failures.len(), failures.join("\n"));
    assert!(verified >= 2 * RANKS.count(), "only {verified} builds verified");
}

#[test]
fn every_algorithm_is_named_after_its_file() {
    for algo in corpus::library() {
        let sched = compile(&algo.text, &corpus::bindings(&algo.text, 4), Options::default(), &Limits::default())
            .unwrap_or_else(|e| panic!("{}:\n{}", algo.name, render_all(&e, &algo.name, &algo.text)));
        let expected = format!("{}/{}", sched.collective, sched.algorithm);
        assert_eq!(
            algo.name, expected,
            "{} declares `algorithm {} for {}`",
            algo.name, sched.algorithm, sched.collective
        );
    }
}

#[test]
fn every_algorithm_has_a_doc_comment() {
    for algo in corpus::library() {
        let file = collc_grammar::parse(&algo.text, &Default::default()).expect("the library parses");
        assert!(!file.doc.is_empty(), "{} has no `##` doc comment for `collc list`", algo.name);
    }
}

/// `.sched` text at 2, 3 and 4 ranks, out of place, each section headed by its rank count.
fn schedules_text(source: &str, name: &str) -> String {
    let mut text = String::new();
    for n_ranks in [2, 3, 4] {
        let sched = compile(source, &corpus::bindings(source, n_ranks), Options::default(), &Limits::default())
            .unwrap_or_else(|e| panic!("{name} at {n_ranks} ranks:\n{}", render_all(&e, name, source)));
        text.push_str(&format!("## ranks {n_ranks}\n{}", write_sched(&sched, source)));
    }
    text
}

#[test]
fn schedules_match_snapshots() {
    insta::glob!("../../algorithms", "**/*.coll", |path| {
        let source = std::fs::read_to_string(path).expect("readable algorithm");
        let name = path.file_name().expect("a file").to_string_lossy();
        insta::assert_snapshot!(schedules_text(&source, &name));
    });
}
