//! `collc fr analyze DIR --trace FILE`: the hang the dumps show, as the same Chrome / Perfetto trace `collc run
//! --trace` writes. Per rank in a call: a span per instruction done in its current tile, an open span on the first
//! it waits at on each channel (its args say for what), and an arrow per message whose send is done and whose
//! receive is done or waiting, in the same call and tile. The dumps carry no clock, so times are made up: each rank's instructions in
//! index order, a receive after the send it takes (the trace's metadata says so).

use collc_runtime::recorder::{Current, Dump};
use collc_runtime::trace::{chrome, CallTrace, InstrInfo, RankTrace, SpanRecord};
use std::collections::{BTreeMap, HashMap};

/// Synthetic time between two instructions of a rank, and a span's length (ns).
const STEP_NS: u64 = 1000;
const SPAN_NS: u64 = 800;

/// The trace of `dumps` as JSON.
pub fn write(dumps: &BTreeMap<u32, Dump>) -> String {
    let mut parts: Vec<RankTrace> = dumps.values().map(part).collect();
    lay_out(&mut parts);
    let traced = "the call each rank was in when its flight recorder dumped: the instructions done in its current \
                  tile, and an open span on the first it waits at on each channel";
    chrome::write(&parts, traced)
}

/// One rank's dump as a trace part, its spans in index order (times set by `lay_out`).
fn part(dump: &Dump) -> RankTrace {
    let calls = match &dump.current {
        Some(current) => vec![call(dump, current)],
        None => Vec::new(),
    };
    RankTrace {
        rank: dump.rank,
        n_ranks: dump.n_ranks,
        host: dump.host.clone(),
        pid: dump.pid,
        dropped_spans: 0,
        dropped_calls: 0,
        synthetic: true,
        calls,
    }
}

fn call(dump: &Dump, current: &Current) -> CallTrace {
    // Each instruction's place among the rank's instructions on its connections, in index order.
    let mut on: HashMap<(bool, u32, u8), u32> = HashMap::new();
    let mut place = |sending: bool, peer: Option<u32>, channel: u8| {
        peer.map_or(0, |peer| {
            let count = on.entry((sending, peer, channel)).or_insert(0);
            *count += 1;
            *count - 1
        })
    };
    let instrs: Vec<InstrInfo> = (current.instructions.iter())
        .map(|i| InstrInfo {
            index: i.index,
            op: i.op.clone(),
            channel: i.channel,
            line: i.line,
            operands: String::new(),
            recv_from: i.recv_from,
            recv_pos: place(false, i.recv_from, i.channel),
            send_to: i.send_to,
            send_pos: place(true, i.send_to, i.channel),
        })
        .collect();
    // Where a channel is stuck: its first instruction waiting for a connection (those after it wait behind it on
    // the same connections, or are ready only by their dependencies).
    let mut stuck: Vec<u8> = Vec::new();
    let spans = (current.instructions.iter().enumerate())
        .filter(|(_, i)| match i.state.as_str() {
            "done" => true,
            "waiting" if !stuck.contains(&i.channel) => {
                stuck.push(i.channel);
                true
            }
            _ => false,
        })
        .map(|(k, i)| SpanRecord {
            instr: k as u32,
            tile: current.tile as u32,
            start_ns: 0,
            end_ns: 0,
            waiting: (i.state == "waiting").then(|| i.waiting_for.clone().unwrap_or_else(|| "?".into())),
        })
        .collect();
    let call = dump.calls.iter().rev().find(|c| c.seq == current.seq).map_or(String::new(), |c| c.call.clone());
    CallTrace { seq: current.seq, call, algorithm: current.algorithm.clone(), tiles: current.tiles, instrs, spans }
}

/// Synthetic times: each rank's spans one step apart in order, and a receive no earlier than a step after the
/// send it takes, repeated until nothing moves (every wait goes forward in time, so the arrows do).
fn lay_out(parts: &mut [RankTrace]) {
    let total: usize = parts.iter().flat_map(|p| &p.calls).map(|c| c.spans.len()).sum();
    for _ in 0..=total {
        // When each message was sent, by (call, sender, receiver, channel, tile, place).
        let mut sent: HashMap<(u64, u32, u32, u8, u32, u32), u64> = HashMap::new();
        for part in parts.iter() {
            for call in &part.calls {
                for span in call.spans.iter().filter(|s| s.waiting.is_none()) {
                    let instr = &call.instrs[span.instr as usize];
                    if let Some(to) = instr.send_to {
                        let key = (call.seq, part.rank, to, instr.channel, span.tile, instr.send_pos);
                        sent.insert(key, span.start_ns);
                    }
                }
            }
        }
        let mut moved = false;
        for part in parts.iter_mut() {
            let rank = part.rank;
            for call in &mut part.calls {
                let mut earliest = 0;
                for span in &mut call.spans {
                    let instr = &call.instrs[span.instr as usize];
                    let after_send = instr.recv_from.and_then(|from| {
                        sent.get(&(call.seq, from, rank, instr.channel, span.tile, instr.recv_pos)).map(|t| t + STEP_NS)
                    });
                    let start = earliest.max(after_send.unwrap_or(0)).max(span.start_ns);
                    moved |= start != span.start_ns;
                    (span.start_ns, span.end_ns) = (start, start + SPAN_NS);
                    earliest = start + STEP_NS;
                }
            }
        }
        if !moved {
            return;
        }
    }
}
