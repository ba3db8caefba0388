//! The verifier: runs on the final schedule and is the only way to obtain a `VerifiedSchedule`.
//!
//! In place, operands naming `in` and `out` are first put onto the one buffer the call passes (`alias`), so the
//! checks below see one name per chunk of memory. Invariants checked, each in its own file, every error collected:
//! - `bounds`: operands inside their buffers, peers inside 0..p and not the rank itself, instruction shapes,
//!   a read operand either the destination's very range or apart from it, dependencies pointing to earlier
//!   instructions, `in` never written out of place.
//! - `matching`: every send has exactly one receive of the same size, same channel, same order.
//! - `races`: two instructions of one rank that touch one chunk slot, one writing, are ordered by dependencies.
//! - `deadlock`: a dataflow execution with bounded channels (`Limits::channel_slots` messages per connection)
//!   completes; if not, the wait-for cycle is printed.
//! - `postcondition`: symbolic execution of multisets of contributions gives exactly the collective's contract,
//!   with the multisets themselves or keyed afresh for each verification (`key`, `Limits::verification`).
//!
//! On a schedule that passed them, `single_copy` says which sends may be carried by reference (the memory model's
//! rule 8), which holds because `races` and `bounds` did.

mod alias;
mod bounds;
mod deadlock;
pub mod key;
mod matching;
mod postcondition;
mod races;
pub(crate) mod single_copy;
mod value;

pub use key::{Seed, Verdict, Verification, ERROR_BOUND_BITS, EXACT_AUTO_RANKS};
pub(crate) use matching::{Connection, Connections};

use crate::diag::{Error, Errors};
use crate::emit::SchedLines;
use crate::fxhash::FxHasher;
use crate::sched::Schedule;
use crate::Limits;
use std::hash::Hasher;
use std::ops::Deref;
use std::sync::OnceLock;

/// A schedule that passed every check, how its postcondition was checked, and the message slots per connection
/// its deadlock freedom was proved with. Emitters and the runtime accept nothing else.
#[derive(Clone, Debug)]
pub struct VerifiedSchedule {
    sched: Schedule,
    verdict: Verdict,
    channel_slots: u32,
    hash: OnceLock<u64>,
}

impl VerifiedSchedule {
    fn new(sched: Schedule, verdict: Verdict, limits: &Limits) -> Self {
        VerifiedSchedule { sched, verdict, channel_slots: limits.channel_slots, hash: OnceLock::new() }
    }

    pub fn schedule(&self) -> &Schedule {
        &self.sched
    }

    /// Exactly, or keyed with an error bound.
    pub fn verdict(&self) -> Verdict {
        self.verdict
    }

    /// The messages a connection holds before a send blocks, as the deadlock check assumed: a transport with fewer
    /// slots may deadlock on this schedule, one with more may not.
    pub fn channel_slots(&self) -> u32 {
        self.channel_slots
    }

    /// A hash of what the schedule does (header, buffers, every instruction and dependency; not its source spans)
    /// and the slot count: ranks whose schedules differ get different hashes. Computed on first use.
    pub fn hash(&self) -> u64 {
        *self.hash.get_or_init(|| schedule_hash(&self.sched, self.channel_slots))
    }

    pub fn into_schedule(self) -> Schedule {
        self.sched
    }

    /// For each instruction of `rank`: whether it is a `Send` whose source no later instruction of the rank writes,
    /// so its receiver may read it in place (the memory model's rule 8, docs/language.md §13).
    pub fn sources_that_stay(&self, rank: u32) -> Vec<bool> {
        single_copy::sources_that_stay(&self.sched.ranks[rank as usize])
    }
}

impl Deref for VerifiedSchedule {
    type Target = Schedule;

    fn deref(&self) -> &Schedule {
        &self.sched
    }
}

