//! The run trace (`collc run --trace`, `Communicator::enable_tracing`): when each instruction of the traced calls
//! moved its data, per rank, recorded by every executor (the host interpreter, the JIT, the device twin), and the
//! part each rank hands over (`RankTrace`), which `chrome.rs` writes as one Chrome / Perfetto trace.
//!
//! Recording: a communicator's `Tracer` goes into each plan it prepares; in a call the communicator records
//! (`Communicator::trace_calls`), the executor locks the tracer's log once per call (the twin once per launch, for
//! every rank it runs) and reads the clock when an instruction starts moving data (its message and room are
//! there: what it waited for is the gap before) and when it is done. Nothing is allocated per instruction: spans
//! go into a vector of `MAX_SPANS` reserved with the tracer, and those past it are counted, not kept; only the
//! first `MAX_TILES` tiles of a call are recorded. A plan without a tracer, or a call not recorded, costs its
//! executor one `Option` check per instruction.

pub mod chrome;

use crate::exec::Plan;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Spans a rank keeps (32 bytes each, reserved up front: 2 MiB a rank).
pub const MAX_SPANS: usize = 1 << 16;
/// Tiles of a call recorded: a large message runs the schedule once per tile, and its first tiles show the pattern.
pub const MAX_TILES: usize = 4;
/// Calls a rank records; later ones are counted, not recorded.
pub const MAX_CALLS: usize = 4096;

/// Nanoseconds of `CLOCK_MONOTONIC`: one clock for every rank of a host, whether threads or processes.
pub fn now_ns() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid timespec to write; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// One rank's recorder: shared by its communicator, its plans and (twin) the thread that launches its blocks.
pub struct Tracer {
    rank: u32,
    n_ranks: u32,
    /// Whether the call in progress is recorded.
    recording: AtomicBool,
    log: Mutex<TraceLog>,
}

/// What the executors write: the spans of the recorded calls.
pub(crate) struct TraceLog {
    spans: Vec<Span>,
    calls: Vec<TracedCall>,
    dropped_spans: u64,
    dropped_calls: u64,
    /// When the instruction in progress started moving data.
    open: u64,
}

/// One instruction on one tile of the call recorded last.
#[derive(Clone, Copy)]
struct Span {
    call: u32,
    instr: u32,
    tile: u32,
    start: u64,
    end: u64,
}

struct TracedCall {
    seq: u64,
    call: String,
    algorithm: String,
    tiles: usize,
    instrs: Arc<[InstrInfo]>,
}

impl Tracer {
    pub fn new(rank: u32, n_ranks: u32) -> Arc<Tracer> {
        let log = TraceLog {
            spans: Vec::with_capacity(MAX_SPANS),
            calls: Vec::new(),
            dropped_spans: 0,
            dropped_calls: 0,
            open: 0,
        };
        Arc::new(Tracer { rank, n_ranks, recording: AtomicBool::new(false), log: Mutex::new(log) })
    }

    pub(crate) fn recording(&self) -> bool {
        self.recording.load(Ordering::Acquire)
    }

    pub(crate) fn log(&self) -> MutexGuard<'_, TraceLog> {
        self.log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Call `seq` (`call`, as the flight recorder names it) starts on `plan`: recorded when `record`, within
    /// `MAX_CALLS`.
    pub(crate) fn begin_call(&self, record: bool, seq: u64, call: String, plan: &mut Plan) {
        if !record {
            self.recording.store(false, Ordering::Release);
            return;
        }
        let mut log = self.log();
        let fits = log.calls.len() < MAX_CALLS;
        if fits {
            if plan.trace_instrs.is_none() {
                plan.trace_instrs = Some(instrs_of(plan));
            }
            let instrs = plan.trace_instrs.clone().expect("made above");
            let (algorithm, tiles) = (plan.algorithm.clone(), plan.n_tiles);
            log.calls.push(TracedCall { seq, call, algorithm, tiles, instrs });
        } else {
            log.dropped_calls += 1;
        }
        self.recording.store(fits, Ordering::Release);
    }

