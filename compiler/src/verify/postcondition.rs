//! Postcondition: after the symbolic execution, every output chunk the contract names holds exactly the expected
//! multiset of contributions. A failure names the rank, buffer, chunk, what was expected, what it got, and the
//! instruction that last wrote it; small schedules are re-run exactly to list the missing or extra contributions.

use super::deadlock::{simulate, tables, Finished};
use super::key::EXACT_BUDGET;
use super::value::{Checked, Counted, Exact, ExactKey, Term};
use super::Context;
use crate::collective::Expected;
use crate::diag::Error;
use crate::sched::{BufId, Operand};

/// Exact re-runs for counterexamples are skipped above this many instructions or chunk slots (each slot's exact
/// value is an allocation of its own); larger schedules are re-run counting contributions.
const EXACT_RERUN_LIMIT: usize = 200_000;

/// What describes a wrong chunk: the exact values (of the run itself, or of a second run), or counts.
enum Rerun<'a> {
    Exact(&'a Finished<Exact>),
    Counted(&'a Finished<Counted>),
}

/// Compares every output chunk the contract names with what it must hold. `exact` is the run itself when it ran
/// with exact values; otherwise a failure is described from a second run.
pub(crate) fn check<V: Checked>(
    ctx: &Context,
    key: &V::Key,
    finished: &Finished<V>,
    exact: Option<&Finished<Exact>>,
    errors: &mut Vec<Error>,
) {
    let sched = ctx.sched;
    let (_, out_chunks) = sched.collective.buffer_chunks(sched.n_ranks, sched.chunks);
    let mut sums = Vec::new();
    let mut wrong = Vec::new();
    'ranks: for rank in 0..sched.n_ranks {
        let (out_buf, offset) = sched.output_window(rank);
        for c in 0..out_chunks {
            let expected = sched.collective.expected(rank, c, sched.chunks, sched.root, sched.peer);
            if expected == Expected::Unchecked {
                continue;
            }
            let want = V::expected(key, sched.n_ranks, expected, &mut sums);
            let operand = Operand::new(out_buf, offset + c);
            if finished.values[finished.slot(rank, operand)] != want {
                wrong.push((rank, operand, expected));
                if wrong.len() >= ctx.limits.max_errors {
                    break 'ranks;
                }
            }
        }
    }
    if wrong.is_empty() {
        return;
    }
    // The first run completed, so a second one of the same schedule does too.
    let small = sched.n_instrs() <= EXACT_RERUN_LIMIT && finished.values.len() <= EXACT_RERUN_LIMIT;
    let exact_rerun = match exact {
        None if small => {
            let (connections, graph) = tables(ctx.sched, ctx.limits.channel_slots);
            let budget = ExactKey::new(EXACT_BUDGET);
            simulate::<Exact>(ctx, &budget, connections, graph).ok().filter(|_| !budget.over_budget())
        }
        _ => None,
    };
    let counted_rerun = match exact.is_none() && exact_rerun.is_none() {
        true => {
            let (connections, graph) = tables(ctx.sched, ctx.limits.channel_slots);
            simulate::<Counted>(ctx, &(), connections, graph).ok()
        }
        false => None,
    };
    let rerun = exact.or(exact_rerun.as_ref()).map(Rerun::Exact).or(counted_rerun.as_ref().map(Rerun::Counted));
    for (rank, operand, expected) in wrong {
        errors.push(explain(ctx, finished.slot(rank, operand), rerun.as_ref(), rank, operand, expected));
    }
}

fn describe_expected(expected: Expected, n_ranks: u32) -> String {
    match expected {
        Expected::Unchecked => "anything".to_string(),
        Expected::One { rank, chunk } => format!("x[{rank}][{chunk}]"),
        Expected::SumOverRanks { chunk } => format!("the sum of x[q][{chunk}] over all {n_ranks} ranks q, each once"),
    }
}

/// `x[0][1] + x[2][1] + x[2][1]`: the first 8 contributions, each as often as it is held, and how many more.
fn list(terms: &[Term]) -> String {
    let total: u64 = terms.iter().map(|t| u64::from(t.times)).sum();
    let shown: Vec<String> = terms
        .iter()
        .flat_map(|t| std::iter::repeat_n(format!("x[{}][{}]", t.rank, t.chunk), t.times.min(8) as usize))
        .take(8)
        .collect();
    let more = if total > 8 { format!(" and {} more", total - 8) } else { String::new() };
    format!("{}{more}", shown.join(" + "))
}

fn expected_terms(expected: Expected, n_ranks: u32) -> Vec<Term> {
    match expected {
        Expected::Unchecked => Vec::new(),
        Expected::One { rank, chunk } => vec![Term { rank, chunk, times: 1 }],
        Expected::SumOverRanks { chunk } => (0..n_ranks).map(|rank| Term { rank, chunk, times: 1 }).collect(),
    }
}