fn schedule_hash(sched: &Schedule, channel_slots: u32) -> u64 {
    let mut h = FxHasher::default();
    h.write(sched.algorithm.as_bytes());
    h.write(sched.collective.name().as_bytes());
    for word in [sched.placement as u32, sched.n_ranks, sched.chunks, sched.root, sched.peer, channel_slots] {
        h.write_u32(word);
    }
    for (name, value) in &sched.params {
        h.write(name.as_bytes());
        h.write_u64(*value as u64);
    }
    for buffer in &sched.buffers {
        h.write(buffer.name.as_bytes());
        h.write_u32(buffer.chunks);
    }
    for program in &sched.ranks {
        h.write_u64(program.len() as u64);
        for (i, instr) in program.instrs.iter().enumerate() {
            h.write_u64((instr.op as u64) << 8 | instr.channel as u64);
            h.write_u64(u64::from(instr.count) << 32 ^ u64::from(instr.send_peer));
            h.write_u32(instr.recv_peer);
            for operand in [instr.src, instr.acc, instr.dst] {
                h.write_u64(u64::from(operand.buf.0) << 32 | u64::from(operand.index));
            }
            let deps = program.deps_of(i);
            h.write_u64(deps.len() as u64);
            deps.iter().for_each(|&d| h.write_u32(d));
        }
    }
    h.finish()
}

/// Checks `sched` against every invariant. `source` (may be empty) is used for line numbers in notes. The
/// postcondition is checked as `limits.verification` says.
pub fn verify(mut sched: Schedule, source: &str, limits: &Limits) -> Result<VerifiedSchedule, Errors> {
    alias::onto_shared_buffer(&mut sched);
    verify_in(Context { sched: &sched, source, lines: None, limits })
        .map(|verdict| VerifiedSchedule::new(sched, verdict, limits))
}

/// `verify` for a schedule read from `.sched` text: diagnostics name and point at the instructions' lines and
/// columns in `text` (`emit::parse_sched_located` gives `lines`), not the `.coll` source the text came from.
pub fn verify_sched(
    mut sched: Schedule,
    text: &str,
    lines: &SchedLines,
    limits: &Limits,
) -> Result<VerifiedSchedule, Errors> {
    alias::onto_shared_buffer(&mut sched);
    let ctx = Context { sched: &sched, source: text, lines: Some(lines), limits };
    verify_in(ctx).map(|verdict| VerifiedSchedule::new(sched, verdict, limits))
}

fn verify_in(ctx: Context) -> Result<Verdict, Errors> {
    let mut errors = Vec::new();
    let tables = per_rank_checks(&ctx, &mut errors);
    let mut verdict = Verdict::Exact;
    if let (true, Some((connections, graph))) = (errors.is_empty(), tables) {
        match run_and_check(&ctx, connections, graph, &mut errors) {
            Ok(outcome) => verdict = outcome,
            Err(error) => errors.push(error),
        }
    }
    errors.truncate(ctx.limits.max_errors.max(1));
    match errors.is_empty() {
        true => Ok(verdict),
        false => Err(Errors(errors)),
    }
}

/// The symbolic execution (which finds deadlocks) and the postcondition, exactly or keyed as the limits say; a
/// deadlock or an exact run past its budget under `--exact` is the error.
fn run_and_check(
    ctx: &Context,
    connections: Connections,
    graph: deadlock::GraphBuilder,
    errors: &mut Vec<Error>,
) -> Result<Verdict, Error> {
    let sched = ctx.sched;
    let seed = match ctx.limits.verification {
        Verification::Keyed(seed) => Some(seed),
        Verification::Auto(seed) if sched.n_ranks > EXACT_AUTO_RANKS => Some(seed),
        Verification::Auto(_) | Verification::Exact => None,
    };
    let Some(seed) = seed else {
        let budget = value::ExactKey::new(key::EXACT_BUDGET);
        let finished = deadlock::simulate::<value::Exact>(ctx, &budget, connections, graph)?;
        if !budget.over_budget() {
            postcondition::check(ctx, &budget, &finished, Some(&finished), errors);
            return Ok(Verdict::Exact);
        }
        drop(finished);
        let Verification::Auto(seed) = ctx.limits.verification else {
            return Err(Error::new(
                "collc::verify::exact_budget",
                format!(
                    "exact verification of {} ranks needs more than {} contribution terms",
                    sched.n_ranks,
                    key::EXACT_BUDGET
                ),
                "verify without --exact: the keyed check's error bound is 2^-105",
            ));
        };
        let (connections, graph) = deadlock::tables(sched, ctx.limits.channel_slots);
        return keyed(ctx, seed, connections, graph, errors);
    };
    keyed(ctx, seed, connections, graph, errors)
}

