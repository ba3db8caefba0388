//! The host executor: runs a `Plan` on one rank, tile by tile. Within a tile every instruction starts as soon as
//! its dependencies are done and its connections allow (dataflow order, not program order); a message is reduced
//! or copied straight out of the sender's FIFO slot, and fused instructions write their result straight into the
//! next FIFO. No allocation, no lock, no syscall on the way unless a wait runs long (a call the run trace records
//! takes its rank's trace log once, and reads the clock twice per instruction run: `crate::trace`).

use super::plan::{Piece, Place, Plan, Step, NONE, NO_BUF};
use super::{answer_dump_request, Call, Executor};
use crate::error::RuntimeError;
use crate::link::{CallInfo, Link, LinkFault, Stamp};
use crate::recorder::{Current, InstrState};
use crate::trace::{TraceLog, MAX_TILES};
use crate::wait::{Backoff, Fault};
use collc_compiler::sched::Op;
use collc_kernels::host::{self, Factor};
use collc_kernels::{DataType, ReduceOp};

/// A plan and its links (`links[i]` is the connection `plan.links[i]` describes).
pub(crate) struct Host<L> {
    pub plan: Plan,
    pub links: Vec<L>,
}

impl<L: Link> Executor for Host<L> {
    fn plan_mut(&mut self) -> &mut Plan {
        &mut self.plan
    }

    fn run(&mut self, call: &Call) -> Result<(), RuntimeError> {
        run(&mut self.plan, &mut self.links, call)
    }

    fn refs_outstanding(&self) -> bool {
        self.links.iter().any(|link| link.refs_outstanding())
    }

    fn settle(&self, bootstrap: &dyn crate::link::Bootstrap, timeout: std::time::Duration) {
        settle_refs(&self.plan, &self.links, bootstrap, timeout)
    }

    fn snapshot(&self, seq: u64) -> Current {
        snapshot(&self.plan, seq)
    }
}

