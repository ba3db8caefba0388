//! Runs the resolved statements for one binding, emitting transfers; checks operands and races inside a step.

use super::bind::Bound;
use super::eval::{Machine, Sweep};
use super::resolve::{RBufRef, RExpr, RStmt, RTransfer, Resolver};
use crate::collective::Collective;
use crate::diag::{Error, Errors};
use crate::fxhash::FxBuildHasher;
use crate::ir::{Buf, Loc, Program, ScratchBuf, Transfer, TransferKind};
use crate::sched::MAX_SPANS;
use crate::Limits;
use collc_grammar::ast::{Algorithm, Item, Span};
use std::collections::{HashMap, HashSet};

struct Exec<'a> {
    machine: Machine<'a>,
    limits: &'a Limits,
    collective: Collective,
    n_ranks: u32,
    chunks: u32,
    buffer_sizes: Vec<u32>,
    scratch_names: Vec<String>,
    transfers: Vec<Transfer>,
    max_count: u32,
    step: u32,
    in_step: bool,
    errors: Vec<Error>,
    reported: HashSet<(Span, &'static str)>,
    spans: Vec<Span>,
    /// Chunk slots per rank in the shared view plus scratch, and where each scratch buffer starts.
    slots_per_rank: u32,
    scratch_base: Vec<u32>,
    /// A step's read and written slots, kept for the next step.
    step_keys: (Vec<u64>, Vec<u64>),
    /// The per-expression values of a batched loop (`Exec::batch`), kept for the next one.
    batch_values: [Vec<i64>; 7],
    /// Who touched each slot of a step with a race (a small table that stays in cache).
    step_access: HashMap<usize, StepAccess, FxBuildHasher>,
}

type Result<T> = std::result::Result<T, Error>;

/// Loops of one transfer with at least this many iterations are lowered in a batch (`Exec::batch`); below, the
/// batch's set-up costs more than it saves. At most this many, to bound the batch's memory.
const BATCH_MIN: usize = 8;
const BATCH_MAX: usize = 1 << 20;

pub(crate) fn run(
    algo: &Algorithm,
    collective: Collective,
    bound: Bound,
    limits: &Limits,
) -> std::result::Result<Program, Errors> {
    let scratch_names: Vec<String> = bound.scratch.iter().map(|(n, _)| n.clone()).collect();
    let mut resolver = Resolver::new(&bound.globals, &bound.fn_names, &scratch_names);
    resolver.spans.push(algo.name.span);
    let stmts: Vec<&collc_grammar::ast::Stmt> =
        algo.items.iter().filter_map(|i| if let Item::Stmt(s) = i { Some(s) } else { None }).collect();
    let body = resolver.block(&stmts.into_iter().cloned().collect::<Vec<_>>())?;
    if let Some(&span) = resolver.spans.get(MAX_SPANS) {
        return Err(Error::new(
            "collc::lower::limit",
            format!("the algorithm has more than {} transfer statements", MAX_SPANS - 1),
            "write repeated transfers as a loop",
        )
        .at(span, "one too many")
        .into());
    }
    let n_ranks = bound.n_ranks;
    let (in_chunks, out_chunks) = collective.buffer_chunks(n_ranks, bound.chunks);
    let mut buffer_sizes = vec![in_chunks, out_chunks];
    buffer_sizes.extend(bound.scratch.iter().map(|(_, n)| *n));
    let mut exec = Exec {
        machine: Machine {
            fns: &bound.fns,
            globals: bound.values.clone(),
            fuel: limits.max_eval_steps,
            depth: 0,
            limits,
        },
        limits,
        collective,
        n_ranks,
        chunks: bound.chunks,
        buffer_sizes,
        scratch_names: scratch_names.clone(),
        transfers: Vec::new(),
        max_count: 0,
        step: 0,
        in_step: false,
        errors: Vec::new(),
        reported: HashSet::new(),
        spans: std::mem::take(&mut resolver.spans),
        slots_per_rank: 0,
        scratch_base: Vec::new(),
        step_keys: (Vec::new(), Vec::new()),
        batch_values: Default::default(),
        step_access: HashMap::default(),
    };
    let mut next = in_chunks.max(out_chunks);
    for (_, size) in &bound.scratch {
        exec.scratch_base.push(next);
        next += size;
    }
    exec.slots_per_rank = next;
    let mut frame = vec![0i64; resolver.frame_size as usize];
    let outcome = exec.block(&body, &mut frame);
    if let Err(e) = outcome {
        exec.errors.push(e);
    }
    if !exec.errors.is_empty() {
        return Err(Errors(exec.errors));
    }
    let params = bound.globals.iter().cloned().zip(bound.values.iter().copied()).collect();
    // The list grew by doubling: the unused end goes back (for a list of hundreds of megabytes, a remap).
    exec.transfers.shrink_to_fit();
    Ok(Program {
        name: algo.name.name.clone(),
        collective,
        n_ranks,
        chunks: bound.chunks,
        pipeline: bound.pipeline,
        root: bound.root,
        peer: bound.peer,
        params,
        scratch: bound.scratch.into_iter().map(|(name, chunks)| ScratchBuf { name, chunks }).collect(),
        n_steps: exec.step,
        max_count: exec.max_count,
        transfers: exec.transfers,
        spans: exec.spans,
    })
}

