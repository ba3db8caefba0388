//! `collc viz` end to end: the SVG parsed as XML (a lane per rank, an arrow per transfer of the schedule `collc build
//! --emit json` prints), usage errors, and the HTML page stepped through in a real headless chromium over WebDriver
//! (chromium and chromedriver must be installed: `.ci/run` does it; the test fails, saying so, without them).

mod common;
#[path = "viz/webdriver.rs"]
mod webdriver;

use common::TempFile;
use serde_json::{json, Value};
use std::process::{Command, Output};

fn collc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_collc")).args(args).env("NO_COLOR", "1").output().expect("collc runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Writes `collc viz` output for `args` to a temp file named `name` and returns it.
fn viz(name: &str, args: &[&str]) -> TempFile {
    let file = TempFile::named(name);
    let out = collc(&[&["viz"], args, &["--output", file.path()]].concat());
    assert_eq!(out.status.code(), Some(0), "collc viz {args:?}: {}", text(&out.stderr));
    file
}

/// The schedule's instructions' ops, from `collc build --emit json` for the same arguments.
fn ops(args: &[&str]) -> Vec<String> {
    let out = collc(&[&["build"], args, &["--emit", "json"]].concat());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).expect("build prints JSON");
    let instructions = json["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .flat_map(|r| r["instructions"].as_array().cloned().unwrap_or_default());
    instructions.map(|i| i["op"].as_str().expect("an op").to_string()).collect()
}

fn with_class<'a>(doc: &'a roxmltree::Document, class: &str) -> Vec<roxmltree::Node<'a, 'a>> {
    doc.descendants().filter(|n| n.attribute("class").is_some_and(|c| c.split(' ').any(|c| c == class))).collect()
}

#[test]
fn the_svg_draws_a_lane_per_rank_and_an_arrow_per_transfer() {
    let cases: [&[&str]; 3] = [
        &["allreduce/ring", "--ranks", "4"],
        &["allreduce/tree", "--ranks", "4", "--pipeline", "1"],
        &["allgather/ring", "--ranks", "3", "--in-place"],
    ];
    for args in cases {
        let file = viz("drawn.svg", args);
        let source = std::fs::read_to_string(file.path()).expect("the SVG was written");
        let doc = roxmltree::Document::parse(&source).unwrap_or_else(|e| panic!("{args:?}: not XML: {e}"));
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let n_ranks: usize = args[2].parse().expect("a rank count");
        let lanes = with_class(&doc, "lane");
        assert_eq!(lanes.len(), n_ranks, "{args:?}");
        for (rank, lane) in lanes.iter().enumerate() {
            let label: String = lane.descendants().filter(|n| n.is_text()).filter_map(|n| n.text()).collect();
            assert_eq!(label, format!("rank {rank}"), "{args:?}");
        }
        let ops = ops(args);
        let transfers = ops.iter().filter(|op| op.starts_with("Recv")).count();
        let reducing = ops.iter().filter(|op| op.starts_with("RecvReduce")).count();
        let arrows = with_class(&doc, "arrow");
        assert_eq!(arrows.len(), transfers, "{args:?}: an arrow per transfer");
        let marked = arrows.iter().filter(|a| a.attribute("data-reduce") == Some("true")).count();
        assert_eq!(marked, reducing, "{args:?}: a reduction mark per reducing receive");
        let oplus_in_arrows = arrows.iter().filter(|a| a.descendants().any(|n| n.attribute("class") == Some("oplus")));
        assert_eq!(oplus_in_arrows.count(), reducing, "{args:?}: ⊕ drawn on each");
        let columns = with_class(&doc, "column").len();
        let labels: Vec<String> =
            with_class(&doc, "step-label").iter().filter_map(|n| n.text().map(String::from)).collect();
        assert_eq!(labels, (0..columns).map(|k| format!("step {k}")).collect::<Vec<_>>(), "{args:?}");
        for arrow in &arrows {
            let number = |key: &str| arrow.attribute(key).and_then(|v| v.parse::<usize>().ok()).expect(key);
            assert!(number("data-step") < columns && number("data-from") < n_ranks && number("data-to") < n_ranks);
        }
        let legend: String = with_class(&doc, "legend-item")
            .iter()
            .flat_map(|n| n.descendants())
            .filter(|n| n.is_text())
            .filter_map(|n| n.text())
            .collect();
        assert!(legend.contains("chunk 0") && legend.contains("reducing receive"), "{args:?}: {legend}");
    }
    // Ring allreduce: 2(p-1) steps, one message per rank in each.
    let file = viz("ring.svg", &["allreduce/ring", "--ranks", "4"]);
    let source = std::fs::read_to_string(file.path()).expect("written");
    let doc = roxmltree::Document::parse(&source).expect("XML");
    assert_eq!(with_class(&doc, "column").len(), 6);
}

