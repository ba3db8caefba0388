//! Data-driven fixtures. Each file's header comment says how to run it:
//!
//! ```text
//! # test: ranks=2,3,4,8 root=1
//! # test: ranks=4 error=collc::verify::postcondition
//! ```
//!
//! `tests/fixtures/ok/*.coll` must compile and verify for every listed rank count in both placements;
//! `tests/fixtures/err/*.coll` must fail for every listed rank count in both placements, every error carrying the
//! header's code, and the rendered diagnostics (out of place) are insta snapshots; so must
//! `tests/fixtures/sched/*.sched`, schedules only the verifier can reject. A new test is a new file.

use crate::corpus::{self, render_all};
use crate::oracle;
use collc_compiler::sched::{BufId, MAX_SPANS};
use collc_compiler::{compile, lower, Bindings, Limits, Options, Placement};
use std::path::Path;

/// What a fixture's `# test:` line asks for.
#[derive(Debug, PartialEq)]
pub struct Header {
    pub ranks: Vec<u32>,
    pub root: Option<u32>,
    pub error: Option<String>,
}

/// Reads `# test: key=value ...` from the first line that has it. Ranks are `2,3,8` or `2..=8` or both.
pub fn header(file_name: &str, source: &str) -> Header {
    let line = source
        .lines()
        .find_map(|l| l.trim().strip_prefix("# test:"))
        .unwrap_or_else(|| panic!("{file_name} has no `# test: ranks=...` header"));
    let mut header = Header { ranks: Vec::new(), root: None, error: None };
    for word in line.split_whitespace() {
        let (key, value) = word.split_once('=').unwrap_or_else(|| panic!("{file_name}: `{word}` is not KEY=VALUE"));
        let number = |text: &str| text.parse::<u32>().unwrap_or_else(|_| panic!("{file_name}: `{text}` is no number"));
        match key {
            "ranks" => {
                for part in value.split(',') {
                    match part.split_once("..=") {
                        Some((a, b)) => header.ranks.extend(number(a)..=number(b)),
                        None => header.ranks.push(number(part)),
                    }
                }
            }
            "root" => header.root = Some(number(value)),
            "error" => header.error = Some(value.to_string()),
            _ => panic!("{file_name}: unknown header key `{key}`"),
        }
    }
    assert!(!header.ranks.is_empty(), "{file_name}: the header lists no rank counts");
    header
}

pub fn bindings(header: &Header, n_ranks: u32) -> Bindings {
    Bindings { root: header.root, ..Bindings::ranks(n_ranks) }
}

#[test]
fn headers_parse() {
    let parsed = header("x.coll", "## doc\n# test: ranks=2,4..=6 root=1 error=collc::syntax\n");
    assert_eq!(parsed, Header { ranks: vec![2, 4, 5, 6], root: Some(1), error: Some("collc::syntax".to_string()) });
}

#[test]
fn ok_fixtures_verify_in_both_placements() {
    let limits = Limits::default();
    let mut failures = Vec::new();
    let fixtures = corpus::coll_files(&corpus::fixtures_dir("ok"));
    for fixture in &fixtures {
        let file_name = format!("{}.coll", fixture.name);
        let header = header(&file_name, &fixture.text);
        assert_eq!(header.error, None, "{file_name}: an ok fixture must not expect an error");
        for &n_ranks in &header.ranks {
            for placement in Placement::BOTH {
                let options = Options::placed(placement);
                if let Err(errors) = compile(&fixture.text, &bindings(&header, n_ranks), options, &limits) {
                    let rendered = render_all(&errors, &file_name, &fixture.text);
                    failures.push(format!("{file_name} p={n_ranks} {placement}:\n{rendered}"));
                }
            }
        }
    }
    assert!(fixtures.len() >= 5, "expected at least 5 ok fixtures, found {}", fixtures.len());
    assert!(failures.is_empty(), "{} ok fixtures failed:\n{}", failures.len(), failures.join("\n"));
}

/// Compiles one err fixture for every listed rank count and placement; returns the out-of-place diagnostics.
fn failure_report(path: &Path) -> String {
    let source = std::fs::read_to_string(path).expect("readable fixture");
    let file_name = path.file_name().expect("a file").to_string_lossy().into_owned();
    let header = header(&file_name, &source);
    let code = header.error.clone().unwrap_or_else(|| panic!("{file_name}: an err fixture needs `error=CODE`"));
    let mut report = String::new();
    for &n_ranks in &header.ranks {
        for placement in Placement::BOTH {
            let options = Options::placed(placement);
            let Err(errors) = compile(&source, &bindings(&header, n_ranks), options, &Limits::default()) else {
                panic!("{file_name} p={n_ranks} {placement} verified, but it must fail with {code}");
            };
            let codes: Vec<&str> = errors.0.iter().map(|e| e.code).collect();
            assert!(
                codes.iter().all(|c| *c == code),
                "{file_name} p={n_ranks} {placement}: codes {codes:?}, not {code}"
            );
            if placement == Placement::OutOfPlace {
                report.push_str(&format!("## ranks {n_ranks}\n{}", render_all(&errors, &file_name, &source)));
            }
        }
    }
    report
}

#[test]
fn err_fixtures_fail_with_their_code() {
    insta::glob!("../fixtures/err", "*.coll", |path| {
        insta::assert_snapshot!(failure_report(path));
    });
}