/// After a failed call, its failure announced, before its caller may free its buffers: waits until every receiver
/// of a message this rank carried by reference has released it or stopped (told of the failure, its executor
/// returns and it leaves), within `timeout`.
pub(crate) fn settle_refs<L: Link>(
    plan: &Plan,
    links: &[L],
    bootstrap: &dyn crate::link::Bootstrap,
    timeout: std::time::Duration,
) {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let reading: Vec<u32> = (links.iter().zip(&plan.links))
            .filter(|(link, end)| link.refs_outstanding() && bootstrap.health(&[end.to]).is_ok())
            .map(|(_, end)| end.to)
            .collect();
        if reading.is_empty() {
            return;
        }
        if std::time::Instant::now() > deadline {
            let ranks = reading.iter().map(|r| format!("rank {r}")).collect::<Vec<_>>().join(", ");
            crate::log::warn(
                crate::log::Subsys::Coll,
                format_args!("rank {}: returns from a failed call while {ranks} may still read its buffers", plan.rank),
            );
            return;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

/// The state of each instruction of the call in progress, at tile `plan.at_tile`.
fn snapshot(plan: &Plan, seq: u64) -> Current {
    snapshot_with(plan, seq, |i| {
        let waiting = plan.waiting.contains(&(i as u32));
        let state = match () {
            _ if plan.unmet[i] > 0 => "blocked",
            _ if waiting => "waiting",
            _ => "done",
        };
        (state, waiting)
    })
}

/// The flight recorder's view of the call in progress, each instruction's state and whether it waits for a
/// connection given by `state` (every host engine keeps them its own way).
pub(crate) fn snapshot_with(plan: &Plan, seq: u64, state: impl Fn(usize) -> (&'static str, bool)) -> Current {
    let instructions = (0..plan.steps.len())
        .map(|i| {
            let (state, waiting) = state(i);
            instr_state(plan, i, state, waiting)
        })
        .collect();
    Current { seq, algorithm: plan.algorithm.clone(), tile: plan.at_tile, tiles: plan.n_tiles, instructions }
}

/// Instruction `i` as the flight recorder shows it: `state`, and what it waits for when `waiting`.
pub(crate) fn instr_state(plan: &Plan, i: usize, state: &str, waiting: bool) -> InstrState {
    let (step, label) = (&plan.steps[i], &plan.labels[i]);
    let peer = |link: u16, sending: bool| {
        (link != NONE).then(|| {
            let end = &plan.links[link as usize];
            if sending {
                end.to
            } else {
                end.from
            }
        })
    };
    InstrState {
        index: label.index,
        op: label.op.name().to_string(),
        line: label.line,
        channel: step.channel,
        state: state.to_string(),
        waiting_for: waiting.then(|| waiting_for(plan, i)),
        recv_from: peer(step.recv, false),
        send_to: peer(step.send, true),
    }
}

/// How a tile's instructions run: the interpreter's rounds over its waiting list, or a plan compiled to native code
/// (`jit.rs`). `drive` does the rest, the same for both: tiles, waits, faults, timeouts and the epilogues.
pub(crate) trait Engine<L> {
    /// Tile `plan.at_tile` starts: every instruction waits for its dependencies again.
    fn start_tile(&mut self, plan: &mut Plan);
    /// Runs what can run of tile `lo..hi`, until nothing more can; each instruction that runs is a span of `trace`,
    /// when the call is recorded.
    #[allow(clippy::too_many_arguments)]
    fn round(
        &mut self,
        plan: &mut Plan,
        links: &mut [L],
        lo: usize,
        hi: usize,
        stamp: Stamp,
        call: &Call,
        trace: Option<&mut TraceLog>,
    ) -> Result<Round, RuntimeError>;
    /// The first instruction that waits for a connection, for the errors of a wait that failed.
    fn waiting_at(&self, plan: &Plan) -> usize;
    /// Each instruction's state, for the flight recorder.
    fn snapshot(&self, plan: &Plan, seq: u64) -> Current;
}

/// What a round of an engine did.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Round {
    /// Every instruction of the tile ran.
    Done,
    /// Some ran, and then none could: the wait starts over.
    Progressed,
    /// None could run.
    Stalled,
}

/// The interpreter: a list of the instructions whose dependencies are done, each tried in turn.
pub(crate) struct Interpret {
    remaining: usize,
}

impl<L: Link> Engine<L> for Interpret {
    fn start_tile(&mut self, plan: &mut Plan) {
        plan.unmet.copy_from_slice(&plan.unmet_at_start);
        plan.fired_on.fill(0);
        plan.waiting.clear();
        plan.waiting.extend_from_slice(&plan.roots);
        self.remaining = plan.steps.len();
    }

    fn round(
        &mut self,
        plan: &mut Plan,
        links: &mut [L],
        lo: usize,
        hi: usize,
        stamp: Stamp,
        call: &Call,
        trace: Option<&mut TraceLog>,
    ) -> Result<Round, RuntimeError> {
        // A loop for a recorded call and one for the others: a call not recorded checks for a trace log once a round.
        let progressed = match trace {
            None => self.fire_ready::<L, false>(plan, links, (lo, hi), stamp, call, None)?,
            Some(log) => self.fire_ready::<L, true>(plan, links, (lo, hi), stamp, call, Some(log))?,
        };
        Ok(match (self.remaining, progressed) {
            (0, _) => Round::Done,
            (_, true) => Round::Progressed,
            (_, false) => Round::Stalled,
        })
    }

    fn waiting_at(&self, plan: &Plan) -> usize {
        plan.waiting.first().copied().unwrap_or(0) as usize
    }

    fn snapshot(&self, plan: &Plan, seq: u64) -> Current {
        snapshot(plan, seq)
    }
}

impl Interpret {
    /// Tries every instruction of the waiting list in turn, once, those that run making their dependents wait in
    /// turn; whether any ran. With `TRACED`, each that runs is a span of `trace`.
    fn fire_ready<L: Link, const TRACED: bool>(
        &mut self,
        plan: &mut Plan,
        links: &mut [L],
        (lo, hi): (usize, usize),
        stamp: Stamp,
        call: &Call,
        mut trace: Option<&mut TraceLog>,
    ) -> Result<bool, RuntimeError> {
        let mut progressed = false;
        let mut w = 0;
        while w < plan.waiting.len() {
            let i = plan.waiting[w];
            let log = if TRACED { trace.as_deref_mut() } else { None };
            if !try_fire(plan, links, i as usize, lo, hi, stamp, call, log)? {
                w += 1;
                continue;
            }
            if let Some(log) = trace.as_deref_mut().filter(|_| TRACED) {
                log.close(i as usize, plan.at_tile);
            }
            plan.waiting.remove(w);
            self.remaining -= 1;
            progressed = true;
            let (start, end) = (plan.dependents_start[i as usize], plan.dependents_start[i as usize + 1]);
            for d in start..end {
                let dependent = plan.dependents[d as usize];
                plan.unmet[dependent as usize] -= 1;
                if plan.unmet[dependent as usize] == 0 {
                    plan.waiting.push(dependent);
                }
            }
        }
        Ok(progressed)
    }
}

fn run<L: Link>(plan: &mut Plan, links: &mut [L], call: &Call) -> Result<(), RuntimeError> {
    drive(plan, links, &mut Interpret { remaining: 0 }, call)
}

/// Runs a call's tiles on `engine`, waiting where nothing can run (spinning, then yielding, then sleeping), with the
/// faults of peers, mismatched calls and timeouts made errors naming the instruction; then flushes the links and
/// applies the epilogues (`avg`, PreMulSum's factor on what no message touched).
pub(crate) fn drive<L: Link, E: Engine<L>>(
    plan: &mut Plan,
    links: &mut [L],
    engine: &mut E,
    call: &Call,
) -> Result<(), RuntimeError> {
    let stamp = Stamp { seq: call.seq, fingerprint: plan.fingerprint };
    let mut wait = Backoff::new(call.timeout, call.spins);
    // A recorded call holds its rank's trace log for the whole call: no lock per instruction.
    let tracer = plan.tracer.as_ref().filter(|tracer| tracer.recording()).cloned();
    let mut log = tracer.as_deref().map(crate::trace::Tracer::log);
    L::start(links, &call.info);
    for t in 0..plan.n_tiles {
        plan.at_tile = t;
        let lo = t * plan.tile;
        let hi = (lo + plan.tile).min(plan.capacity);
        engine.start_tile(plan);
        loop {
            let trace = log.as_deref_mut().filter(|_| t < MAX_TILES);
            match engine.round(plan, links, lo, hi, stamp, call, trace)? {
                Round::Done => break,
                Round::Progressed => {
                    wait.reset();
                    continue;
                }
                Round::Stalled => {}
            }
            let i = engine.waiting_at(plan);
            match L::progress(links, stamp, wait.may_sleep()) {
                Ok(()) => {}
                Err(LinkFault::Peer(peer, how)) => {
                    // A connection that closed may be the echo of another rank's failure, which the bootstrap is
                    // about to announce: a moment for it, so the error names the rank where it began (or the
                    // mismatch it stopped for).
                    let (peer, how) = announced_failure(call, &plan.peers).unwrap_or((peer, how));
                    if let Some(mismatch) = published_mismatch(plan, call, 0..plan.n_ranks) {
                        return Err(mismatch);
                    }
                    let (rank, what, at) = (plan.rank, describe(plan, i), format!("tile {t}"));
                    return Err(RuntimeError::PeerFailed { rank, what, at, peer, how });
                }
                Err(LinkFault::Mismatch { peer, theirs, call: info }) => {
                    return Err(mismatch(plan, peer, theirs, info, stamp, call))
                }
            }
            let checked = wait.idle(|| {
                answer_dump_request(call, || engine.snapshot(plan, call.seq));
                let health = call.bootstrap.health(&plan.peers);
                // After the health check: a rank that aborted over a mismatch published its call before. While all
                // is well, only the ranks this one waits on matter.
                let everyone = 0..if health.is_ok() { 0 } else { plan.n_ranks };
                if let Some(mismatch) = published_mismatch(plan, call, plan.peers.iter().copied().chain(everyone)) {
                    return Err(mismatch);
                }
                health.map_err(|(peer, how)| {
                    let (rank, what, at) = (plan.rank, describe(plan, i), format!("tile {t}"));
                    RuntimeError::PeerFailed { rank, what, at, peer, how }
                })
            });
            match checked {
                Ok(()) => {}
                Err(Fault::Peer(error)) => return Err(error),
                Err(Fault::Timeout(waited)) => {
                    let (rank, what, at, seconds) =
                        (plan.rank, describe(plan, i), format!("tile {t}"), waited.as_secs_f64());
                    let (waiting_for, waits_on) = (waiting_for(plan, i), waits_on(plan, i));
                    return Err(RuntimeError::Timeout { rank, what, at, seconds, waiting_for, waits_on });
                }
            }
        }
    }
    wait.reset();
    while !L::flushed(links) {
        // Every instruction ran; the last one's messages are still on their way out (or, by reference, being read).
        let what = || format!("{}, the end of call #{}", describe(plan, plan.steps.len().saturating_sub(1)), call.seq);
        // What moves them may find their receiver gone: that is the error, not a timeout of this rank's.
        if let Err(LinkFault::Peer(peer, how)) = L::progress(links, stamp, wait.may_sleep()) {
            let (peer, how) = announced_failure(call, &plan.peers).unwrap_or((peer, how));
            let (rank, at) = (plan.rank, "the last tile".to_string());
            return Err(RuntimeError::PeerFailed { rank, what: what(), at, peer, how });
        }
        if let Err(fault) = wait.idle(|| call.bootstrap.health(&plan.peers)) {
            // The first connection still holding messages names the rank that did not take them.
            let held = (0..links.len()).find(|&l| !L::flushed(&mut links[l..l + 1])).map(|l| plan.links[l]);
            let waiting_for = match held {
                Some(end) => {
                    format!("its last messages to rank {} on channel {} to leave this rank", end.to, end.channel)
                }
                None => "its last messages to leave this rank".to_string(),
            };
            let waits_on = held.map(|end| end.to);
            return Err(fault.into_error((plan.rank, what(), "the last tile".into()), waiting_for, waits_on));
        }
    }
    if plan.op == ReduceOp::Avg && plan.collective.reduces() {
        finish_avg(plan)?;
    }
    if let Some(factor) = &plan.factor {
        let base = plan.bases[plan.output.0 as usize];
        for range in &plan.unscaled {
            let at = base.wrapping_add(range.start * plan.elem);
            // SAFETY: the range lies inside the output window, inside the caller's buffer (checked when the call
            // started); in place on itself, which `apply` allows.
            unsafe { factor.apply(at, at, range.len()) };
        }
    }
    Ok(())
}

/// A failure the bootstrap announces within 100 ms, if any.
fn announced_failure(call: &Call, peers: &[u32]) -> Option<(u32, String)> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(100);
    loop {
        if let Err(failure) = call.bootstrap.health(peers) {
            return Some(failure);
        }
        if std::time::Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

fn finish_avg(plan: &mut Plan) -> Result<(), RuntimeError> {
    let (buf, range) = plan.output.clone();
    let base = plan.bases[buf as usize];
    // SAFETY: the output window lies inside the caller's buffer, checked when the call started.
    let bytes = unsafe {
        std::slice::from_raw_parts_mut(base.add(range.start * plan.elem), (range.end - range.start) * plan.elem)
    };
    collc_kernels::reference::finish_avg(plan.dtype, bytes, plan.n_ranks as usize)
        .map_err(|source| RuntimeError::Kernel { rank: plan.rank, index: 0, source })
}

/// `rank 1 instruction #4 RecvReduceSend (allreduce/ring line 12)`.
pub(crate) fn describe(plan: &Plan, i: usize) -> String {
    let Some(label) = plan.labels.get(i.min(plan.labels.len().saturating_sub(1))) else {
        return format!("its part of {} (no instructions)", plan.algorithm);
    };
    format!("instruction #{} {} ({} line {})", label.index, label.op.name(), plan.algorithm, label.line)
}

/// The rank instruction `i` waits for: the sender of what it receives, else the receiver it sends to.
pub(crate) fn waits_on(plan: &Plan, i: usize) -> Option<u32> {
    let step = plan.steps.get(i)?;
    match (step.recv, step.send) {
        (NONE, NONE) => None,
        (NONE, send) => Some(plan.links[send as usize].to),
        (recv, _) => Some(plan.links[recv as usize].from),
    }
}

pub(crate) fn waiting_for(plan: &Plan, i: usize) -> String {
    let Some(step) = plan.steps.get(i) else { return "nothing".into() };
    let mut what = Vec::new();
    if step.recv != NONE {
        let f = &plan.links[step.recv as usize];
        what.push(format!("a message from rank {} on channel {}", f.from, f.channel));
    }
    if step.send != NONE {
        let f = &plan.links[step.send as usize];
        what.push(format!("room on the connection to rank {} on channel {}", f.to, f.channel));
    }
    if what.is_empty() {
        what.push("its local dependencies".into());
    }
    what.join(" and ")
}

/// Runs step `i` on tile `lo..hi` if its connections allow; returns whether it ran. `trace` learns when its data
/// starts to move.
#[inline]
#[allow(clippy::too_many_arguments)]
fn try_fire<L: Link>(
    plan: &mut Plan,
    links: &mut [L],
    i: usize,
    lo: usize,
    hi: usize,
    stamp: Stamp,
    call: &Call,
    trace: Option<&mut TraceLog>,
) -> Result<bool, RuntimeError> {
    let step = plan.steps[i];
    let mut refs = false;
    let incoming = if step.recv != NONE {
        if plan.fired_on[step.recv as usize] != step.recv_pos {
            return Ok(false);
        }
        match links[step.recv as usize].peek() {
            None => return Ok(false),
            Some((got, data)) if got == stamp => {
                refs = links[step.recv as usize].peeked_refs() > 0;
                data
            }
            Some((got, _)) => {
                let (peer, info) = (plan.links[step.recv as usize].from, links[step.recv as usize].sender_call());
                return Err(mismatch(plan, peer, got, info, stamp, call));
            }
        }
    } else {
        std::ptr::null()
    };
    let outgoing = if step.send != NONE {
        if plan.fired_on[step.send as usize] != step.send_pos {
            return Ok(false);
        }
        match links[step.send as usize].reserve() {
            None => return Ok(false),
            Some(data) => data,
        }
    } else {
        std::ptr::null_mut()
    };
    if let Some(log) = trace {
        log.open();
    }
    let pieces = &plan.pieces[step.first_piece as usize..(step.first_piece + step.n) as usize];
    // Single copy: where the source's tile of each chunk is, when the receiver may read a whole tile there (it reads
    // as many elements as a message of bytes holds) and can read it in place.
    if step.by_reference
        && pieces.iter().all(|p| p.src.valid >= hi)
        && refs_bytes(step.n as usize, plan.factor.is_some()) <= plan.links[step.send as usize].slot_bytes
        && refer(plan, &links[step.send as usize], pieces, outgoing, lo, hi)
    {
        if let Some(factor) = &plan.factor {
            // SAFETY: the slot holds the factor and a flag a chunk after the addresses (checked above).
            unsafe { write_factor(outgoing, factor, pieces) };
        }
        links[step.send as usize].post_refs(stamp, step.n as usize);
        plan.fired_on[step.send as usize] += 1;
        return Ok(true);
    }
    if refs {
        // The sender's references become addresses in this process, once the step is sure to run (a message peeked
        // by a step that then found no room to send is peeked again), in the slot only this rank reads until it
        // releases it.
        for k in 0..step.n as usize {
            // SAFETY: the message holds one reference a chunk.
            unsafe {
                let at = (incoming as *mut u64).add(k);
                at.write(links[step.recv as usize].dereference(at.read()) as u64);
            }
        }
    }
    // SAFETY: `bases` point at buffers checked to hold every place the plan names; FIFO areas hold `n` tiles, or
    // (`refs`) the addresses of the sender's tiles, which stay as they are until the message is released.
    unsafe { execute(plan, &step, pieces, incoming, refs, outgoing, lo, hi) };
    // The message out first: it is what the next rank waits for.
    if step.send != NONE {
        // Every piece sits at its tile's stride; the last one holds at most this tile's elements.
        let len = (step.n as usize - 1) * plan.tile * plan.elem + (hi - lo) * plan.elem;
        links[step.send as usize].post(stamp, len);
        plan.fired_on[step.send as usize] += 1;
    }
    if step.recv != NONE {
        links[step.recv as usize].release();
        plan.fired_on[step.recv as usize] += 1;
    }
    Ok(true)
}

/// Writes into `slot` a reference to each piece's source tile; false (the slot left for the copy) as soon as the
/// link cannot refer to one of them in place (a buffer outside the sender's arena, across processes).
fn refer<L: Link>(plan: &Plan, link: &L, pieces: &[Piece], slot: *mut u8, lo: usize, hi: usize) -> bool {
    let bytes = (hi - lo) * plan.elem;
    for (k, piece) in pieces.iter().enumerate() {
        let Some(token) = link.reference(local(plan, piece.src, lo, hi).0, bytes) else { return false };
        // SAFETY: the reserved slot holds `n` references (the caller checked); `slot` is 64-byte aligned.
        unsafe { (slot as *mut u64).add(k).write(token) };
    }
    true
}

/// Bytes of a message by reference of `n` chunks: an address a chunk and, under PreMulSum, the sender's factor and
/// whether each chunk is its input as it came (the receiver multiplies those, by the sender's factor).
pub(crate) fn refs_bytes(n: usize, premul: bool) -> usize {
    n * 8 + if premul { 8 + n } else { 0 }
}

/// # Safety
/// `slot` holds `refs_bytes(pieces.len(), true)` bytes.
unsafe fn write_factor(slot: *mut u8, factor: &Factor, pieces: &[Piece]) {
    let at = slot.wrapping_add(pieces.len() * 8);
    // SAFETY: inside the slot (caller's contract).
    unsafe {
        std::ptr::copy_nonoverlapping(factor.element().as_ptr(), at, 8);
        for (k, piece) in pieces.iter().enumerate() {
            at.add(8 + k).write(u8::from(piece.src.raw));
        }
    }
}

/// The sender's factor of a message by reference of `n` chunks under PreMulSum, and the flags of its chunks.
///
/// # Safety
/// `slot` holds `refs_bytes(n, true)` bytes written by `write_factor`.
unsafe fn read_factor(slot: *const u8, n: usize, dtype: DataType) -> (Factor, *const u8) {
    let mut element = [0u8; 8];
    // SAFETY: inside the slot (caller's contract).
    unsafe { std::ptr::copy_nonoverlapping(slot.add(n * 8), element.as_mut_ptr(), 8) };
    (Factor::new(dtype, element), slot.wrapping_add(n * 8 + 8))
}

/// `dst = a (op) b`; under PreMulSum an operand with a factor is multiplied by it first.
///
/// # Safety
/// As `host::reduce`.
#[inline]
unsafe fn combine(
    dtype: DataType,
    op: ReduceOp,
    dst: *mut u8,
    a: (*const u8, Option<&Factor>),
    b: (*const u8, Option<&Factor>),
    n: usize,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match (a.1, b.1) {
            (None, None) => host::reduce(dtype, op, dst, a.0, b.0, n),
            _ => host::premul_sum(dtype, dst, a, b, n),
        }
    }
}

/// The bytes of `place` inside tile `lo..hi`, and how many elements of it are valid.
#[inline]
fn local(plan: &Plan, place: Place, lo: usize, hi: usize) -> (*mut u8, usize) {
    debug_assert!(place.buf != NO_BUF);
    let n = hi.min(place.valid).saturating_sub(lo);
    // SAFETY (for callers): offset + lo is inside the buffer whenever n > 0.
    let ptr = plan.bases[place.buf as usize].wrapping_add((place.offset + lo) * plan.elem);
    (ptr, n)
}

/// # Safety
/// `incoming`/`outgoing` are FIFO data areas of this step's message when it receives/sends (with `refs`, the
/// incoming one holds the addresses of the sender's tiles, one a chunk); `plan.bases` are valid.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn execute(
    plan: &Plan,
    step: &Step,
    pieces: &[Piece],
    incoming: *const u8,
    refs: bool,
    outgoing: *mut u8,
    lo: usize,
    hi: usize,
) {
    let (dtype, op, elem) = (plan.dtype, plan.op, plan.elem);
    let stride = plan.tile * elem;
    // PreMulSum: this rank's factor for its input as it came, and the sender's for a message by reference of its own.
    let own = plan.factor.as_ref();
    let theirs = match (refs, own) {
        // SAFETY: the sender wrote its factor after the addresses (`write_factor`), as this rank's plan has one too.
        (true, Some(_)) => Some(unsafe { read_factor(incoming, pieces.len(), dtype) }),
        _ => None,
    };
    let own_for = |place: Place| if place.raw { own } else { None };
    for (k, piece) in pieces.iter().enumerate() {
        let slot_in = match refs {
            // SAFETY: the message holds one address a chunk (caller's contract).
            true => unsafe { (incoming as *const *const u8).add(k).read() },
            false => incoming.wrapping_add(k * stride),
        };
        // SAFETY: the flags follow the factor, one a chunk.
        let in_factor =
            theirs.as_ref().and_then(|(factor, flags)| (unsafe { flags.add(k).read() } != 0).then_some(factor));
        let slot_out = outgoing.wrapping_add(k * stride);
        // SAFETY: every pointer below is inside its buffer or FIFO slot for the `n` elements used.
        unsafe {
            match step.op {
                Op::Send => {
                    let (src, n) = local(plan, piece.src, lo, hi);
                    match own_for(piece.src) {
                        Some(factor) => factor.apply(slot_out, src, n),
                        None => host::copy(slot_out, src, n * elem),
                    }
                }
                Op::Recv => {
                    let (dst, n) = local(plan, piece.dst, lo, hi);
                    match in_factor {
                        Some(factor) => factor.apply(dst, slot_in, n),
                        None => store(plan, piece.dst, dst, slot_in, n * elem),
                    }
                }
                Op::RecvReduceCopy => {
                    let (dst, n) = local(plan, piece.dst, lo, hi);
                    let (acc, _) = local(plan, piece.acc, lo, hi);
                    combine(dtype, op, dst, (acc.cast_const(), own_for(piece.acc)), (slot_in, in_factor), n);
                }
                Op::RecvReduceSend => {
                    let (acc, n) = local(plan, piece.acc, lo, hi);
                    combine(dtype, op, slot_out, (acc.cast_const(), own_for(piece.acc)), (slot_in, in_factor), n);
                }
                // The fused forms write two places from one read: in blocks small enough that the second write
                // reads what the first just touched from L1, not the message again from the other core.
                Op::RecvReduceCopySend => {
                    let (dst, n) = local(plan, piece.dst, lo, hi);
                    let (acc, _) = local(plan, piece.acc, lo, hi);
                    for (at, m) in blocks(n, elem) {
                        let (acc, slot_in) =
                            ((acc.add(at).cast_const(), own_for(piece.acc)), (slot_in.add(at), in_factor));
                        combine(dtype, op, slot_out.add(at), acc, slot_in, m);
                        store(plan, piece.dst, dst.add(at), slot_out.add(at), m * elem);
                    }
                }
                Op::RecvCopySend => {
                    let (dst, n) = local(plan, piece.dst, lo, hi);
                    // Forward the whole tile: a later rank may hold more of this chunk than this rank does.
                    for (at, m) in blocks(hi - lo, elem) {
                        let here = n.saturating_sub(at / elem).min(m);
                        if let Some(factor) = in_factor {
                            factor.apply(dst.add(at), slot_in.add(at), here);
                            factor.apply(slot_out.add(at), slot_in.add(at), m);
                            continue;
                        }
                        store(plan, piece.dst, dst.add(at), slot_in.add(at), here * elem);
                        host::copy(slot_out.add(at), slot_in.add(at), m * elem);
                    }
                }
                Op::Copy => {
                    let (dst, n) = local(plan, piece.dst, lo, hi);
                    let (src, m) = local(plan, piece.src, lo, hi);
                    match own_for(piece.src) {
                        Some(factor) => factor.apply(dst, src, n.min(m)),
                        None => store(plan, piece.dst, dst, src, n.min(m) * elem),
                    }
                }
                Op::Reduce => {
                    let (dst, n) = local(plan, piece.dst, lo, hi);
                    let (acc, _) = local(plan, piece.acc, lo, hi);
                    let (src, _) = local(plan, piece.src, lo, hi);
                    combine(
                        dtype,
                        op,
                        dst,
                        (acc.cast_const(), own_for(piece.acc)),
                        (src.cast_const(), own_for(piece.src)),
                        n,
                    );
                }
            }
        }
    }
}

/// Writes a result into `place`: with non-temporal stores when it is a user buffer of a message too large for the
/// caches (its lines would only be read from memory to be overwritten, and evict the data still to come).
///
/// # Safety
/// As `host::copy`.
#[inline]
unsafe fn store(plan: &Plan, place: Place, dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if plan.streaming && place.buf < 2 {
            host::copy_streaming(dst, src, len);
        } else {
            host::copy(dst, src, len);
        }
    }
}

