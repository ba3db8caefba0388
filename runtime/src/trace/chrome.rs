//! The Chrome / Perfetto trace (the Trace Event Format's JSON object form, which ui.perfetto.dev and
//! chrome://tracing open) of every rank's `RankTrace`: a process per rank (`rank N`, pid N), a thread per channel
//! (`channel C`, tid C + 1: Perfetto reads tid 0 as none given and files it under tid = pid, which would merge
//! channel 0 of rank r with its channel r), a complete event (`X`) per instruction and tile named by its op, with its index, peers, operands,
//! tile and line as args; an instruction that never ended (a hang) an open `B` event saying what it waits for; and
//! a flow arrow (`s` on the sender's span, `f` bound to the receiver's) per message both ends show, the k-th send of
//! a connection in a tile being its k-th receive there.

use super::{CallTrace, InstrInfo, RankTrace, SpanRecord, MAX_CALLS, MAX_SPANS, MAX_TILES};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// A message: call, sender, receiver, channel, tile, and its place among the connection's messages in the tile.
type MessageKey = (u64, u32, u32, u8, u32, u32);

/// Where a flow arrow starts or ends: rank, thread (`thread_of` a channel), time (µs).
type End = (u32, u32, f64);

/// The thread of `channel`: never 0, which Perfetto reads as no thread.
fn thread_of(channel: u8) -> u32 {
    u32::from(channel) + 1
}

/// The trace of `parts` as JSON; `traced` says in its metadata which calls were recorded.
pub fn write(parts: &[RankTrace], traced: &str) -> String {
    let epoch = parts.iter().flat_map(|p| &p.calls).flat_map(|c| &c.spans).map(|s| s.start_ns).min().unwrap_or(0);
    // Nanoseconds from the first span: the events' µs keep every digit.
    let since = |ns: u64| ns.saturating_sub(epoch);
    let mut events = Vec::new();
    let mut sends: BTreeMap<MessageKey, End> = BTreeMap::new();
    let mut receives: BTreeMap<MessageKey, End> = BTreeMap::new();
    for part in parts {
        events.extend(names(part));
        for call in &part.calls {
            for span in &call.spans {
                let Some(instr) = call.instrs.get(span.instr as usize) else { continue };
                let (start, end) = (since(span.start_ns), since(span.end_ns.max(span.start_ns)));
                events.push(span_event(part.rank, call, instr, span, start, end));
                // Perfetto binds an arrow's end to the slice open at its time, after sorting by time: a send's arrow
                // leaves 1 ns into its span, a receive's arrives 1 ns before its end (an open span's, after its
                // start), so the arrow goes forward (a receive ends after the send it takes began) and each end
                // lies inside its span.
                let thread = thread_of(instr.channel);
                let leaves = start + 1.min(end - start);
                let arrives = if span.waiting.is_some() { start + 1 } else { end - 1.min(end - start) };
                // An instruction that never ended sent nothing; it may wait with its message there (for room).
                if let Some(to) = instr.send_to.filter(|_| span.waiting.is_none()) {
                    let key = (call.seq, part.rank, to, instr.channel, span.tile, instr.send_pos);
                    sends.insert(key, (part.rank, thread, micros(leaves)));
                }
                if let Some(from) = instr.recv_from {
                    let key = (call.seq, from, part.rank, instr.channel, span.tile, instr.recv_pos);
                    receives.insert(key, (part.rank, thread, micros(arrives)));
                }
            }
        }
    }
    let mut id = 0u64;
    for (key, sent) in &sends {
        let Some(received) = receives.get(key) else { continue };
        id += 1;
        events.push(flow("s", id, *sent));
        events.push(flow("f", id, *received));
    }
    let trace = json!({
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "metadata": metadata(parts, traced, id),
    });
    serde_json::to_string(&trace).expect("a JSON value prints")
}