impl Exec<'_> {
    fn block(&mut self, stmts: &[RStmt], frame: &mut [i64]) -> Result<()> {
        for stmt in stmts {
            self.stmt(stmt, frame)?;
            if self.errors.len() >= self.limits.max_errors {
                return Ok(());
            }
        }
        Ok(())
    }

    fn stmt(&mut self, stmt: &RStmt, frame: &mut [i64]) -> Result<()> {
        match stmt {
            RStmt::Let { slot, value } => frame[*slot as usize] = self.machine.eval(value, frame)?,
            RStmt::For { slot, start, end, by, body } => {
                let (mut i, end_value) = (self.machine.eval(start, frame)?, self.machine.eval(end, frame)?);
                let by_value = match by {
                    Some(b) => self.machine.eval(b, frame)?,
                    None => 1,
                };
                if by_value == 0 {
                    let span = by.as_ref().map_or(start.span(), |b| b.span());
                    return Err(Error::new(
                        "collc::lower::loop",
                        "a loop step of 0 never ends",
                        "use a positive or negative step",
                    )
                    .at(span, "this step is 0"));
                }
                // Each iteration costs fuel: a loop that runs more often than the fuel left fails now, not after
                // burning it (a bound of 10^12 took 4 s to reach the limit).
                let trips = trip_count(i, end_value, by_value);
                if trips > u128::from(self.machine.fuel) {
                    return Err(Error::new(
                        "collc::lower::limit",
                        format!(
                            "this loop runs {trips} times, more than the {} evaluation steps left (the limit is {})",
                            self.machine.fuel, self.limits.max_eval_steps
                        ),
                        "a loop bound is far larger than intended; raise the limit with --max-eval-steps (the \
                         transfers a program emits are limited too: --max-transfers)",
                    )
                    .at(end.span(), "this loop bound"));
                }
                if let [RStmt::Transfer(t)] = body.as_slice() {
                    let sweep = Sweep::up_to(*slot, i, by_value, trips);
                    if let Some(sweep) = sweep.filter(|s| (BATCH_MIN..=BATCH_MAX).contains(&s.n)) {
                        if self.batch(t, sweep, frame)? {
                            return Ok(());
                        }
                    }
                }
                while (by_value > 0 && i < end_value) || (by_value < 0 && i > end_value) {
                    // Each iteration costs fuel, so an empty loop with a huge bound still ends.
                    self.machine.fuel = self.machine.fuel.checked_sub(1).ok_or_else(|| {
                        Error::new(
                            "collc::lower::limit",
                            format!("evaluation took more than {} steps", self.limits.max_eval_steps),
                            "a loop bound is far larger than intended; raise the limit with --max-eval-steps",
                        )
                        .at(end.span(), "this loop bound")
                    })?;
                    frame[*slot as usize] = i;
                    self.block(body, frame)?;
                    i = match i.checked_add(by_value) {
                        Some(next) => next,
                        None => break,
                    };
                }
            }
            RStmt::If { cond, then_body, else_body } => {
                let branch = if self.machine.eval(cond, frame)? != 0 { then_body } else { else_body };
                self.block(branch, frame)?;
            }
            RStmt::Step { body, span } => {
                if self.in_step {
                    return Err(Error::new(
                        "collc::lower::step",
                        "a `step` inside another `step`",
                        "steps do not nest; move the inner transfers into the outer step or after it",
                    )
                    .at(*span, "nested step"));
                }
                let first = self.transfers.len();
                self.in_step = true;
                let result = self.block(body, frame);
                self.in_step = false;
                result?;
                if self.transfers.len() > first {
                    self.check_step_races(first);
                    self.step += 1;
                }
            }
            RStmt::Transfer(t) => {
                let transfer = self.transfer(t, frame)?;
                self.emit(t, transfer)?;
            }
        }
        Ok(())
    }

    // Inlined with `finish_transfer`, the transfer is stored straight into the program: built on the stack a field
    // at a time and copied as two 16-byte words, its second half (the packed locations) waited on the byte stores
    // (store forwarding fails); `perf annotate` put half of `emit`'s samples there. Lowering at p = 4096: 1.13-1.16 s
    // against 1.24-1.28 s.
    #[inline(always)]
    fn emit(&mut self, t: &RTransfer, transfer: Option<Transfer>) -> Result<()> {
        let Some(transfer) = transfer else { return Ok(()) };
        if self.transfers.len() >= self.limits.max_transfers {
            return Err(Error::new(
                "collc::lower::limit",
                format!("the program emits more than {} transfers", self.limits.max_transfers),
                "check the loop bounds; raise the limit with --max-transfers",
            )
            .at(t.span, "emitted here"));
        }
        self.max_count = self.max_count.max(transfer.count);
        self.transfers.push(transfer);
        if !self.in_step {
            self.step += 1;
        }
        Ok(())
    }

    /// A loop whose body is one transfer, all iterations at once: each of its expressions is evaluated over the
    /// loop's range in one pass (`Machine::eval_batch`), then each iteration's transfer is checked and emitted in
    /// order, as the iteration-at-a-time path does; most of lowering's time went to walking the expressions again
    /// for every iteration. `Ok(false)` (nothing done) when an expression has a call, a builtin or a conditional, when
    /// some iteration's arithmetic fails, or when the fuel would run out: the caller then runs the loop one iteration at a
    /// time, which reports errors exactly as always.
    fn batch(&mut self, t: &RTransfer, sweep: Sweep, frame: &mut [i64]) -> Result<bool> {
        // Where each expression's values go in `batch_values`.
        const FROM: usize = 0;
        const TO: usize = 1;
        const CHANNEL: usize = 2;
        const SRC_START: usize = 3;
        const SRC_END: usize = 4;
        const DST_START: usize = 5;
        const DST_END: usize = 6;
        let exprs: [Option<&RExpr>; 7] = [
            Some(&t.from),
            Some(&t.to),
            t.channel.as_ref(),
            Some(&t.src.start),
            t.src.end.as_ref(),
            t.dst.as_ref().map(|d| &d.start),
            t.dst.as_ref().and_then(|d| d.end.as_ref()),
        ];
        let mut cost = 1u64;
        for expr in exprs.iter().flatten() {
            let Some(c) = Machine::batch_cost(expr) else { return Ok(false) };
            cost += c;
        }
        let fuel = cost.checked_mul(sweep.n as u64);
        if fuel.is_none_or(|f| f > self.machine.fuel) {
            return Ok(false);
        }
        let mut values = std::mem::take(&mut self.batch_values);
        for (expr, out) in exprs.iter().zip(values.iter_mut()) {
            out.clear();
            if let Some(expr) = expr {
                if self.machine.eval_batch(expr, frame, sweep, out).is_none() {
                    self.batch_values = values;
                    return Ok(false);
                }
            }
        }
        self.machine.fuel -= fuel.unwrap_or(0);
        // An absent expression has no values: the default stands in (channel 0, a one-chunk range).
        let value = |k: usize, e: usize, default: i64| values[e].get(k).copied().unwrap_or(default);
        for k in 0..sweep.n {
            let (from, to) = self.check_ranks(t, value(k, FROM, 0), value(k, TO, 0));
            let src_start = value(k, SRC_START, 0);
            let src = self.check_range(&t.src, src_start, value(k, SRC_END, src_start.saturating_add(1)));
            let dst = match &t.dst {
                Some(d) => {
                    let dst_start = value(k, DST_START, 0);
                    self.check_range(d, dst_start, value(k, DST_END, dst_start.saturating_add(1)))
                }
                None => src,
            };
            let transfer = self.finish_transfer(t, from, to, value(k, CHANNEL, 0), src, dst);
            // (An error ends lowering, so the lists need not be put back.)
            self.emit(t, transfer)?;
        }
        frame[sweep.slot as usize] = sweep.first + (sweep.n as i64 - 1) * sweep.by;
        self.batch_values = values;
        Ok(true)
    }

    /// Reports a problem with one transfer once per source location; the transfer is dropped.
    fn report(&mut self, key: &'static str, error: Error) {
        let span = error.primary_span().unwrap_or_default();
        if self.reported.insert((span, key)) {
            self.errors.push(error);
        }
    }

    fn rank(&mut self, value: i64, expr: &RExpr, what: &str) -> Option<u32> {
        if (0..self.n_ranks as i64).contains(&value) {
            return Some(value as u32);
        }
        let span = expr.span();
        let n = self.n_ranks;
        self.report(
            "rank",
            Error::new(
                "collc::lower::bounds",
                format!("{what} rank {value} is outside 0..{n}"),
                "rank expressions usually need `% p`",
            )
            .at(span, format!("evaluates to {value}")),
        );
        None
    }

    fn buf_name(&self, buf: Buf) -> &str {
        match buf {
            Buf::In => "in",
            Buf::Out => "out",
            Buf::Scratch(i) => &self.scratch_names[i as usize],
        }
    }

    fn buf_size(&self, buf: Buf) -> u32 {
        match buf {
            Buf::In => self.buffer_sizes[0],
            Buf::Out => self.buffer_sizes[1],
            Buf::Scratch(i) => self.buffer_sizes[2 + i as usize],
        }
    }

    /// Evaluates `buf[a]` or `buf[a..b]` to a location and a count, checking bounds.
    fn chunk_range(&mut self, r: &RBufRef, frame: &[i64]) -> Result<Option<(Loc, u32)>> {
        let start = self.machine.eval(&r.start, frame)?;
        let end = match &r.end {
            Some(e) => self.machine.eval(e, frame)?,
            None => start.saturating_add(1),
        };
        Ok(self.check_range(r, start, end))
    }

    /// `buf[start..end]` as a location and a count, if it lies inside the buffer (else reported).
    fn check_range(&mut self, r: &RBufRef, start: i64, end: i64) -> Option<(Loc, u32)> {
        let size = self.buf_size(r.buf);
        if start < 0 || end > size as i64 || start >= end {
            let name = self.buf_name(r.buf).to_string();
            let what = if start >= end {
                format!("the chunk range {start}..{end} of `{name}` is empty")
            } else {
                format!("chunks {start}..{end} are outside `{name}`, which has {size} chunks")
            };
            let help = format!(
                "`{name}` holds chunks 0..{size} here (chunks = {}); index expressions usually need `% {size}`",
                self.chunks
            );
            self.report(
                "chunk",
                Error::new("collc::lower::bounds", what, help).at(r.span, format!("{name}[{start}..{end}]")),
            );
            return None;
        }
        Some((Loc { buf: r.buf, index: start as u32 }, (end - start) as u32))
    }

    fn transfer(&mut self, t: &RTransfer, frame: &[i64]) -> Result<Option<Transfer>> {
        let from = self.machine.eval(&t.from, frame)?;
        let to = self.machine.eval(&t.to, frame)?;
        let channel = match &t.channel {
            Some(c) => self.machine.eval(c, frame)?,
            None => 0,
        };
        let (from, to) = self.check_ranks(t, from, to);
        let src = self.chunk_range(&t.src, frame)?;
        let dst = match &t.dst {
            Some(d) => self.chunk_range(d, frame)?,
            None => src,
        };
        Ok(self.finish_transfer(t, from, to, channel, src, dst))
    }

    /// The transfer's two ranks, if inside 0..p (else reported).
    fn check_ranks(&mut self, t: &RTransfer, from: i64, to: i64) -> (Option<u32>, Option<u32>) {
        let is_send = matches!(t.kind, TransferKind::Send { .. });
        (self.rank(from, &t.from, if is_send { "source" } else { "the" }), self.rank(to, &t.to, "destination"))
    }

    /// The checks of a transfer whose ranks and ranges are known (each `None` was reported), and the transfer.
    #[inline(always)]
    fn finish_transfer(
        &mut self,
        t: &RTransfer,
        from: Option<u32>,
        to: Option<u32>,
        channel: i64,
        src: Option<(Loc, u32)>,
        dst: Option<(Loc, u32)>,
    ) -> Option<Transfer> {
        let is_send = matches!(t.kind, TransferKind::Send { .. });
        let (Some(from), Some(to), Some((src, count)), Some((dst, dst_count))) = (from, to, src, dst) else {
            return None;
        };
        if !(0..self.limits.max_channels as i64).contains(&channel) {
            self.report(
                "channel",
                Error::new(
                    "collc::lower::bounds",
                    format!("channel {channel} is outside 0..{}", self.limits.max_channels),
                    "use a channel number from 0 to 31",
                )
                .at(t.span, "this transfer"),
            );
            return None;
        }
        if count != dst_count {
            self.report(
                "count",
                Error::new(
                    "collc::lower::count",
                    format!("sends {count} chunks into {dst_count}"),
                    "source and destination ranges must have the same length",
                )
                .at(t.span, "this transfer"),
            );
            return None;
        }
        if src.index != dst.index && src.index % self.chunks != dst.index % self.chunks {
            let (a, b) = (src.index % self.chunks, dst.index % self.chunks);
            self.report(
                "position",
                Error::new(
                    "collc::lower::position",
                    format!("moves chunk position {a} of a block into position {b} ({} chunks per block)", self.chunks),
                    format!(
                        "a chunk keeps its position in its block everywhere it goes, since chunk sizes differ by one \
                         element when the count does not divide evenly; index every buffer (in, out, scratch) so \
                         that chunk c lands at a multiple of {} plus c",
                        self.chunks
                    ),
                )
                .at(t.span, "this transfer"),
            );
            return None;
        }
        if is_send && from == to {
            self.report(
                "self",
                Error::new(
                    "collc::lower::self_send",
                    format!("rank {from} sends to itself"),
                    "use `copy SRC to DST on RANK` for a local move",
                )
                .at(t.span, "this send"),
            );
            return None;
        }
        if !is_send && src.buf == dst.buf && src.index < dst.index + count && dst.index < src.index + count {
            self.report(
                "overlap",
                Error::new(
                    "collc::lower::overlap",
                    "source and destination overlap",
                    "a local copy or reduce needs disjoint chunk ranges",
                )
                .at(t.span, "this transfer"),
            );
            return None;
        }
        Some(Transfer {
            kind: t.kind,
            src,
            dst,
            count,
            from,
            to,
            channel: channel as u8,
            step: self.step,
            // `lower` stopped before running a program of more than `MAX_SPANS` transfer statements.
            span: t.span_id as u16,
        })
    }
}