    /// Everything recorded so far, grouped by call, for the trace file; the log starts empty again.
    pub fn take(&self) -> RankTrace {
        let mut log = self.log();
        let mut calls: Vec<CallTrace> = (log.calls.drain(..))
            .map(|c| CallTrace {
                seq: c.seq,
                call: c.call,
                algorithm: c.algorithm,
                tiles: c.tiles,
                instrs: c.instrs.to_vec(),
                spans: Vec::new(),
            })
            .collect();
        for span in log.spans.drain(..) {
            let record = SpanRecord {
                instr: span.instr,
                tile: span.tile,
                start_ns: span.start,
                end_ns: span.end,
                waiting: None,
            };
            calls[span.call as usize].spans.push(record);
        }
        RankTrace {
            rank: self.rank,
            n_ranks: self.n_ranks,
            host: crate::log::host().to_string(),
            pid: std::process::id(),
            dropped_spans: std::mem::take(&mut log.dropped_spans),
            dropped_calls: std::mem::take(&mut log.dropped_calls),
            synthetic: false,
            calls,
        }
    }
}

impl TraceLog {
    /// The instruction about to run has what it waited for: its data moves from now.
    #[inline]
    pub(crate) fn open(&mut self) {
        self.open = now_ns();
    }

    /// Instruction `instr` of tile `tile` is done (it was `open`ed last).
    #[inline]
    pub(crate) fn close(&mut self, instr: usize, tile: usize) {
        if tile >= MAX_TILES {
            return;
        }
        if self.spans.len() == MAX_SPANS || self.calls.is_empty() {
            self.dropped_spans += 1;
            return;
        }
        let call = (self.calls.len() - 1) as u32;
        let (instr, tile, start, end) = (instr as u32, tile as u32, self.open, now_ns());
        self.spans.push(Span { call, instr, tile, start, end });
    }
}

/// Each instruction of `plan` as the trace names it.
fn instrs_of(plan: &Plan) -> Arc<[InstrInfo]> {
    let peer = |link: u16, sending: bool| {
        (link != crate::exec::NO_LINK).then(|| {
            let end = &plan.links[link as usize];
            if sending {
                end.to
            } else {
                end.from
            }
        })
    };
    (plan.steps.iter().zip(&plan.labels))
        .map(|(step, label)| InstrInfo {
            index: label.index,
            op: label.op.name().to_string(),
            channel: step.channel,
            line: label.line,
            operands: plan.operands_text(label),
            recv_from: peer(step.recv, false),
            recv_pos: step.recv_pos,
            send_to: peer(step.send, true),
            send_pos: step.send_pos,
        })
        .collect()
}

/// One rank's trace as it writes it (`FILE.rankN.json` of a process rank) or hands it to the writer.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RankTrace {
    pub rank: u32,
    pub n_ranks: u32,
    pub host: String,
    pub pid: u32,
    /// Spans past `MAX_SPANS`, and calls past `MAX_CALLS`, not recorded.
    pub dropped_spans: u64,
    pub dropped_calls: u64,
    /// Times made up to lay the instructions out in order (a flight-recorder dump has no clock).
    pub synthetic: bool,
    pub calls: Vec<CallTrace>,
}

/// One recorded call of a rank.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CallTrace {
    pub seq: u64,
    /// `allreduce float sum count 256 root 0 in-place`.
    pub call: String,
    pub algorithm: String,
    /// Tiles of the call (the first `MAX_TILES` recorded).
    pub tiles: usize,
    pub instrs: Vec<InstrInfo>,
    pub spans: Vec<SpanRecord>,
}

/// One instruction of a rank's plan: what its spans show, and its messages' places on their connections (the k-th
/// send of a connection in a tile is the k-th receive there).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct InstrInfo {
    pub index: usize,
    pub op: String,
    pub channel: u8,
    /// The `.coll` line, or the `.sched` line of a schedule file.
    pub line: usize,
    /// `src=out[1] dst=out[1] n=2`, as the `.sched` text writes them.
    pub operands: String,
    pub recv_from: Option<u32>,
    pub recv_pos: u32,
    pub send_to: Option<u32>,
    pub send_pos: u32,
}

/// Instruction `instrs[instr]` on one tile, from when it moved data to when it was done.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SpanRecord {
    pub instr: u32,
    pub tile: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    /// A span that never ended: what the instruction waits for (a hang, from the flight recorder's dumps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
}