/// The process of rank `part.rank` and a thread per channel its instructions use, named.
fn names(part: &RankTrace) -> Vec<Value> {
    let pid = part.rank;
    let mut events = vec![
        json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0, "args": {"name": format!("rank {pid}")}}),
        json!({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": 0, "args": {"sort_index": pid}}),
    ];
    let channels: BTreeSet<u8> = part.calls.iter().flat_map(|c| &c.instrs).map(|i| i.channel).collect();
    for channel in channels {
        events.push(json!({
            "ph": "M", "name": "thread_name", "pid": pid, "tid": thread_of(channel), "ts": 0,
            "args": {"name": format!("channel {channel}")},
        }));
    }
    events
}

/// Microseconds, the events' unit, from nanoseconds.
fn micros(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// Instruction `instr` on one tile of `call`: a complete event from `start` to `end` (ns from the first span), or an
/// open one where it never ended.
fn span_event(rank: u32, call: &CallTrace, instr: &InstrInfo, span: &SpanRecord, start: u64, end: u64) -> Value {
    let mut args = json!({
        "call": call.seq,
        "shape": call.call,
        "algorithm": call.algorithm,
        "instr": instr.index,
        "channel": instr.channel,
        "line": instr.line,
        "operands": instr.operands,
        "tile": span.tile,
        "tiles": call.tiles,
    });
    if let Some(peer) = instr.recv_from {
        args["recv_from"] = json!(peer);
    }
    if let Some(peer) = instr.send_to {
        args["send_to"] = json!(peer);
    }
    let mut event = json!({
        "name": instr.op, "cat": "instr", "ph": "X", "ts": micros(start), "dur": micros(end - start),
        "pid": rank, "tid": thread_of(instr.channel),
    });
    if let Some(waiting) = &span.waiting {
        args["waiting_for"] = json!(waiting);
        event["ph"] = json!("B");
        event["cat"] = json!("stuck");
        event.as_object_mut().expect("an object").remove("dur");
    }
    event["args"] = args;
    event
}

/// One end of message `id`'s arrow: `s` on the sender's span, `f` bound to the receiver's enclosing span.
fn flow(ph: &str, id: u64, (rank, thread, ts): End) -> Value {
    let mut event =
        json!({"name": "message", "cat": "message", "ph": ph, "id": id, "ts": ts, "pid": rank, "tid": thread});
    if ph == "f" {
        event["bp"] = json!("e");
    }
    event
}

/// What the trace holds and what it leaves out: the calls recorded, the clock, the caps, each rank's losses and
/// the ranks without a part.
fn metadata(parts: &[RankTrace], traced: &str, messages: u64) -> Value {
    let synthetic = parts.iter().any(|p| p.synthetic);
    let clock = match synthetic {
        true => "synthetic: the dumps carry no clock, so each rank's instructions are laid out in order, 1 us apart, \
                 a receive after the send it takes; durations and gaps mean nothing"
            .to_string(),
        false => "CLOCK_MONOTONIC of the host, ts from the first span; a span starts when its instruction's message \
                  and room were there (waits are the gaps)"
            .to_string(),
    };
    let n_ranks = parts.iter().map(|p| p.n_ranks).max().unwrap_or(0);
    let present: BTreeSet<u32> = parts.iter().map(|p| p.rank).collect();
    let missing: Vec<u32> = (0..n_ranks).filter(|r| !present.contains(r)).collect();
    let ranks: Vec<Value> = (parts.iter())
        .map(|p| {
            json!({"rank": p.rank, "host": p.host, "pid": p.pid, "calls": p.calls.len(),
                   "dropped_spans": p.dropped_spans, "dropped_calls": p.dropped_calls})
        })
        .collect();
    json!({
        "generator": "collc",
        "traced": traced,
        "clock": clock,
        "limits": format!(
            "at most {MAX_SPANS} spans and {MAX_CALLS} calls per rank, the first {MAX_TILES} tiles of each call"
        ),
        "n_ranks": n_ranks,
        "ranks": ranks,
        "missing_ranks": missing,
        "messages": messages,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instr(index: usize, op: &str, recv_from: Option<u32>, send_to: Option<u32>) -> InstrInfo {
        InstrInfo {
            index,
            op: op.into(),
            channel: 1,
            line: 7,
            operands: "src=in[0]".into(),
            recv_from,
            recv_pos: 0,
            send_to,
            send_pos: 0,
        }
    }

    fn span(instr: u32, tile: u32, start_ns: u64, waiting: Option<&str>) -> SpanRecord {
        SpanRecord { instr, tile, start_ns, end_ns: start_ns + 100, waiting: waiting.map(String::from) }
    }

    /// Rank `rank` of 3 in call #4 with `instrs` and `spans`.
    fn part(rank: u32, instrs: Vec<InstrInfo>, spans: Vec<SpanRecord>) -> RankTrace {
        let call = CallTrace { seq: 4, call: "allreduce".into(), algorithm: "ring".into(), tiles: 2, instrs, spans };
        RankTrace {
            rank,
            n_ranks: 3,
            host: "h".into(),
            pid: 10 + rank,
            dropped_spans: 0,
            dropped_calls: 0,
            synthetic: false,
            calls: vec![call],
        }
    }

    fn events(trace: &Value, ph: &str) -> Vec<Value> {
        trace["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == ph).cloned().collect()
    }

    #[test]
    fn a_send_and_its_receive_of_the_same_tile_share_an_arrow() {
        // Rank 0 sends on tiles 0 and 1 and once more (to rank 2, which has no part); rank 1 receives both.
        let sender = part(
            0,
            vec![instr(0, "Send", None, Some(1)), instr(1, "Send", None, Some(2))],
            vec![span(0, 0, 1_000, None), span(0, 1, 2_000, None), span(1, 0, 3_000, None)],
        );
        let receiver =
            part(1, vec![instr(0, "Recv", Some(0), None)], vec![span(0, 1, 2_500, None), span(0, 0, 1_500, None)]);
        let trace: Value = serde_json::from_str(&write(&[sender, receiver], "test")).unwrap();
        let (starts, finishes) = (events(&trace, "s"), events(&trace, "f"));
        assert_eq!((starts.len(), finishes.len()), (2, 2));
        for (start, finish) in starts.iter().zip(&finishes) {
            assert_eq!(
                (start["id"].clone(), start["pid"].clone(), finish["pid"].clone()),
                (finish["id"].clone(), 0.into(), 1.into())
            );
            assert_eq!(finish["bp"], "e");
            assert!(finish["ts"].as_f64() > start["ts"].as_f64(), "{start} {finish}");
        }
        let spans = events(&trace, "X");
        assert_eq!(spans.len(), 5);
        assert_eq!(spans[0]["ts"], 0.0, "times from the first span");
        assert_eq!(spans[0]["dur"], 0.1);
        let (thread, args) = (&spans[0]["tid"], &spans[0]["args"]);
        assert_eq!((thread, &args["channel"], &args["operands"]), (&json!(2), &json!(1), &json!("src=in[0]")));
        assert_eq!(trace["metadata"]["missing_ranks"], json!([2]));
        assert_eq!(trace["metadata"]["messages"], 2);
    }

    #[test]
    fn an_instruction_that_never_ended_is_an_open_span_that_sent_nothing() {
        let stuck = part(0, vec![instr(0, "RecvCopySend", Some(1), Some(1))], vec![span(0, 0, 0, Some("a message"))]);
        let peer = part(1, vec![instr(0, "Recv", Some(0), None)], vec![span(0, 0, 500, None)]);
        let trace: Value = serde_json::from_str(&write(&[stuck, peer], "test")).unwrap();
        let open = events(&trace, "B");
        assert_eq!(open.len(), 1);
        assert_eq!((open[0]["args"]["waiting_for"].clone(), open[0]["dur"].clone()), ("a message".into(), Value::Null));
        assert!(events(&trace, "s").is_empty(), "an open span sent nothing");
        let names: Vec<(Value, Value)> =
            events(&trace, "M").iter().map(|e| (e["tid"].clone(), e["args"]["name"].clone())).collect();
        assert!(names.contains(&(json!(0), json!("rank 1"))), "{names:?}");
        assert!(names.contains(&(json!(2), json!("channel 1"))), "channel C is thread C + 1, never 0: {names:?}");
    }
}
