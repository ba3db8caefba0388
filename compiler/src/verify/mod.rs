//! The verifier: runs on the final schedule and is the only way to obtain a `VerifiedSchedule`.
//!
//! Invariants checked, each in its own file, every error collected:
//! - `bounds`: operands inside their buffers, peers inside 0..p and not the rank itself, instruction shapes,
//!   dependencies pointing to earlier instructions, `in` never written out of place.
//! - `matching`: every send has exactly one receive of the same size, same channel, same order.
//! - `races`: two instructions of one rank that touch one chunk slot, one writing, are ordered by dependencies.
//! - `deadlock`: a dataflow execution with bounded channels (`Limits::channel_slots` messages per connection)
//!   completes; if not, the wait-for cycle is printed.
//! - `postcondition`: symbolic execution of multisets of contributions gives exactly the collective's contract.

mod bounds;
mod deadlock;
mod matching;
mod postcondition;
mod races;
mod value;

pub(crate) use matching::{Connection, Connections};

use crate::diag::{Error, Errors};
use crate::sched::{Instr, Schedule};
use crate::Limits;
use std::ops::Deref;

/// A schedule that passed every check. Emitters and the runtime accept nothing else.
#[derive(Clone, Debug)]
pub struct VerifiedSchedule(Schedule);

impl VerifiedSchedule {
    pub fn schedule(&self) -> &Schedule {
        &self.0
    }

    pub fn into_schedule(self) -> Schedule {
        self.0
    }
}

impl Deref for VerifiedSchedule {
    type Target = Schedule;

    fn deref(&self) -> &Schedule {
        &self.0
    }
}

/// Checks `sched` against every invariant. `source` (may be empty) is used for line numbers in notes.
pub fn verify(sched: Schedule, source: &str, limits: &Limits) -> Result<VerifiedSchedule, Errors> {
    let ctx = Context { sched: &sched, source, limits };
    let mut errors = Vec::new();
    let tables = per_rank_checks(&ctx, &mut errors);
    if let (true, Some((connections, graph))) = (errors.is_empty(), tables) {
        match deadlock::simulate::<value::Hashed>(&ctx, connections, graph) {
            Err(error) => errors.push(error),
            Ok(finished) => postcondition::check(&ctx, &finished, &mut errors),
        }
    }
    errors.truncate(limits.max_errors.max(1));
    if errors.is_empty() {
        Ok(VerifiedSchedule(sched))
    } else {
        Err(Errors(errors))
    }
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

/// What every check reads.
pub(crate) struct Context<'a> {
    pub sched: &'a Schedule,
    pub source: &'a str,
    pub limits: &'a Limits,
}

impl Context<'_> {
    /// `rank 2 #5 RecvReduceCopy (line 12)`: how a check names one instruction.
    pub fn describe(&self, rank: u32, index: usize) -> String {
        let instr = &self.sched.ranks[rank as usize].instrs[index];
        format!("rank {rank} #{index} {} ({})", instr.op.name(), self.location(instr))
    }

    pub fn location(&self, instr: &Instr) -> String {
        if self.source.is_empty() {
            let span = self.sched.spans.get(instr.span as usize).copied().unwrap_or_default();
            format!("source bytes {}..{}", span.start, span.end)
        } else {
            format!("line {}", self.sched.line_of(self.source, instr.span.into()))
        }
    }

    pub fn span(&self, instr: &Instr) -> collc_grammar::ast::Span {
        self.sched.spans.get(instr.span as usize).copied().unwrap_or_default()
    }

    pub fn error(&self, code: &'static str, message: String, help: &str, instr: &Instr, label: &str) -> Error {
        Error::new(code, message, help).at(self.span(instr), label)
    }
}
