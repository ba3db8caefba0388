//! Bounds and shape: every operand inside its buffer, every peer a rank other than itself, every instruction
//! carrying exactly the operands its op needs, no read operand partly overlapping the destination, dependencies
//! pointing backwards, `in` read-only out of place.

use super::Context;
use crate::diag::Error;
use crate::sched::{BufId, Instr, Op, Operand, Placement, RankProgram, MAX_SPANS};

/// The header's checks: whether the ranks can be checked at all.
pub(crate) fn check_header(ctx: &Context, errors: &mut Vec<Error>) -> bool {
    let Some(problem) = header_problem(ctx) else { return true };
    errors.push(Error::new(
        "collc::verify::bounds",
        problem,
        "the schedule's header disagrees with its body; rebuild it with `collc build --emit sched`",
    ));
    false
}

/// Every instruction of one rank, until `errors` holds `Limits::max_errors`.
pub(crate) fn check_rank(ctx: &Context, rank: u32, program: &RankProgram, errors: &mut Vec<Error>) {
    for (i, instr) in program.instrs.iter().enumerate() {
        if let Some(problem) = instr_problem(ctx, rank, instr) {
            let message = format!("{}: {problem}", ctx.describe(rank, i));
            errors.push(ctx.error(
                "collc::verify::bounds",
                message,
                "the schedule is malformed; rebuild it from the .coll source",
                (rank, i),
                "emitted by this transfer",
            ));
        }
        if let Some(&bad) = program.deps_of(i).iter().find(|&&d| d as usize >= i) {
            let message = format!("{} depends on #{bad}, which does not come before it", ctx.describe(rank, i));
            errors.push(ctx.error(
                "collc::verify::order",
                message,
                "dependencies must point to earlier instructions of the same rank",
                (rank, i),
                "this instruction",
            ));
        }
        if errors.len() >= ctx.limits.max_errors {
            return;
        }
    }
}

/// The most chunk slots (over all buffers of all ranks) the verifier's tables index.
pub(crate) const MAX_VERIFIED_SLOTS: u64 = (1 << 31) - 1;

/// The header must describe the body: rank count, buffer shapes of the collective, root and peer, spans.
fn header_problem(ctx: &Context) -> Option<String> {
    let sched = ctx.sched;
    let p = sched.n_ranks;
    if p == 0 || p > ctx.limits.max_ranks || sched.ranks.len() != p as usize {
        return Some(format!(
            "the header says {p} ranks, the schedule lists {} (and 1..={} are accepted)",
            sched.ranks.len(),
            ctx.limits.max_ranks
        ));
    }
    if sched.root >= p || sched.peer >= p || sched.chunks == 0 {
        return Some(format!("root {} or peer {} is not a rank of {p}, or chunks is 0", sched.root, sched.peer));
    }
    // p * chunks must fit a chunk index (32 bits), or the buffer shapes below would wrap around.
    if u64::from(p) * u64::from(sched.chunks) > u64::from(u32::MAX) {
        return Some(format!("{p} ranks x {} chunks overflows a chunk index", sched.chunks));
    }
    let (in_chunks, out_chunks) = sched.collective.buffer_chunks(p, sched.chunks);
    let shapes_match =
        sched.buffers.len() >= 2 && sched.buffers[0].chunks == in_chunks && sched.buffers[1].chunks == out_chunks;
    if !shapes_match {
        return Some(format!(
            "{} with {p} ranks and {} chunks needs `in` of {in_chunks} and `out` of {out_chunks} chunks",
            sched.collective, sched.chunks
        ));
    }
    let slots: u64 = sched.buffers.iter().map(|b| b.chunks as u64).sum::<u64>() * p as u64;
    // Slot indices are 31 bits in the verifier's tables, whatever `--max-slots` allows.
    let limit = ctx.limits.max_slots.min(MAX_VERIFIED_SLOTS);
    if slots > limit {
        return Some(format!("the buffers hold {slots} chunk slots over all ranks; the limit is {limit}"));
    }
    if sched.buffers.len() > BufId::MAX_BUFFERS || sched.spans.len() > MAX_SPANS {
        return Some(format!(
            "{} buffers and {} spans; at most {} and {MAX_SPANS} are accepted",
            sched.buffers.len(),
            sched.spans.len(),
            BufId::MAX_BUFFERS
        ));
    }
    if let Some(bad) = sched.spans.iter().position(|s| s.start > s.end) {
        return Some(format!("span {bad} ends before it starts"));
    }
    None
}