fn keyed(
    ctx: &Context,
    seed: Seed,
    connections: Connections,
    graph: deadlock::GraphBuilder,
    errors: &mut Vec<Error>,
) -> Result<Verdict, Error> {
    let sched = ctx.sched;
    if u128::from(sched.n_ranks) >= value::COUNT_MAX {
        return Err(Error::new(
            "collc::verify::too_many_ranks",
            format!(
                "the keyed check counts contributions up to {}, fewer than {} ranks",
                value::COUNT_MAX - 1,
                sched.n_ranks
            ),
            "verify with --exact, or fewer ranks",
        ));
    }
    let (in_chunks, _) = sched.collective.buffer_chunks(sched.n_ranks, sched.chunks);
    let keys = key::Keys::new(seed, sched.n_ranks, in_chunks);
    let finished = deadlock::simulate::<value::Keyed>(ctx, &keys, connections, graph)?;
    postcondition::check(ctx, &keys, &finished, None, errors);
    Ok(Verdict::Keyed(seed))
}

/// Bounds, the connection table, the deadlock simulation's graph and races, rank by rank: each rank's instructions
/// are read from memory once for the four. Then matching, which needs every connection. Races and the tables only
/// look at ranks whose operands, and those of every rank before, are in bounds; the tables are returned only when
/// all are, and race errors are reported only then too, after matching's (as if each check ran over the whole
/// schedule in turn).
fn per_rank_checks(ctx: &Context, errors: &mut Vec<Error>) -> Option<(Connections, deadlock::GraphBuilder)> {
    if !bounds::check_header(ctx, errors) {
        return None;
    }
    let mut connections = matching::ConnectionsBuilder::new(ctx.sched);
    let mut graph = deadlock::GraphBuilder::new(ctx.sched, ctx.limits.channel_slots);
    let mut races = races::Races::new(ctx);
    let mut race_errors = Vec::new();
    for (rank, program) in ctx.sched.ranks.iter().enumerate() {
        let rank = rank as u32;
        bounds::check_rank(ctx, rank, program, errors);
        if errors.len() >= ctx.limits.max_errors {
            return None;
        }
        if errors.is_empty() {
            graph.add_rank(program, connections.add_rank(rank, program));
            if race_errors.len() < ctx.limits.max_errors {
                races.check_rank(ctx, rank, program, &mut race_errors);
            }
        }
    }
    if !errors.is_empty() {
        return None;
    }
    let connections = connections.finish();
    matching::check(ctx, &connections, errors);
    errors.extend(race_errors);
    Some((connections, graph))
}

/// What every check reads. `lines`, for a schedule read from `.sched` text (then `source`), locates each
/// instruction in that text.
pub(crate) struct Context<'a> {
    pub sched: &'a Schedule,
    pub source: &'a str,
    pub lines: Option<&'a SchedLines>,
    pub limits: &'a Limits,
}

/// An instruction: its rank and index there.
pub(crate) type At = (u32, usize);

impl Context<'_> {
    /// `rank 2 #5 RecvReduceCopy (line 12)`: how a check names one instruction.
    pub fn describe(&self, rank: u32, index: usize) -> String {
        let instr = &self.sched.ranks[rank as usize].instrs[index];
        format!("rank {rank} #{index} {} ({})", instr.op.name(), self.location((rank, index)))
    }

    /// The `.coll` line of an instruction, or its line and column in the `.sched` text it was read from.
    pub fn location(&self, (rank, index): At) -> String {
        if let Some(lines) = self.lines {
            return lines.location(self.source, rank, index);
        }
        let instr = &self.sched.ranks[rank as usize].instrs[index];
        if self.source.is_empty() {
            let span = self.sched.spans.get(instr.span as usize).copied().unwrap_or_default();
            format!("source bytes {}..{}", span.start, span.end)
        } else {
            format!("line {}", self.sched.line_of(self.source, instr.span.into()))
        }
    }

    pub fn span(&self, (rank, index): At) -> collc_grammar::ast::Span {
        if let Some(lines) = self.lines {
            return lines.span(rank, index);
        }
        let instr = &self.sched.ranks[rank as usize].instrs[index];
        self.sched.spans.get(instr.span as usize).copied().unwrap_or_default()
    }

    pub fn error(&self, code: &'static str, message: String, help: &str, at: At, label: &str) -> Error {
        Error::new(code, message, help).at(self.span(at), label)
    }
}