/// `rank 1 -> rank 2` for a send, `on rank 1` for a local copy or reduce: tells apart iterations of one statement.
fn endpoints(t: &Transfer) -> String {
    match t.kind {
        TransferKind::Send { .. } => format!("rank {} -> rank {}", t.from, t.to),
        _ => format!("on rank {}", t.from),
    }
}

/// Who touched one chunk slot (in the shared in-place view) during the current step: a writer and two distinct
/// readers are enough to find a conflicting pair whenever one exists.
#[derive(Clone, Copy)]
struct StepAccess {
    writer: u32,
    readers: [u32; 2],
}

const NOBODY: u32 = u32::MAX;

impl Exec<'_> {
    /// Index of a slot of the shared (in-place) view, where `in` and `out` alias as NCCL lays them out.
    fn slot(&self, rank: u32, loc: Loc, offset: u32) -> usize {
        let (in_off, out_off) = self.collective.in_place_offsets(rank, self.chunks);
        let base = match loc.buf {
            Buf::In => in_off,
            Buf::Out => out_off,
            Buf::Scratch(i) => self.scratch_base[i as usize],
        };
        (rank * self.slots_per_rank + base + loc.index + offset) as usize
    }

    /// A slot written and read (or written twice) by two transfers of one step is a race in either placement.
    ///
    /// Most steps have none, so sorted lists of the step's reads and writes first show whether a written slot is
    /// written again or read (a transfer never touches one slot twice: self-sends and overlapping local transfers
    /// are rejected before this); only a step where one is goes through the table that finds and reports the pairs.
    /// The lists are kept apart because each is mostly in order already (transfers come rank by rank), which the
    /// run-adaptive stable sort finishes in close to one pass.
    fn check_step_races(&mut self, first: usize) {
        let (mut reads, mut writes) = std::mem::take(&mut self.step_keys);
        reads.clear();
        writes.clear();
        for t in &self.transfers[first..] {
            for k in 0..t.count {
                reads.push(self.slot(t.from, t.src, k) as u64);
                writes.push(self.slot(t.to, t.dst, k) as u64);
            }
        }
        reads.sort();
        writes.sort();
        let written_twice = writes.windows(2).any(|w| w[0] == w[1]);
        let suspect = written_twice || sorted_lists_meet(&reads, &writes);
        self.step_keys = (reads, writes);
        if suspect {
            self.report_step_races(first);
        }
    }

    fn report_step_races(&mut self, first: usize) {
        self.step_access.clear();
        for i in first..self.transfers.len() {
            let t = self.transfers[i];
            for k in 0..t.count {
                self.access(self.slot(t.from, t.src, k), i as u32, false);
                self.access(self.slot(t.to, t.dst, k), i as u32, true);
            }
        }
    }

    fn access(&mut self, slot: usize, transfer: u32, write: bool) {
        let entry = self.step_access.entry(slot).or_insert(StepAccess { writer: NOBODY, readers: [NOBODY; 2] });
        let other = |o: u32| o != NOBODY && o != transfer;
        // (the writer, the other transfer, whether the other one writes too)
        let conflict = match (write, entry.readers.into_iter().find(|&r| other(r))) {
            _ if other(entry.writer) && write => Some((transfer, entry.writer, true)),
            _ if other(entry.writer) => Some((entry.writer, transfer, false)),
            (true, Some(reader)) => Some((transfer, reader, false)),
            _ => None,
        };
        if write {
            entry.writer = transfer;
        } else if entry.readers[0] == NOBODY {
            entry.readers[0] = transfer;
        } else if entry.readers[0] != transfer && entry.readers[1] == NOBODY {
            entry.readers[1] = transfer;
        }
        if let Some((writer, other, other_writes)) = conflict {
            self.report_race(slot, writer, other, other_writes);
        }
    }

    fn report_race(&mut self, slot: usize, writer: u32, other: u32, other_writes: bool) {
        let (w, o) = (self.transfers[writer as usize], self.transfers[other as usize]);
        let verb = if other_writes { "writes" } else { "reads" };
        let rank = slot as u32 / self.slots_per_rank;
        let index = slot as u32 - self.slot(w.to, Loc { buf: w.dst.buf, index: 0 }, 0) as u32;
        let name = self.buf_name(w.dst.buf);
        let message =
            format!("race in one step: two transfers touch rank {rank}'s `{name}[{index}]` and one writes it");
        let error = Error::new(
            "collc::lower::race",
            message,
            "transfers in one `step` run concurrently; move one of them into a later step",
        )
        .at(self.spans[w.span as usize], format!("this transfer ({}) writes the slot", endpoints(&w)))
        .at(self.spans[o.span as usize], format!("this transfer ({}) {verb} it in the same step", endpoints(&o)));
        self.report("race", error);
    }
}