/// Bytes per block of a fused instruction: well inside L1.
pub(crate) const FUSED_BLOCK_BYTES: usize = 16 << 10;

/// `(byte offset, elements)` of the blocks that cover `n` elements.
fn blocks(n: usize, elem: usize) -> impl Iterator<Item = (usize, usize)> {
    let per_block = (FUSED_BLOCK_BYTES / elem).max(1);
    (0..n).step_by(per_block).map(move |start| (start * elem, per_block.min(n - start)))
}

/// The error of a message from `peer` stamped `got` arriving in call `ours`; `info` is the peer's call when the link
/// carried it, else what the bootstrap knows of it. Each side is named with its call, where its schedule came from
/// (the peer's as it published it, when it has) and its fingerprint.
pub(crate) fn mismatch(
    plan: &Plan,
    peer: u32,
    got: Stamp,
    info: Option<CallInfo>,
    ours: Stamp,
    call: &Call,
) -> RuntimeError {
    let theirs = info.unwrap_or_else(|| call.bootstrap.call_of(peer));
    let peer_info = (theirs.seq == got.seq).then_some(theirs);
    let source = call.bootstrap.source_of(peer, got.fingerprint);
    RuntimeError::Mismatch {
        rank: plan.rank,
        peer,
        ours: describe_call(ours, Some(call.info), Some(&plan.source)),
        theirs: describe_call(got, peer_info, source.as_deref()),
    }
}

