//! `collc run --trace` and `collc fr analyze --trace`: the Chrome / Perfetto trace each writes, read back and checked
//! for its structure: a named process per rank and thread per channel, a span per instruction and tile of each
//! recorded call (as many as the rank's schedule has instructions), spans of a channel that never overlap, and every
//! message's arrow from a send to the receive of the rank it sends to, which ends after the send began. On every host
//! executor and the twin.

mod common;
mod hang;

use collc_runtime::trace::{MAX_CALLS, MAX_SPANS, MAX_TILES};
use common::TempFile;
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;

fn collc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_collc"))
}

/// Instructions of each rank of allreduce/ring on 4 ranks, out of place and in place, from `collc build`.
fn instruction_counts() -> [Vec<usize>; 2] {
    [&[][..], &["--in-place"][..]].map(|placement| {
        let out = collc()
            .args(["build", "allreduce/ring", "--ranks", "4", "--emit", "json"])
            .args(placement)
            .output()
            .expect("collc runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let sched: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let ranks = sched["ranks"].as_array().expect("ranks");
        ranks.iter().map(|r| r["instructions"].as_array().expect("instructions").len()).collect()
    })
}

/// `collc run allreduce/ring` on 4 ranks with `args` and `--trace`, small and short; its trace.
fn traced_run(name: &str, args: &[&str]) -> Value {
    let file = TempFile::named(&format!("{name}.json"));
    let out = collc()
        .args(["run", "allreduce/ring", "--ranks", "4", "-b", "1K", "-e", "4K", "-n", "2", "-w", "1"])
        .args(args)
        .args(["--trace", file.path()])
        .output()
        .expect("collc runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(file.path()).expect("the trace is written");
    for rank in 0..4 {
        let part = format!("{}.rank{rank}.json", file.path());
        assert!(!std::path::Path::new(&part).exists(), "{part} is merged and removed");
    }
    serde_json::from_str(&text).expect("the trace is JSON")
}

fn events(trace: &Value) -> &Vec<Value> {
    trace["traceEvents"].as_array().expect("traceEvents")
}

/// What every trace has: a named process per rank, `ph`, `ts`, `pid` and `tid` on every event, spans of a channel
/// that do not overlap, and a receiving span for every flow's send, on the rank it sends to, that ends no earlier
/// than the send starts.
fn check_structure(trace: &Value, ranks: &[u64]) {
    let events = events(trace);
    for &rank in ranks {
        let named = events.iter().any(|e| {
            e["ph"] == "M"
                && e["name"] == "process_name"
                && e["pid"] == rank
                && e["args"]["name"] == format!("rank {rank}")
        });
        assert!(named, "rank {rank} has a process_name");
    }
    for event in events {
        for key in ["ph", "ts", "pid", "tid"] {
            assert!(!event[key].is_null(), "{key} missing in {event}");
        }
    }
    // A thread per channel, `channel C` with tid C + 1 (Perfetto reads tid 0 as none given).
    for span in events.iter().filter(|e| e["ph"] == "X" || e["ph"] == "B") {
        let channel = span["args"]["channel"].as_u64().expect("a channel");
        assert_eq!(span["tid"], channel + 1, "{span}");
        let named = events.iter().any(|e| {
            e["name"] == "thread_name"
                && e["pid"] == span["pid"]
                && e["tid"] == span["tid"]
                && e["args"]["name"] == format!("channel {channel}")
        });
        assert!(named, "the thread of {span} is named");
    }
    let spans: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    let mut by_thread: BTreeMap<(u64, u64), Vec<(f64, f64)>> = BTreeMap::new();
    for span in &spans {
        let key = (span["pid"].as_u64().unwrap(), span["tid"].as_u64().unwrap());
        let start = span["ts"].as_f64().unwrap();
        by_thread.entry(key).or_default().push((start, start + span["dur"].as_f64().unwrap()));
    }
    for (thread, mut times) in by_thread {
        times.sort_by(|a, b| a.0.total_cmp(&b.0));
        for pair in times.windows(2) {
            assert!(pair[1].0 >= pair[0].1 - 1e-6, "spans of {thread:?} overlap: {pair:?}");
        }
    }
    // The span (X, or an open B) on `pid`/`tid` that holds time `ts`.
    let enclosing = |e: &Value| {
        let ts = e["ts"].as_f64().unwrap();
        events.iter().find(|s| {
            let start = s["ts"].as_f64().unwrap();
            let end = if s["ph"] == "B" { f64::INFINITY } else { start + s["dur"].as_f64().unwrap_or(-1.0) };
            (s["ph"] == "X" || s["ph"] == "B")
                && s["pid"] == e["pid"]
                && s["tid"] == e["tid"]
                && start <= ts
                && ts <= end
        })
    };
    let finishes: BTreeMap<u64, &Value> =
        events.iter().filter(|e| e["ph"] == "f").map(|e| (e["id"].as_u64().unwrap(), e)).collect();
    for start in events.iter().filter(|e| e["ph"] == "s") {
        let finish = finishes.get(&start["id"].as_u64().unwrap()).unwrap_or_else(|| panic!("no f for {start}"));
        assert_eq!(finish["bp"], "e");
        // Perfetto reads events in time order: an arrow that ended before it began would be lost.
        assert!(finish["ts"].as_f64() >= start["ts"].as_f64(), "{start} goes forward to {finish}");
        let send = enclosing(start).unwrap_or_else(|| panic!("no span holds {start}"));
        let receive = enclosing(finish).unwrap_or_else(|| panic!("no span holds {finish}"));
        assert_eq!(finish["pid"], send["args"]["send_to"], "{send} sends to the rank of {receive}");
        assert_eq!(receive["args"]["recv_from"], start["pid"], "{receive} receives from the rank of {send}");
        if receive["ph"] == "X" {
            let receive_end = receive["ts"].as_f64().unwrap() + receive["dur"].as_f64().unwrap();
            assert!(receive_end >= send["ts"].as_f64().unwrap() - 1e-6, "{receive} ends before {send} starts");
        }
    }
}

/// A run's trace: per rank, 3 sizes x 2 placements recorded calls, each with a span per instruction and tile, and
/// messages with arrows.
fn check_run(trace: &Value) {
    check_structure(trace, &[0, 1, 2, 3]);
    let counts = instruction_counts();
    let mut per_call: BTreeMap<(u64, u64), (usize, usize)> = BTreeMap::new();
    for span in events(trace).iter().filter(|e| e["ph"] == "X") {
        let (rank, call) = (span["pid"].as_u64().unwrap(), span["args"]["call"].as_u64().unwrap());
        let shape = span["args"]["shape"].as_str().expect("the call's shape");
        let placement = usize::from(shape.ends_with(" in-place"));
        let tiles = (span["args"]["tiles"].as_u64().unwrap() as usize).min(MAX_TILES);
        per_call.entry((rank, call)).or_insert((0, counts[placement][rank as usize] * tiles)).0 += 1;
    }
    for rank in 0..4 {
        assert_eq!(per_call.keys().filter(|(r, _)| *r == rank).count(), 6, "rank {rank}: 3 sizes x 2 placements");
    }
    for ((rank, call), (spans, expected)) in per_call {
        assert_eq!(spans, expected, "rank {rank} call #{call}: a span per instruction and tile");
    }
    let flows = events(trace).iter().filter(|e| e["ph"] == "s").count();
    assert!(flows > 0, "messages have arrows");
    assert_eq!(trace["displayTimeUnit"], "ns");
    assert!(trace["metadata"]["traced"].as_str().unwrap().contains("the last 1 timed call"), "{}", trace["metadata"]);
}

#[test]
fn threads_trace_every_instruction_and_message() {
    check_run(&traced_run("threads", &["--transport", "threads"]));
}

#[test]
fn shm_rank_processes_write_parts_the_launcher_merges() {
    let trace = traced_run("shm", &["--transport", "shm"]);
    check_run(&trace);
    let pids: std::collections::BTreeSet<u64> =
        trace["metadata"]["ranks"].as_array().unwrap().iter().map(|r| r["pid"].as_u64().unwrap()).collect();
    assert_eq!(pids.len(), 4, "a process per rank");
}

#[test]
fn the_jit_traces_as_the_interpreter_does() {
    check_run(&traced_run("jit", &["--transport", "threads", "--executor", "jit"]));
}

#[test]
fn the_twin_traces_each_block() {
    check_run(&traced_run("twin", &["--transport", "twin"]));
}

#[test]
fn the_help_states_the_limits_the_recorder_has() {
    let out = collc().args(["run", "--help"]).output().expect("collc runs");
    let help = String::from_utf8_lossy(&out.stdout).split_whitespace().collect::<Vec<_>>().join(" ");
    let limits = format!("at most {MAX_SPANS} spans and {MAX_CALLS} calls per rank and the first {MAX_TILES} tiles");
    assert!(help.contains(&limits), "{help}");
}

#[test]
fn an_unwritable_trace_path_is_refused_before_the_run() {
    let out = collc()
        .args(["run", "allreduce/ring", "--ranks", "2", "-b", "1K", "-e", "1K", "-n", "1"])
        .args(["--trace", "/nonexistent-dir/ring.json"])
        .output()
        .expect("collc runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--trace /nonexistent-dir/ring.json: cannot write it"), "{stderr}");
    assert!(out.stdout.is_empty(), "no rank started");
}

#[test]
fn fr_analyze_writes_the_hang_as_a_trace() {
    let dir = hang::hang("trace");
    let file = TempFile::named("hang.json");
    let out = collc().args(["fr", "analyze"]).arg(&dir).args(["--trace", file.path()]).output().expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(file.path()).expect("written")).expect("JSON");
    check_structure(&trace, &[0, 1]);
    assert_eq!(trace["metadata"]["missing_ranks"], serde_json::json!([2]));
    assert!(trace["metadata"]["clock"].as_str().unwrap().starts_with("synthetic"));
    for rank in [0, 1] {
        // A span per instruction the rank's dump has done in its current tile.
        let dump = std::fs::read_to_string(dir.join(format!("collc-fr-rank{rank}.json"))).expect("a dump");
        let dump: Value = serde_json::from_str(&dump).expect("JSON");
        let instructions = dump["current"]["instructions"].as_array().expect("in a call");
        let done = instructions.iter().filter(|i| i["state"] == "done").count();
        let spans = events(&trace).iter().filter(|e| e["ph"] == "X" && e["pid"] == rank).count();
        assert_eq!(spans, done, "rank {rank}");
        let stuck: Vec<&Value> = events(&trace).iter().filter(|e| e["ph"] == "B" && e["pid"] == rank).collect();
        assert!(!stuck.is_empty(), "rank {rank} has an open span where it waits");
        for span in stuck {
            assert!(span["args"]["waiting_for"].as_str().unwrap().contains("rank"), "{span}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