/// `tests/fixtures/sched/*.sched`: hand-written schedules (as `collc build --emit sched` prints them) that only the
/// verifier can reject: no `.coll` program lowers to them. Each must fail with the code in its header.
fn sched_failure_report(path: &Path) -> (String, String) {
    let text = std::fs::read_to_string(path).expect("readable fixture");
    let file_name = path.file_name().expect("a file").to_string_lossy().into_owned();
    let code = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("# test: error="))
        .unwrap_or_else(|| panic!("{file_name} has no `# test: error=CODE` header"))
        .trim()
        .to_string();
    let (sched, lines) =
        collc_compiler::emit::parse_sched_located(&text).unwrap_or_else(|e| panic!("{file_name} does not parse: {e}"));
    let Err(errors) = collc_compiler::verify_sched(sched, &text, &lines, &Limits::default()) else {
        panic!("{file_name} verified, but it must fail with {code}");
    };
    let codes: Vec<&str> = errors.0.iter().map(|e| e.code).collect();
    assert!(codes.iter().all(|c| *c == code), "{file_name}: codes {codes:?}, not {code}");
    // Diagnostics point at the schedule's own lines, not at the `.coll` source it was built from.
    (code, render_all(&errors, &file_name, &text))
}

#[test]
fn sched_fixtures_fail_with_their_code() {
    insta::glob!("../fixtures/sched", "*.sched", |path| {
        insta::assert_snapshot!(sched_failure_report(path).1);
    });
}

fn sched_fixture_codes() -> Vec<String> {
    let dir = corpus::fixtures_dir("sched");
    let mut paths: Vec<_> =
        std::fs::read_dir(&dir).expect("fixtures/sched exists").flatten().map(|e| e.path()).collect();
    paths.retain(|p| p.extension().is_some_and(|e| e == "sched"));
    paths.iter().map(|p| sched_failure_report(p).0).collect()
}

#[test]
fn err_fixtures_cover_every_stage() {
    let fixtures = corpus::coll_files(&corpus::fixtures_dir("err"));
    let mut codes: Vec<String> = fixtures.iter().filter_map(|f| header(&f.name, &f.text).error).collect();
    codes.extend(sched_fixture_codes());
    for code in [
        "collc::syntax",
        "collc::lower::name",
        "collc::lower::bounds",
        "collc::lower::where",
        "collc::lower::arithmetic",
        "collc::lower::limit",
        "collc::lower::race",
        "collc::verify::deadlock",
        "collc::verify::postcondition",
        "collc::verify::matching",
        "collc::verify::race",
        "collc::verify::bounds",
    ] {
        assert!(codes.iter().any(|c| c == code), "no err fixture expects {code}");
    }
}

/// The mutation suite's oracle agrees with the verifier here: every ok fixture is correct, and every fixture that
/// fails the postcondition computes something else.
#[test]
fn oracle_agrees_with_fixtures() {
    let mut judged = 0;
    for (kind, correct) in [("ok", true), ("err", false)] {
        for fixture in corpus::coll_files(&corpus::fixtures_dir(kind)) {
            let header = header(&fixture.name, &fixture.text);
            if !correct && header.error.as_deref() != Some("collc::verify::postcondition") {
                continue;
            }
            for &n_ranks in &header.ranks {
                for placement in Placement::BOTH {
                    // Fixtures that do not lower are reported by the tests above.
                    let Ok(sched) = corpus::unverified(&fixture.text, &bindings(&header, n_ranks), placement) else {
                        continue;
                    };
                    let verdict = oracle::judge(&sched, u64::from(n_ranks));
                    assert_eq!(
                        verdict.is_ok(),
                        correct,
                        "{kind}/{} p={n_ranks} {placement}: {verdict:?}",
                        fixture.name
                    );
                    judged += 1;
                }
            }
        }
    }
    assert!(judged >= 20, "only {judged} fixture schedules judged");
}

/// A schedule names a buffer with one byte and a source span with two: a scratch buffer or a transfer statement
/// past those limits is a lowering error at its declaration, never an id that wraps around.
#[test]
fn buffer_and_statement_limits_are_lowering_errors() {
    let lowering_error = |source: &str, limits: &Limits| -> collc_compiler::Error {
        let file = collc_grammar::parse(source, &limits.syntax).expect("parses");
        let errors = lower(&file, &Bindings::ranks(2), limits).expect_err("past the limit");
        errors.0.into_iter().next().expect("one error")
    };
    let frame = |body: &str| format!("algorithm many for allgather {{\n    ranks p where p == 2\n{body}}}\n");
    let scratch: String = (0..=BufId::MAX_SCRATCH).map(|i| format!("    scratch s{i}[1]\n")).collect();
    let source = frame(&scratch);
    let error = lowering_error(&source, &Limits::default());
    assert_eq!(error.code, "collc::lower::scratch", "{}", error.message);
    let last = source.find(&format!("scratch s{}[", BufId::MAX_SCRATCH)).expect("declared");
    assert_eq!(error.labels[0].0.start as usize, last, "the error points at the first declaration past the limit");
    // Fits once one declaration fewer.
    let fewer: String = (0..BufId::MAX_SCRATCH).map(|i| format!("    scratch s{i}[1]\n")).collect();
    let file = collc_grammar::parse(&frame(&fewer), &Limits::default().syntax).expect("parses");
    assert!(lower(&file, &Bindings::ranks(2), &Limits::default()).is_ok());

    let statements: String = (0..MAX_SPANS).map(|_| "    send in[0] from 0 to 1 as out[0]\n").collect();
    let mut limits = Limits::default();
    limits.syntax.max_source_bytes = 64 << 20;
    let source = frame(&statements);
    let error = lowering_error(&source, &limits);
    assert_eq!(error.code, "collc::lower::limit", "{}", error.message);
    assert!(error.message.contains(&format!("more than {} transfer statements", MAX_SPANS - 1)), "{}", error.message);
}