/// Whether two sorted lists share a value.
fn sorted_lists_meet(a: &[u64], b: &[u64]) -> bool {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let (x, y) = (a[i], b[j]);
        if x == y {
            return true;
        }
        // Without a branch on which is smaller: a ring's reads and writes alternate, which mispredicted half the
        // time (13% of the samples in `Exec::block` at p = 4096, perf).
        i += usize::from(x < y);
        j += usize::from(y < x);
    }
    false
}

/// How many times `for _ in start..end by by` runs (`by` is not 0).
fn trip_count(start: i64, end: i64, by: i64) -> u128 {
    let (span, by) = (i128::from(end) - i128::from(start), i128::from(by));
    if span == 0 || (span > 0) != (by > 0) {
        return 0;
    }
    (span.unsigned_abs()).div_ceil(by.unsigned_abs())
}

#[cfg(test)]
mod tests {
    use super::trip_count;

    #[test]
    fn trip_count_matches_the_loop_for_every_sign() {
        // What `for i in start..end by by` runs, counted one iteration at a time (as the loop itself steps).
        let counted = |start: i64, end: i64, by: i64| {
            let (mut i, mut n) = (start, 0u128);
            while (by > 0 && i < end) || (by < 0 && i > end) {
                n += 1;
                match i.checked_add(by) {
                    Some(next) => i = next,
                    None => break,
                }
            }
            n
        };
        for (start, end, by) in [
            (0, 10, 1),
            (0, 10, 3),
            (0, 9, 3),
            (10, 0, -1),
            (10, 0, -4),
            (0, 10, -1),
            (10, 0, 2),
            (5, 5, 1),
            (-7, 7, 5),
            (i64::MAX - 3, i64::MAX, 2),
            (i64::MIN + 3, i64::MIN, -2),
            (i64::MAX, i64::MIN, i64::MIN),
            (0, -1, i64::MIN),
        ] {
            assert_eq!(trip_count(start, end, by), counted(start, end, by), "{start}..{end} by {by}");
        }
        assert_eq!(trip_count(0, 1_000_000_000_000, 1), 1_000_000_000_000);
        assert_eq!(trip_count(i64::MIN, i64::MAX, 1), u64::MAX as u128);
    }
}
