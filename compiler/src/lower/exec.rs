//! Runs the resolved statements for one binding, emitting transfers: `operands` checks each transfer's ranks and chunk
//! ranges, `races` the slots two transfers of one step touch.

use super::bind::Bound;
use super::eval::{Machine, Sweep};
use super::resolve::{RExpr, RStmt, RTransfer, Resolver};
use crate::collective::Collective;
use crate::diag::{Error, Errors};
use crate::fxhash::FxBuildHasher;
use crate::ir::{Program, ScratchBuf, Transfer};
use crate::sched::MAX_SPANS;
use crate::Limits;
use collc_grammar::ast::{Algorithm, Item, Span};
use races::StepAccess;
use std::collections::{HashMap, HashSet};

mod operands;
mod races;

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
    let mut exec = Exec::new(&bound, collective, limits, std::mem::take(&mut resolver.spans));
    let mut frame = vec![0i64; resolver.frame_size as usize];
    let outcome = exec.block(&body, &mut frame);
    if let Err(e) = outcome {
        exec.errors.push(e);
    }
    if !exec.errors.is_empty() {
        return Err(Errors(exec.errors));
    }
    let params = bound.globals.iter().cloned().zip(bound.values.iter().copied()).collect();
    let Exec { mut transfers, spans, step, max_count, .. } = exec;
    // The list grew by doubling: the unused end goes back (for a list of hundreds of megabytes, a remap).
    transfers.shrink_to_fit();
    Ok(Program {
        name: algo.name.name.clone(),
        collective,
        n_ranks: bound.n_ranks,
        chunks: bound.chunks,
        pipeline: bound.pipeline,
        root: bound.root,
        peer: bound.peer,
        params,
        scratch: bound.scratch.into_iter().map(|(name, chunks)| ScratchBuf { name, chunks }).collect(),
        n_steps: step,
        max_count,
        transfers,
        spans,
    })
}

impl<'a> Exec<'a> {
    /// The state for running `bound`'s statements: buffer sizes, and each rank's slots in the shared in-place view
    /// (`in`/`out` first, then each scratch buffer) that the race check indexes.
    fn new(bound: &'a Bound, collective: Collective, limits: &'a Limits, spans: Vec<Span>) -> Self {
        let (in_chunks, out_chunks) = collective.buffer_chunks(bound.n_ranks, bound.chunks);
        let mut buffer_sizes = vec![in_chunks, out_chunks];
        buffer_sizes.extend(bound.scratch.iter().map(|(_, n)| *n));
        let mut scratch_base = Vec::with_capacity(bound.scratch.len());
        let mut next = in_chunks.max(out_chunks);
        for (_, size) in &bound.scratch {
            scratch_base.push(next);
            next += size;
        }
        Exec {
            machine: Machine {
                fns: &bound.fns,
                globals: bound.values.clone(),
                fuel: limits.max_eval_steps,
                depth: 0,
                limits,
            },
            limits,
            collective,
            n_ranks: bound.n_ranks,
            chunks: bound.chunks,
            buffer_sizes,
            scratch_names: bound.scratch.iter().map(|(name, _)| name.clone()).collect(),
            transfers: Vec::new(),
            max_count: 0,
            step: 0,
            in_step: false,
            errors: Vec::new(),
            reported: HashSet::new(),
            spans,
            slots_per_rank: next,
            scratch_base,
            step_keys: (Vec::new(), Vec::new()),
            batch_values: Default::default(),
            step_access: HashMap::default(),
        }
    }
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