/// `call #3: allreduce float sum count 1000 root 0 out-of-place with ring.sched (.sched file; schedule ...),
/// fingerprint ...`, with what is known of the call.
fn describe_call(stamp: Stamp, info: Option<CallInfo>, source: Option<&str>) -> String {
    let mut text = format!("call #{}", stamp.seq);
    if let Some(info) = info {
        text += &format!(": {}", crate::link::describe_kind(info.kind, info.count, info.root));
    }
    if let Some(source) = source {
        text += &format!(" with {source}");
    }
    text + &format!(", fingerprint {:016x}", stamp.fingerprint)
}

/// One of `ranks` whose published call is this one (same number) with another fingerprint: it runs another shape or
/// another schedule, whether or not any of its messages has come (its connections need not be this rank's). `None`
/// while the bootstrap knows of none (over tcp, a peer's call is known once it aborted).
pub(crate) fn published_mismatch(
    plan: &Plan,
    call: &Call,
    ranks: impl IntoIterator<Item = u32>,
) -> Option<RuntimeError> {
    let ours = Stamp { seq: call.seq, fingerprint: plan.fingerprint };
    ranks.into_iter().filter(|&peer| peer != plan.rank).find_map(|peer| {
        let theirs = call.bootstrap.call_of(peer);
        let got = Stamp { seq: theirs.seq, fingerprint: theirs.fingerprint };
        (got.seq == ours.seq && got.fingerprint != ours.fingerprint)
            .then(|| mismatch(plan, peer, got, Some(theirs), ours, call))
    })
}
