//! MSCCL XML: every real file of `tests/fixtures/msccl` imports and verifies; hand-broken ones are refused with the
//! thread block and step at fault; mutated files never panic the importer or the verifier; every library algorithm
//! exports for both targets at several rank counts and the file re-imports and verifies; a target's limits are
//! diagnosed at the `.coll` line.

use crate::corpus::{self, render_all};
use collc_compiler::msccl::{self, Target};
use collc_compiler::{compile, Bindings, Collective, Errors, Limits, Options, Placement, Verdict};
use std::path::PathBuf;

fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/msccl")
}

fn corpus_files() -> Vec<(String, String)> {
    let mut files = Vec::new();
    for dir in ["mscclang", "rccl"] {
        for entry in std::fs::read_dir(fixtures_dir().join(dir)).expect("the corpus is there") {
            let path = entry.expect("a directory entry").path();
            let name = format!("{dir}/{}", path.file_name().unwrap().to_string_lossy());
            files.push((name, std::fs::read_to_string(&path).expect("the file reads")));
        }
    }
    files.sort();
    files
}

fn import_and_verify(text: &str) -> Result<collc_compiler::VerifiedSchedule, Errors> {
    let limits = Limits::default();
    let imported = msccl::import(text, &limits)?;
    msccl::verify(imported, text, &limits).map(|(verified, _)| verified)
}

/// The 23 real files: each imports as the collective its header names, and verifies exactly.
#[test]
fn every_corpus_file_imports_and_verifies() {
    let files = corpus_files();
    assert_eq!(files.len(), 23, "the corpus has its 23 files");
    let mut failures = Vec::new();
    for (name, text) in &files {
        match import_and_verify(text) {
            Ok(verified) => {
                let gpus = if name.contains("4gpu") { 4 } else { 8 };
                assert_eq!(verified.n_ranks, gpus, "{name}");
                assert_eq!(verified.verdict(), Verdict::Exact, "{name}");
                let coll = if name.contains("allreduce") {
                    Collective::AllReduce
                } else if name.contains("allgather") {
                    Collective::AllGather
                } else {
                    Collective::AllToAll
                };
                assert_eq!(verified.collective, coll, "{name}");
            }
            Err(errors) => failures.push(format!("{name}:\n{}", render_all(&errors, name, text))),
        }
    }
    assert!(failures.is_empty(), "{} corpus files failed:\n{}", failures.len(), failures.join("\n"));
}

/// The two dialects are told apart, with their placements and size ranges.
#[test]
fn dialects_placements_and_sizes_are_read() {
    let limits = Limits::default();
    let read = |path: &str| {
        let text = std::fs::read_to_string(fixtures_dir().join(path)).unwrap();
        msccl::import(&text, &limits).unwrap()
    };
    let legacy = read("mscclang/allgather_ring_8gpu.xml");
    assert_eq!(
        (legacy.dialect, legacy.schedule.placement, legacy.bytes),
        (msccl::Dialect::Legacy, Placement::InPlace, None)
    );
    let executor = read("rccl/allreduce-allpairs-8n-ll-32tb-op.xml");
    assert_eq!(executor.dialect, msccl::Dialect::Executor);
    assert_eq!((executor.schedule.placement, executor.bytes), (Placement::OutOfPlace, Some((0, 65536))));
    // RCCL's alltoall for 7 MB and more: 64 chunks per rank's block, over 8 channels.
    let alltoall = read("rccl/alltoall-8n-7mb-43mb.xml");
    assert_eq!((alltoall.schedule.collective, alltoall.schedule.chunks), (Collective::AllToAll, 8));
    assert!(alltoall.origins.iter().flatten().any(|o| o.channel == 7));
}

/// Replaces the `n`-th occurrence (from 0) of `from` in `text`.
fn replace_nth(text: &str, from: &str, to: &str, n: usize) -> String {
    let at = text.match_indices(from).nth(n).unwrap_or_else(|| panic!("`{from}` occurs {n} times")).0;
    format!("{}{to}{}", &text[..at], &text[at + from.len()..])
}