fn operand_problem(ctx: &Context, what: &str, op: Operand, count: u32) -> Option<String> {
    let Some(decl) = ctx.sched.buffers.get(op.buf.0 as usize) else {
        return Some(format!("{what} names buffer #{}, which does not exist", op.buf.0));
    };
    if count == 0 || op.index.checked_add(count).is_none_or(|end| end > decl.chunks) {
        return Some(format!(
            "{what} {}[{}..{}] is outside `{}`, which has {} chunks",
            decl.name,
            { op.index },
            op.index as u64 + count as u64,
            decl.name,
            decl.chunks
        ));
    }
    None
}

fn peer_problem(ctx: &Context, rank: u32, what: &str, peer: u32) -> Option<String> {
    if peer >= ctx.sched.n_ranks {
        Some(format!("{what} rank {peer} is outside 0..{}", ctx.sched.n_ranks))
    } else if peer == rank {
        Some(format!("{what} rank is the rank itself"))
    } else {
        None
    }
}

/// Executors go chunk by chunk (and element by element within one), so a read operand that overlaps the
/// destination without being its very range would read chunks the instruction has already written: the memory
/// model (docs/language.md §13) leaves that undefined, and the verifier rejects it rather than guess an order.
fn partial_overlap(ctx: &Context, instr: &Instr) -> Option<String> {
    let dst = instr.dst.get()?;
    let n = instr.count;
    for (what, read) in [("source", instr.src.get()), ("accumulator", instr.acc.get())] {
        let Some(read) = read else { continue };
        let overlap = read.buf == dst.buf && read.index < dst.index + n && dst.index < read.index + n;
        if overlap && read != dst {
            let name = &ctx.sched.buffer(dst.buf).name;
            let (r, d) = ({ read.index }, { dst.index });
            let aliasing = match ctx.sched.placement {
                Placement::InPlace => " (in place, `in` and `out` are one buffer)",
                Placement::OutOfPlace => "",
            };
            return Some(format!(
                "its {what} {name}[{r}..{}] and destination {name}[{d}..{}] overlap without being the same \
                 range{aliasing}",
                r + n,
                d + n
            ));
        }
    }
    None
}

fn instr_problem(ctx: &Context, rank: u32, instr: &Instr) -> Option<String> {
    let needs_src = matches!(instr.op, Op::Send | Op::Copy | Op::Reduce);
    let needs_acc = matches!(instr.op, Op::RecvReduceCopy | Op::RecvReduceSend | Op::RecvReduceCopySend | Op::Reduce);
    let needs_dst = !matches!(instr.op, Op::Send | Op::RecvReduceSend);
    let shape = [
        ("source", instr.src, needs_src),
        ("accumulator", instr.acc, needs_acc),
        ("destination", instr.dst, needs_dst),
    ];
    for (what, operand, needed) in shape {
        match (operand.get(), needed) {
            (Some(op), true) => {
                if let Some(p) = operand_problem(ctx, what, op, instr.count) {
                    return Some(p);
                }
            }
            (None, true) => return Some(format!("has no {what} operand")),
            (Some(_), false) => return Some(format!("has a {what} operand it does not use")),
            (None, false) => {}
        }
    }
    if instr.op.sends() != instr.send_peer().is_some() || instr.op.receives() != instr.recv_peer().is_some() {
        return Some("its peers do not match its operation".to_string());
    }
    for (what, peer) in [("send peer", instr.send_peer()), ("receive peer", instr.recv_peer())] {
        if let Some(p) = peer.and_then(|peer| peer_problem(ctx, rank, what, peer)) {
            return Some(p);
        }
    }
    if ctx.sched.placement == Placement::OutOfPlace && instr.dst.get().is_some_and(|d| d.buf == BufId::IN) {
        return Some("writes the input buffer of an out-of-place call".to_string());
    }
    if let Some(problem) = partial_overlap(ctx, instr) {
        return Some(problem);
    }
    if instr.channel as u32 >= ctx.limits.max_channels {
        return Some(format!("channel {} is outside 0..{}", instr.channel, ctx.limits.max_channels));
    }
    if !instr.keeps_position(ctx.sched.chunks) {
        let positions: Vec<u32> = instr.positions(ctx.sched.chunks).collect();
        return Some(format!(
            "its operands sit at different chunk positions of a block ({positions:?} modulo {} chunks), whose sizes \
             differ when the count does not divide evenly",
            ctx.sched.chunks
        ));
    }
    None
}
