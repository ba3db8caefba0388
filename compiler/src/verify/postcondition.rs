//! Postcondition: after the symbolic execution, every output chunk the contract names holds exactly the expected
//! multiset of contributions. A failure names the rank, buffer, chunk, what was expected, what it got, and the
//! instruction that last wrote it; small schedules are re-run exactly to list the missing or extra contributions.

use super::deadlock::{simulate, tables, Finished};
use super::value::{contribution_hash, Counted, Exact, Hashed, Value};
use super::Context;
use crate::collective::Expected;
use crate::diag::Error;
use crate::sched::{BufId, Operand, Schedule};

/// Inputs at the start, appended to `values` for every slot of `rank` in buffer order: `x[r][c]` in the input
/// window where the input is significant, undefined elsewhere. The window is found once per rank, not per slot
/// (at p = 4096 the in-place state took 0.13-0.14 s instead of 0.18-0.28 s).
pub(crate) fn initial_values<V: Value>(sched: &Schedule, rank: u32, values: &mut Vec<V>) {
    let (in_buf, offset) = sched.input_window(rank);
    let (in_chunks, _) = sched.collective.buffer_chunks(sched.n_ranks, sched.chunks);
    let significant = sched.collective.input_significant(rank, sched.root);
    for (b, decl) in sched.buffers.iter().enumerate() {
        if significant && b == in_buf.0 as usize {
            let input = offset..offset.saturating_add(in_chunks);
            values.extend((0..decl.chunks).map(|index| match input.contains(&index) {
                true => V::input(rank, index - offset),
                false => V::undefined(),
            }));
        } else {
            values.extend(std::iter::repeat_n(V::undefined(), decl.chunks as usize));
        }
    }
}

/// Exact re-runs for counterexamples are skipped above this many instructions or chunk slots: exact values list
/// their contributions, so they cost far more than hashed ones. Larger schedules are re-run counting contributions.
const EXACT_RERUN_LIMIT: usize = 200_000;

/// A second run of a failed schedule, to describe what a wrong chunk holds.
enum Rerun {
    Exact(Finished<Exact>),
    Counted(Finished<Counted>),
}

pub(crate) fn check(ctx: &Context, finished: &Finished<Hashed>, errors: &mut Vec<Error>) {
    let sched = ctx.sched;
    let (_, out_chunks) = sched.collective.buffer_chunks(sched.n_ranks, sched.chunks);
    let mut sums = Vec::new();
    let mut wrong = Vec::new();
    for rank in 0..sched.n_ranks {
        let (out_buf, offset) = sched.output_window(rank);
        for c in 0..out_chunks {
            let expected = sched.collective.expected(rank, c, sched.chunks, sched.root, sched.peer);
            let want = match expected {
                Expected::Unchecked => continue,
                Expected::One { rank, chunk } => Hashed::input(rank, chunk),
                Expected::SumOverRanks { chunk } => sum_over_ranks(sched, chunk, &mut sums),
            };
            let operand = Operand::new(out_buf, offset + c);
            if finished.values[finished.slot(rank, operand)] != want {
                wrong.push((rank, operand, expected));
                if wrong.len() >= ctx.limits.max_errors {
                    break;
                }
            }
        }
    }
    if wrong.is_empty() {
        return;
    }
    let small = sched.n_instrs() <= EXACT_RERUN_LIMIT && finished.values.len() <= EXACT_RERUN_LIMIT;
    // The first run completed, so a second one of the same schedule does too.
    let (connections, graph) = tables(ctx.sched, ctx.limits.channel_slots);
    let rerun = match small {
        true => simulate::<Exact>(ctx, connections, graph).ok().map(Rerun::Exact),
        false => simulate::<Counted>(ctx, connections, graph).ok().map(Rerun::Counted),
    };
    for (rank, operand, expected) in wrong {
        errors.push(explain(ctx, finished, rerun.as_ref(), rank, operand, expected));
    }
}

fn sum_over_ranks(sched: &Schedule, chunk: u32, cache: &mut Vec<Option<Hashed>>) -> Hashed {
    if cache.len() <= chunk as usize {
        cache.resize(chunk as usize + 1, None);
    }
    *cache[chunk as usize].get_or_insert_with(|| {
        let mut sum = Hashed(0);
        for q in 0..sched.n_ranks {
            sum.0 = sum.0.wrapping_add(contribution_hash(q, chunk));
        }
        sum
    })
}

fn describe_expected(expected: Expected, n_ranks: u32) -> String {
    match expected {
        Expected::Unchecked => "anything".to_string(),
        Expected::One { rank, chunk } => format!("x[{rank}][{chunk}]"),
        Expected::SumOverRanks { chunk } => format!("the sum of x[q][{chunk}] over all {n_ranks} ranks q, each once"),
    }
}

fn list(items: &[(u32, u32)]) -> String {
    let shown: Vec<String> = items.iter().take(8).map(|(r, c)| format!("x[{r}][{c}]")).collect();
    let more = if items.len() > 8 { format!(" and {} more", items.len() - 8) } else { String::new() };
    format!("{}{more}", shown.join(" + "))
}

fn expected_items(expected: Expected, n_ranks: u32) -> Vec<(u32, u32)> {
    match expected {
        Expected::Unchecked => Vec::new(),
        Expected::One { rank, chunk } => vec![(rank, chunk)],
        Expected::SumOverRanks { chunk } => (0..n_ranks).map(|q| (q, chunk)).collect(),
    }
}

/// Contributions in `a` not matched one-for-one in `b` (both sorted).
fn difference(a: &[(u32, u32)], b: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let mut j = 0;
    for &x in a {
        while j < b.len() && b[j] < x {
            j += 1;
        }
        if j < b.len() && b[j] == x {
            j += 1;
        } else {
            out.push(x);
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
    if value.undefined && value.items.is_empty() {
        return NOTHING.to_string();
    }
    let want = expected_items(expected, n_ranks);
    let (missing, extra) = (difference(&want, &value.items), difference(&value.items, &want));
    let mut text = list(&value.items);
    if value.undefined {
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
    finished: &Finished<Hashed>,
    rerun: Option<&Rerun>,
    rank: u32,
    operand: Operand,
    expected: Expected,
) -> Error {
    let sched = ctx.sched;
    let slot = finished.slot(rank, operand);
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
        None => Error::new("collc::verify::postcondition", message, help)
            .at(sched.spans.first().copied().unwrap_or_default(), "no transfer writes this chunk"),
        Some(writer) => {
            let instr = &sched.ranks[rank as usize].instrs[writer as usize];
            // Span 0 marks instructions the compiler added: the final copies of chunks no transfer wrote.
            let label = if instr.span == 0 {
                format!(
                    "no transfer writes this chunk: the final out-of-place copy ({}) left the input there",
                    ctx.describe(rank, writer as usize)
                )
            } else {
                format!("last written here ({})", ctx.describe(rank, writer as usize))
            };
            ctx.error("collc::verify::postcondition", message, help, instr, &label)
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
