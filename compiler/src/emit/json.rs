//! JSON form of a verified schedule (`collc build --emit json`), for tools that do not want to parse `.sched`.

use crate::sched::{Operand, Schedule};
use crate::verify::VerifiedSchedule;
use serde_json::{json, Value};

fn operand(sched: &Schedule, op: Operand, count: u32) -> Value {
    match op.get() {
        Some(Operand { buf, index }) => json!({ "buffer": sched.buffer(buf).name, "index": index, "count": count }),
        None => Value::Null,
    }
}

/// The schedule as a JSON value. `source` (may be empty) adds source lines.
pub fn to_json(verified: &VerifiedSchedule, source: &str) -> Value {
    let sched = verified.schedule();
    let ranks: Vec<Value> = sched
        .ranks
        .iter()
        .enumerate()
        .map(|(rank, program)| {
            let instrs: Vec<Value> = program
                .instrs
                .iter()
                .enumerate()
                .map(|(i, instr)| {
                    let span = sched.spans.get(instr.span as usize).copied().unwrap_or_default();
                    json!({
                        "op": instr.op.name(),
                        "count": instr.count,
                        "src": operand(sched, instr.src, instr.count),
                        "acc": operand(sched, instr.acc, instr.count),
                        "dst": operand(sched, instr.dst, instr.count),
                        "send_peer": instr.send_peer(),
                        "recv_peer": instr.recv_peer(),
                        "channel": instr.channel,
                        "deps": program.deps_of(i),
                        "span": [span.start, span.end],
                        "line": (!source.is_empty()).then(|| sched.line_of(source, instr.span.into())),
                    })
                })
                .collect();
            json!({ "rank": rank, "instructions": instrs })
        })
        .collect();
    json!({
        "algorithm": sched.algorithm,
        "collective": sched.collective,
        "placement": sched.placement,
        "n_ranks": sched.n_ranks,
        "chunks": sched.chunks,
        "root": sched.root,
        "peer": sched.peer,
        "params": sched.params.iter().map(|(k, v)| json!({"name": k, "value": v})).collect::<Vec<_>>(),
        "buffers": sched.buffers,
        "ranks": ranks,
    })
}
