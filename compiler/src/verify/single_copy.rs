//! Which sends may be carried by reference (docs/language.md §13, the memory model's rule 8): a `Send` whose source
//! no later instruction of its rank writes. Its receiver may then read the sender's chunks in place, in the sender's
//! memory, instead of a copy in the connection's slot, as long as the sender's call does not return (and its caller
//! cannot write the buffer) before the message is received.
//!
//! Why it holds on a verified schedule: the race check orders every instruction that writes a chunk the send reads
//! with the send by dependencies, and dependencies point backwards, so a write not before the send in program
//! order is after it in every execution. With none after it, the chunk holds the sent value from the send until the
//! call ends on that rank, which is when the executors let the receiver's read finish at the latest.

use crate::sched::{Op, RankProgram};

/// For each instruction of `program`: whether it is a `Send` whose source stays as sent until the call ends.
pub fn sources_that_stay(program: &RankProgram) -> Vec<bool> {
    // The last instruction writing each chunk of each buffer, walking backwards: a send is eligible when none of
    // its chunks has a writer later than it.
    let mut stays = vec![false; program.instrs.len()];
    let mut written: Vec<Vec<bool>> = Vec::new();
    for (i, instr) in program.instrs.iter().enumerate().rev() {
        if instr.op == Op::Send {
            if let Some(src) = instr.src.get() {
                let chunks = written.get(src.buf.0 as usize);
                let range = src.index as usize..(src.index + instr.count) as usize;
                stays[i] = chunks.is_none_or(|w| range.clone().all(|c| !w.get(c).copied().unwrap_or(false)));
            }
        }
        if let Some(dst) = instr.dst.get() {
            let buf = dst.buf.0 as usize;
            if written.len() <= buf {
                written.resize(buf + 1, Vec::new());
            }
            let end = (dst.index + instr.count) as usize;
            if written[buf].len() < end {
                written[buf].resize(end, false);
            }
            written[buf][dst.index as usize..end].fill(true);
        }
    }
    stays
}

#[cfg(test)]
mod tests {
    use crate::emit::parse_sched_located;
    use crate::verify::verify_sched;
    use crate::Limits;

    fn stays(text: &str) -> Vec<Vec<bool>> {
        let (sched, lines) = parse_sched_located(text).unwrap_or_else(|e| panic!("{e:?}"));
        let verified = verify_sched(sched, text, &lines, &Limits::default()).unwrap_or_else(|e| panic!("{e:?}"));
        verified.ranks.iter().map(super::sources_that_stay).collect()
    }

    /// A 2-rank allreduce: each rank sends one chunk, reduces the other's into its own, sends the sum back. Out of
    /// place the first send reads `in`, never written, and the second a sum no later instruction writes: both stay.
    /// In place the first send's chunk is overwritten by the last receive: it must be copied.
    #[test]
    fn a_send_stays_by_reference_only_when_no_later_instruction_writes_its_source() {
        let out_of_place = "\
collc-schedule 1
algorithm pair for allreduce
placement out-of-place
ranks 2 chunks 2 root 0 peer 0
buffer in 2
buffer out 2
span 0 0..0
rank 0
  #0 Send src=in[0] send=1 @0
  #1 RecvReduceCopy acc=in[1] dst=out[1] recv=1 @0
  #2 Send src=out[1] send=1 deps=1 @0
  #3 Recv dst=out[0] recv=1 @0
rank 1
  #0 Send src=in[1] send=0 @0
  #1 RecvReduceCopy acc=in[0] dst=out[0] recv=0 @0
  #2 Send src=out[0] send=0 deps=1 @0
  #3 Recv dst=out[1] recv=0 @0
";
        assert_eq!(stays(out_of_place), [[true, false, true, false], [true, false, true, false]]);
        let in_place = "\
collc-schedule 1
algorithm pair for allreduce
placement in-place
ranks 2 chunks 2 root 0 peer 0
buffer in 2
buffer out 2
span 0 0..0
rank 0
  #0 Send src=out[0] send=1 @0
  #1 RecvReduceCopy acc=out[1] dst=out[1] recv=1 @0
  #2 Send src=out[1] send=1 deps=1 @0
  #3 Recv dst=out[0] recv=1 deps=0 @0
rank 1
  #0 Send src=out[1] send=0 @0
  #1 RecvReduceCopy acc=out[0] dst=out[0] recv=0 @0
  #2 Send src=out[0] send=0 deps=1 @0
  #3 Recv dst=out[1] recv=0 deps=0 @0
";
        assert_eq!(stays(in_place), [[false, false, true, false], [false, false, true, false]]);
    }
}