/// What `a` holds more often than `b` (both sorted by contribution).
fn difference(a: &[Term], b: &[Term]) -> Vec<Term> {
    let mut out = Vec::new();
    let mut j = 0;
    for &x in a {
        while j < b.len() && (b[j].rank, b[j].chunk) < (x.rank, x.chunk) {
            j += 1;
        }
        let held = match b.get(j) {
            Some(y) if (y.rank, y.chunk) == (x.rank, x.chunk) => y.times,
            _ => 0,
        };
        if x.times > held {
            out.push(Term { times: x.times - held, ..x });
        }
    }
    out
}

fn describe_got(rerun: Option<&Rerun>, slot: usize, expected: Expected, n_ranks: u32) -> String {
    const NOTHING: &str = "nothing: the slot was never written (or only with undefined data)";
    let exact = match rerun {
        None => return "a different combination of contributions".to_string(),
        Some(Rerun::Counted(counted)) => {
            let got = counted.values[slot];
            if got.undefined && got.count == 0 {
                return NOTHING.to_string();
            }
            return format!(
                "a different combination of {} contributions{}",
                got.count,
                if got.undefined { " mixed with undefined data" } else { "" }
            );
        }
        Some(Rerun::Exact(exact)) => exact,
    };
    let value = &exact.values[slot];
    let terms: Vec<Term> = value.terms().copied().collect();
    if value.has_undefined() && terms.is_empty() {
        return NOTHING.to_string();
    }
    let want = expected_terms(expected, n_ranks);
    let (missing, extra) = (difference(&want, &terms), difference(&terms, &want));
    let mut text = list(&terms);
    if value.has_undefined() {
        text.push_str(" + undefined data");
    }
    if !missing.is_empty() {
        text.push_str(&format!("; missing {}", list(&missing)));
    }
    if !extra.is_empty() {
        text.push_str(&format!("; extra or duplicated {}", list(&extra)));
    }
    text
}

fn explain(
    ctx: &Context,
    slot: usize,
    rerun: Option<&Rerun>,
    rank: u32,
    operand: Operand,
    expected: Expected,
) -> Error {
    let sched = ctx.sched;
    let got = describe_got(rerun, slot, expected, sched.n_ranks);
    let name = &sched.buffer(operand.buf).name;
    // In place the output window may sit inside `in` or at an offset of `out`: say which output chunk it is.
    let (_, out_offset) = sched.output_window(rank);
    let alias = match sched.placement {
        crate::sched::Placement::InPlace if operand.buf != BufId::OUT || out_offset != 0 => {
            format!(" (the in-place call's out[{}])", operand.index - out_offset)
        }
        _ => String::new(),
    };
    let message = format!(
        "wrong result on rank {rank}: {name}[{}]{alias} must hold {}",
        { operand.index },
        describe_expected(expected, sched.n_ranks)
    );
    let note = format!(
        "counterexample: rank {rank}, buffer {name}, chunk {}\n  expected: {}\n  got:      {got}",
        { operand.index },
        describe_expected(expected, sched.n_ranks)
    );
    let help = "the schedule does not compute the collective's contract; check the chunk indices and peers of the transfers that feed this chunk";
    let error = match last_writer(sched, rank, operand) {
        // Read from `.sched` text, the spans are the `.coll` file's: point at the rank's first line there instead.
        None if ctx.lines.is_some() => match sched.ranks[rank as usize].instrs.is_empty() {
            true => Error::new("collc::verify::postcondition", message, help),
            false => ctx.error(
                "collc::verify::postcondition",
                message,
                help,
                (rank, 0),
                "no instruction of this rank writes the chunk",
            ),
        },
        None => Error::new("collc::verify::postcondition", message, help)
            .at(sched.spans.first().copied().unwrap_or_default(), "no transfer writes this chunk"),
        Some(writer) => {
            let instr = &sched.ranks[rank as usize].instrs[writer as usize];
            // Span 0 marks instructions the compiler added: the final copies of chunks no transfer wrote. A schedule
            // read from text may give span 0 to anything, so there it is just the last writer.
            let final_copy = instr.span == 0
                && instr.op == crate::sched::Op::Copy
                && sched.placement == crate::sched::Placement::OutOfPlace
                && ctx.lines.is_none();
            let label = if final_copy {
                format!(
                    "no transfer writes this chunk: the final out-of-place copy ({}) left the input there",
                    ctx.describe(rank, writer as usize)
                )
            } else {
                format!("last written here ({})", ctx.describe(rank, writer as usize))
            };
            ctx.error("collc::verify::postcondition", message, help, (rank, writer as usize), &label)
        }
    };
    error.with_note(note)
}

/// The instruction of `rank` that last wrote the chunk at `operand`, if any: the last one in program order, since
/// the race check has ordered every pair of writes to one chunk by dependencies, which point backwards.
fn last_writer(sched: &crate::sched::Schedule, rank: u32, operand: Operand) -> Option<u32> {
    let writes = |instr: &crate::sched::Instr| {
        instr
            .dst
            .get()
            .is_some_and(|d| d.buf == operand.buf && (d.index..d.index + instr.count).contains(&{ operand.index }))
    };
    sched.ranks[rank as usize].instrs.iter().rposition(writes).map(|i| i as u32)
}
