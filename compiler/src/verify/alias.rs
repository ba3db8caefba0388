//! In place, `in` and `out` are two windows of one array (docs/language.md §8): an operand that names the buffer
//! the call does not pass is rewritten onto the one it does, at the rank's in-place offset, before any check runs.
//! So every check, and every executor after them, sees one name for each chunk of memory.

use crate::sched::{BufId, Operand, Placement, Schedule};

/// Rewrites `sched`'s in-place operands onto `Schedule::shared_buffer`. Out of place, or with a header that does not
/// describe `in` and `out` (which `bounds` reports), nothing changes; an operand outside its own buffer is left for
/// `bounds` to name as written.
pub(crate) fn onto_shared_buffer(sched: &mut Schedule) {
    if sched.placement != Placement::InPlace || !windows_fit(sched) {
        return;
    }
    let shared = sched.shared_buffer();
    let other = if shared == BufId::IN { BufId::OUT } else { BufId::IN };
    let other_chunks = sched.buffers[other.0 as usize].chunks;
    let names_other = |o: &Operand| o.buf == other;
    let mentioned = sched.ranks.iter().flat_map(|r| &r.instrs).any(|i| [i.src, i.acc, i.dst].iter().any(names_other));
    if !mentioned {
        return;
    }
    for rank in 0..sched.n_ranks {
        let (in_offset, out_offset) = sched.window_offsets(rank);
        // Where chunk 0 of the other window lies in the shared buffer; one of the two offsets is 0.
        let shift = if shared == BufId::OUT { in_offset } else { out_offset };
        for instr in &mut sched.ranks[rank as usize].instrs {
            let count = instr.count;
            for operand in [&mut instr.src, &mut instr.acc, &mut instr.dst] {
                let inside = operand.index.checked_add(count).is_some_and(|end| count > 0 && end <= other_chunks);
                if operand.buf == other && inside {
                    *operand = Operand::new(shared, operand.index + shift);
                }
            }
        }
    }
}

/// Whether the header gives `in` and `out` the collective's shapes, so the offsets land inside the shared buffer.
fn windows_fit(sched: &Schedule) -> bool {
    let (in_chunks, out_chunks) = sched.collective.buffer_chunks(sched.n_ranks, sched.chunks);
    let counted = u64::from(sched.n_ranks) * u64::from(sched.chunks) <= u64::from(u32::MAX);
    counted
        && sched.ranks.len() == sched.n_ranks as usize
        && sched.buffers.len() >= 2
        && sched.buffers[0].chunks == in_chunks
        && sched.buffers[1].chunks == out_chunks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::Collective;
    use crate::sched::{BufferDecl, Instr, Op, RankProgram, NO_RANK};

    fn schedule(collective: Collective, n_ranks: u32, operand: Operand) -> Schedule {
        let (in_chunks, out_chunks) = collective.buffer_chunks(n_ranks, 1);
        let copy = Instr {
            op: Op::Copy,
            channel: 0,
            span: 0,
            count: 1,
            send_peer: NO_RANK,
            recv_peer: NO_RANK,
            src: operand,
            acc: Operand::NONE,
            dst: Operand::new(BufId(2), 0),
        };
        let mut program = RankProgram::default();
        program.push(copy, &[]);
        Schedule {
            algorithm: "t".into(),
            collective,
            placement: Placement::InPlace,
            n_ranks,
            chunks: 1,
            root: 0,
            peer: 1,
            params: Vec::new(),
            buffers: vec![
                BufferDecl { name: "in".into(), chunks: in_chunks },
                BufferDecl { name: "out".into(), chunks: out_chunks },
                BufferDecl { name: "tmp".into(), chunks: 1 },
            ],
            ranks: vec![program; n_ranks as usize],
            spans: Vec::new(),
        }
    }

    fn sources(sched: &Schedule) -> Vec<(u8, u32)> {
        sched.ranks.iter().map(|r| (r.instrs[0].src.buf.0, r.instrs[0].src.index)).collect()
    }

    /// Allgather's `in[0]` is `out[r]` on rank r, reducescatter's `out[0]` is `in[r]`, allreduce's `in[c]` is
    /// `out[c]`; an operand outside its own buffer stays as written.
    #[test]
    fn the_other_window_lands_at_the_ranks_offset() {
        let mut gather = schedule(Collective::AllGather, 3, Operand::new(BufId::IN, 0));
        onto_shared_buffer(&mut gather);
        assert_eq!(sources(&gather), [(1, 0), (1, 1), (1, 2)]);
        let mut scatter = schedule(Collective::ReduceScatter, 3, Operand::new(BufId::OUT, 0));
        onto_shared_buffer(&mut scatter);
        assert_eq!(sources(&scatter), [(0, 0), (0, 1), (0, 2)]);
        let mut reduce = schedule(Collective::AllReduce, 2, Operand::new(BufId::IN, 0));
        onto_shared_buffer(&mut reduce);
        assert_eq!(sources(&reduce), [(1, 0), (1, 0)]);
        let mut outside = schedule(Collective::AllGather, 3, Operand::new(BufId::IN, 1));
        onto_shared_buffer(&mut outside);
        assert_eq!(sources(&outside), [(0, 1), (0, 1), (0, 1)]);
        let mut apart = schedule(Collective::AllGather, 3, Operand::new(BufId::IN, 0));
        apart.placement = Placement::OutOfPlace;
        onto_shared_buffer(&mut apart);
        assert_eq!(sources(&apart), [(0, 0), (0, 0), (0, 0)]);
    }
}