fn first_error(text: &str) -> collc_compiler::Error {
    import_and_verify(text).expect_err("the broken file is refused").0.remove(0)
}

/// Hand-broken files: each is refused with a code, the step's line, and its rank, thread block and step.
#[test]
fn broken_files_name_the_rank_thread_block_and_step() {
    let ring = std::fs::read_to_string(fixtures_dir().join("mscclang/allreduce_ring_4gpu.xml")).unwrap();
    // A reduction of the wrong chunk: rank 1's second step reduces chunk 3 instead of 0.
    let wrong = replace_nth(
        &ring,
        r#"type="rrs" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0""#,
        r#"type="rrs" srcbuf="i" srcoff="3" dstbuf="i" dstoff="3""#,
        0,
    );
    let error = first_error(&wrong);
    let note = error.note.clone().unwrap_or_default();
    assert!(error.code.starts_with("collc::verify"), "{error:?}");
    assert!(note.contains("thread block 0") && note.contains("step 1"), "the note names the step: {note}");
    assert!(note.contains("rank "), "{note}");
    // A receive with no sender: rank 0's last step becomes a second receive from rank 3.
    let extra = replace_nth(&ring, r#"<step s="6" type="r""#, r#"<step s="6" type="rcs""#, 0);
    let error = first_error(&extra);
    assert!(error.code.starts_with("collc::verify"), "{error:?}");
    assert!(error.note.unwrap_or_default().contains("thread block 0"));

    // A dependency on a step that never publishes its completion: the runtimes would hang.
    let halving =
        std::fs::read_to_string(fixtures_dir().join("mscclang/allreduce_recursive_doubling_halving_8gpu.xml")).unwrap();
    let first_hasdep = halving.find(r#"hasdep="1""#).unwrap();
    let unpublished = format!("{}hasdep=\"0\"{}", &halving[..first_hasdep], &halving[first_hasdep + 10..]);
    let error = first_error(&unpublished);
    assert_eq!(error.code, "collc::msccl::dependency", "{error:?}");
    assert!(error.message.contains("hasdep") && error.message.contains("thread block"), "{}", error.message);

    // Two thread blocks that wait on each other.
    let cycle = replace_nth(&halving, r#"depid="-1" deps="-1""#, r#"depid="0" deps="0""#, 4);
    assert!(import_and_verify(&cycle).is_err());

    // Two thread blocks receiving from one peer on one channel: the runtimes would interleave their messages.
    let allpairs = std::fs::read_to_string(fixtures_dir().join("mscclang/alltoall_allpairs_8gpu.xml")).unwrap();
    let two = replace_nth(
        &allpairs,
        r#"<tb id="1" send="-1" recv="2" chan="0">"#,
        r#"<tb id="1" send="-1" recv="1" chan="0">"#,
        0,
    );
    let error = first_error(&two);
    assert_eq!(error.code, "collc::msccl::connection", "{error:?}");
    assert!(error.message.contains("thread blocks 0 and 1") && error.message.contains("rank 1"), "{}", error.message);

    // Out of bounds, an unknown step type, a missing attribute: format errors pointing into the file.
    for (from, to, code) in [
        (r#"srcoff="3""#, r#"srcoff="9""#, "collc::msccl::step"),
        (r#"type="rrs""#, r#"type="rrx""#, "collc::msccl::format"),
        (r#" cnt="1""#, "", "collc::msccl::format"),
        (r#"ngpus="4""#, r#"ngpus="5""#, "collc::msccl::format"),
        (r#"coll="allreduce""#, r#"coll="alltonext""#, "collc::msccl::collective"),
    ] {
        let error = first_error(&replace_nth(&ring, from, to, 0));
        assert_eq!(error.code, code, "{from} -> {to}: {error:?}");
        assert!(error.primary_span().is_some(), "{from} -> {to}: no location");
    }
}

/// A small deterministic generator for the mutations.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n.max(1)
    }
}

/// Mutated corpus files (bytes flipped, lines dropped or repeated, numbers changed, the text cut short) and
/// hostile shapes never panic the importer or the verifier: each is a diagnostic or a verified schedule.
#[test]
fn mutated_files_never_panic() {
    let limits = Limits::default();
    let small: Vec<(String, String)> = corpus_files().into_iter().filter(|(_, t)| t.len() < 40_000).collect();
    let mut rng = Lcg(0x36);
    let digits = ["-1", "0", "1", "7", "8", "63", "255", "4294967295", "99999999999", "-5", "x"];
    let (mut refused, mut accepted) = (0, 0);
    for round in 0..600 {
        let (_, text) = &small[round % small.len()];
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(lines.len());
            match rng.below(5) {
                0 => {
                    lines.remove(at);
                }
                1 => {
                    let line = lines[at].clone();
                    lines.insert(at, line);
                }
                2 => {
                    let quotes: Vec<usize> = lines[at].match_indices("=\"").map(|(i, _)| i + 2).collect();
                    if let Some(&q) = quotes.get(rng.below(quotes.len())) {
                        let end = lines[at][q..].find('"').map_or(q, |e| q + e);
                        lines[at].replace_range(q..end, digits[rng.below(digits.len())]);
                    }
                }
                3 => {
                    let mut cut = rng.below(lines[at].len() + 1);
                    while !lines[at].is_char_boundary(cut) {
                        cut -= 1;
                    }
                    lines[at].truncate(cut);
                }
                _ => {
                    let mut bytes = lines[at].clone().into_bytes();
                    if !bytes.is_empty() {
                        let i = rng.below(bytes.len());
                        bytes[i] = b"<>\"=/ a0-&"[rng.below(10)];
                    }
                    lines[at] = String::from_utf8_lossy(&bytes).into_owned();
                }
            }
        }
        let mutated = lines.join("\n");
        match msccl::import(&mutated, &limits).and_then(|i| msccl::verify(i, &mutated, &limits)) {
            Ok(_) => accepted += 1,
            Err(errors) => {
                assert!(!errors.0.is_empty());
                refused += 1;
            }
        }
    }
    assert!(refused > 300, "most mutations break a file: {refused} refused, {accepted} accepted");
    // Hostile shapes: deep nesting, a huge count, many attributes, entities, an empty file, too many bytes.
    let deep = format!("{}{}", "<algo>".repeat(100_000), "</algo>".repeat(100_000));
    let attrs = format!("<algo {}/>", (0..100).map(|i| format!("a{i}=\"1\"")).collect::<Vec<_>>().join(" "));
    let huge = "<algo name=\"x\" proto=\"Simple\" nchannels=\"1\" nchunksperloop=\"2147483647\" ngpus=\"65536\" \
                coll=\"allreduce\" inplace=\"1\"></algo>";
    let laughs = "<!DOCTYPE a [<!ENTITY a \"aaaa\"><!ENTITY b \"&a;&a;&a;\">]><algo name=\"&b;\"/>";
    let wide = "<algo name=\"x\" proto=\"Simple\" nchannels=\"1\" nchunksperloop=\"2147483647\" ngpus=\"1\" \
                coll=\"allreduce\" inplace=\"1\"><gpu id=\"0\" i_chunks=\"2147483647\" o_chunks=\"0\" \
                s_chunks=\"2147483647\"><tb id=\"0\" send=\"-1\" recv=\"-1\" chan=\"0\"><step s=\"0\" type=\"cpy\" \
                srcbuf=\"i\" srcoff=\"2147483646\" dstbuf=\"s\" dstoff=\"0\" cnt=\"1\"/></tb></gpu></algo>";
    let big = " ".repeat(msccl::MAX_BYTES + 1);
    for hostile in [deep.as_str(), attrs.as_str(), huge, wide, laughs, "", "<", big.as_str()] {
        assert!(msccl::import(hostile, &limits).is_err());
    }
}

fn library_exports(target: Target, n_ranks: u32, placement: Placement) -> Vec<String> {
    let limits = Limits::default();
    let mut failures = Vec::new();
    for algo in corpus::library() {
        let binding = corpus::bindings(&algo.text, n_ranks);
        let Ok(verified) = compile(&algo.text, &binding, Options::placed(placement), &limits) else { continue };
        let exported = msccl::export(&verified, target, &limits);
        let expected_refusal =
            verified.collective == Collective::SendRecv || (algo.name == "broadcast/scatter_allgather" && n_ranks == 3);
        match (exported, expected_refusal) {
            (Ok(text), false) => match import_and_verify(&text) {
                Ok(back) => {
                    assert_eq!(
                        (back.collective, back.n_ranks, back.placement),
                        (verified.collective, n_ranks, placement)
                    );
                }
                Err(errors) => failures.push(format!(
                    "{} p={n_ranks}: re-import: {}",
                    algo.name,
                    render_all(&errors, "x.xml", &text)
                )),
            },
            (Err(errors), true) => assert_eq!(errors.0[0].code, "collc::msccl::limit", "{}", algo.name),
            (Ok(_), true) => failures.push(format!("{} p={n_ranks}: exported what MSCCL cannot hold", algo.name)),
            (Err(errors), false) => failures.push(format!(
                "{} p={n_ranks} {placement}: {}",
                algo.name,
                render_all(&errors, &algo.name, &algo.text)
            )),
        }
    }
    failures
}

/// Every library algorithm exports for both targets, in both placements, at 2, 3, 4 and 8 ranks, and the file
/// reads back as the same collective and verifies.
#[test]
fn every_library_algorithm_exports_and_reimports() {
    let mut failures = Vec::new();
    for target in [Target::Legacy, Target::Executor] {
        for n_ranks in [2, 3, 4, 8] {
            for placement in Placement::BOTH {
                failures.extend(library_exports(target, n_ranks, placement));
            }
        }
    }
    assert!(failures.is_empty(), "{} exports failed:\n{}", failures.len(), failures.join("\n"));
}

/// A ring of 64 ranks has 127 steps per thread block: past msccl-executor's 63, within msccl-legacy's 255; at 129
/// ranks past both (257 steps). The diagnostic names the limit and points at the `.coll` transfer.
#[test]
fn target_limits_are_diagnosed_at_the_coll_line() {
    let limits = Limits::default();
    let source = corpus::library().into_iter().find(|a| a.name == "allreduce/ring").unwrap().text;
    let ring = |p: u32| compile(&source, &Bindings::ranks(p), Options::default(), &limits).unwrap();
    let error = msccl::export(&ring(64), Target::Executor, &limits).unwrap_err().0.remove(0);
    assert_eq!(error.code, "collc::msccl::limit");
    assert!(error.message.contains("127 steps") && error.message.contains("63"), "{}", error.message);
    let span = error.primary_span().expect("a span");
    assert!(source[span.start as usize..span.end as usize].starts_with("send "), "points at the transfer");
    assert!(msccl::export(&ring(64), Target::Legacy, &limits).is_ok());
    let error = msccl::export(&ring(129), Target::Legacy, &limits).unwrap_err().0.remove(0);
    assert!(error.message.contains("255"), "{}", error.message);
    // A rooted collective for another root has no MSCCL form.
    let binomial = corpus::library().into_iter().find(|a| a.name == "broadcast/binomial").unwrap().text;
    let rooted = compile(&binomial, &Bindings { root: Some(2), ..Bindings::ranks(4) }, Options::default(), &limits);
    let error = msccl::export(&rooted.unwrap(), Target::Legacy, &limits).unwrap_err().0.remove(0);
    assert!(error.message.contains("root"), "{}", error.message);
}