#[test]
fn bad_input_is_a_clear_error_not_a_panic() {
    let unknown = collc(&["viz", "allreduce/rnig", "--ranks", "4", "--output", "x.svg"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(text(&unknown.stderr).contains("did you mean: allreduce/ring"), "{}", text(&unknown.stderr));
    let png = collc(&["viz", "allreduce/ring", "--ranks", "4", "--output", "ring.png"]);
    assert_eq!(png.status.code(), Some(2));
    assert!(text(&png.stderr).contains("write a .svg picture or an .html page"), "{}", text(&png.stderr));
    let no_ranks = collc(&["viz", "allreduce/ring", "--output", "ring.svg"]);
    assert_eq!(no_ranks.status.code(), Some(2));
    assert!(text(&no_ranks.stderr).contains("--ranks N"), "{}", text(&no_ranks.stderr));
    let too_many = collc(&["viz", "allreduce/ring", "--ranks", "65", "--output", "ring.svg"]);
    assert_eq!(too_many.status.code(), Some(2), "{}", text(&too_many.stderr));
    let big_page = collc(&["viz", "allreduce/ring", "--ranks", "64", "--output", "ring.html"]);
    assert_eq!(big_page.status.code(), Some(2));
    assert!(text(&big_page.stderr).contains("draw an .svg"), "{}", text(&big_page.stderr));
    // As `collc build --output` does: a file that cannot be written is an error (1), named.
    let nowhere = collc(&["viz", "allreduce/ring", "--ranks", "4", "--output", "/nonexistent-dir/ring.svg"]);
    assert_eq!(nowhere.status.code(), Some(1));
    assert!(text(&nowhere.stderr).contains("cannot write /nonexistent-dir/ring.svg"), "{}", text(&nowhere.stderr));
    for out in [unknown, png, no_ranks, too_many, big_page, nowhere] {
        assert!(!text(&out.stderr).contains("panicked"), "{}", text(&out.stderr));
    }
}

/// A schedule file is drawn as it stands, and `--ranks` must agree with it.
#[test]
fn a_schedule_file_is_drawn_as_it_stands() {
    let sched = collc(&["build", "allreduce/ring", "--ranks", "3"]);
    let file = TempFile::with("ring3.sched", &text(&sched.stdout));
    let svg = viz("from_sched.svg", &[file.path()]);
    let source = std::fs::read_to_string(svg.path()).expect("written");
    let doc = roxmltree::Document::parse(&source).expect("XML");
    assert_eq!(with_class(&doc, "lane").len(), 3);
    assert_eq!(with_class(&doc, "arrow").len(), 12, "2(p-1) messages per rank");
    let disagree = collc(&["viz", file.path(), "--ranks", "4", "--output", svg.path()]);
    assert_eq!(disagree.status.code(), Some(2));
    assert!(text(&disagree.stderr).contains("a schedule of 3 ranks"), "{}", text(&disagree.stderr));
}

const STATE: &str = "
    const cells = {};
    for (const c of document.querySelectorAll('.cell')) { cells[c.dataset.buf + ' ' + c.dataset.rank + ' ' + c.dataset.chunk] = c.textContent; }
    const data = JSON.parse(document.getElementById('viz-data').textContent);
    const root = document.getElementById('viz');
    const position = Number(root.dataset.position);
    const expected = Array.from(document.querySelectorAll('.cell')).map(c => data.strings[data.states[position][Number(c.dataset.slot)]]);
    const current = document.querySelector('.column.current');
    const other = document.querySelector('.column:not(.current)');
    return {
        position: position,
        counter: document.getElementById('step-counter').textContent,
        current_columns: document.querySelectorAll('.column.current').length,
        current_step: current ? Number(current.dataset.step) : null,
        current_fill: current ? getComputedStyle(current).fill : null,
        other_fill: getComputedStyle(other).fill,
        arrows: Array.from(document.querySelectorAll('.arrow')).filter(a => a.getBBox().width > 0).length,
        current_arrows: document.querySelectorAll('.arrow.current').length,
        messages: document.querySelectorAll('li.message').length,
        changed: document.querySelectorAll('.cell.changed').length,
        cells: cells,
        shown: Array.from(document.querySelectorAll('.cell')).map(c => c.textContent),
        expected: expected,
        next_disabled: document.getElementById('next').disabled,
    };";

fn sum_of_every_rank(n_ranks: u32, chunk: u32) -> String {
    (0..n_ranks).map(|r| format!("r{r}.c{chunk}")).collect::<Vec<_>>().join(" + ")
}

#[test]
fn the_page_steps_through_ring_allreduce_in_a_headless_browser() {
    let page = viz("ring.html", &["allreduce/ring", "--ranks", "4"]);
    let transfers = ops(&["allreduce/ring", "--ranks", "4"]).iter().filter(|op| op.starts_with("Recv")).count();
    let browser = webdriver::Browser::start();
    browser.open(&format!("file://{}", page.path()));
    let state = || browser.eval(STATE, json!([]));

    let start = state();
    assert_eq!(start["position"], 0);
    assert_eq!(start["counter"], "start: the inputs");
    assert_eq!(start["current_columns"], 0);
    assert_eq!(start["arrows"], transfers, "every arrow rendered");
    for rank in 0..4 {
        for chunk in 0..4 {
            assert_eq!(start["cells"][format!("in {rank} {chunk}")], format!("r{rank}.c{chunk}"));
            assert_eq!(start["cells"][format!("out {rank} {chunk}")], "·", "out starts undefined");
        }
    }

    browser.click("#next");
    let first = state();
    assert_eq!(first["position"], 1);
    assert_eq!(first["counter"], "step 0 (1 of 6)");
    assert_eq!((first["current_columns"].clone(), first["current_step"].clone()), (json!(1), json!(0)));
    assert_ne!(first["current_fill"], first["other_fill"], "the current column is highlighted");
    assert_eq!(first["current_arrows"], 4, "every rank sends once a step");
    assert_eq!(first["messages"], 4);
    assert_eq!(first["shown"], first["expected"], "cells show the simulated contents");

    // The highlight and the table follow each step, by button and by arrow key.
    let mut previous = first;
    for _ in 0..3 {
        browser.click("#next");
        let now = state();
        assert_eq!(now["position"], previous["position"].as_u64().unwrap() + 1);
        assert_eq!(now["current_step"], previous["current_step"].as_u64().unwrap() + 1, "the highlight moved");
        assert_eq!(now["shown"], now["expected"]);
        previous = now;
    }
    assert!(previous["changed"].as_u64().unwrap() > 0, "after step 3 a stored sum is marked as changed");
    assert_eq!(previous["cells"]["out 0 1"], sum_of_every_rank(4, 1), "rank 0 ends the reduce-scatter with chunk 1");
    browser.press('\u{E012}');
    assert_eq!(state()["position"], 3, "← goes back");
    browser.press('\u{E014}');
    browser.press('\u{E014}');
    assert_eq!(state()["position"], 5, "→ goes on");

    browser.click("#next");
    let last = state();
    assert_eq!(last["position"], 6);
    assert_eq!(last["counter"], "step 5 (6 of 6)");
    assert_eq!(last["next_disabled"], true);
    assert_eq!(last["shown"], last["expected"]);
    for rank in 0..4 {
        for chunk in 0..4 {
            assert_eq!(
                last["cells"][format!("out {rank} {chunk}")],
                sum_of_every_rank(4, chunk),
                "rank {rank} out[{chunk}]"
            );
        }
    }

    // A link to one step opens there.
    browser.open("about:blank");
    browser.open(&format!("file://{}#step=2", page.path()));
    let linked = state();
    assert_eq!((linked["position"].clone(), linked["current_step"].clone()), (json!(3), json!(2)));
    assert_eq!(linked["shown"], linked["expected"]);
}
