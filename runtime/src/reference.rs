//! The reference interpreter: runs every rank of a verified schedule in one thread, in dataflow order, with the
//! scalar kernels. Slow and simple on purpose: it is the oracle.

use crate::error::RuntimeError;
use crate::layout::ChunkLayout;
use collc_compiler::sched::{Instr, Op, Operand};
use collc_compiler::VerifiedSchedule;
use collc_kernels::{reference, DataType, ReduceOp};
use std::collections::{HashMap, VecDeque};

/// Every rank's buffers, indexed like `Schedule::buffers` (`in`, `out`, scratch). Scratch may be given empty: it is
/// allocated here.
pub type RankBuffers = Vec<Vec<u8>>;

/// Runs `sched` on `buffers` for a call of `count` elements per block. Avg divides by the rank count at the end.
pub fn run(
    sched: &VerifiedSchedule,
    buffers: &mut [RankBuffers],
    count: usize,
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), RuntimeError> {
    if buffers.len() != sched.n_ranks as usize {
        return Err(RuntimeError::RankCount { expected: sched.n_ranks, got: buffers.len() });
    }
    let layout = ChunkLayout::new(count, sched.chunks);
    let elem = dtype.size_bytes();
    for (rank, bufs) in buffers.iter_mut().enumerate() {
        bufs.resize(sched.buffers.len(), Vec::new());
        for (b, decl) in sched.buffers.iter().enumerate() {
            let needed = layout.elements(0, decl.chunks).end * elem;
            if b >= 2 && bufs[b].len() < needed {
                bufs[b].resize(needed, 0);
            }
            if bufs[b].len() < needed && is_used(sched, b) {
                return Err(RuntimeError::BufferSize {
                    rank: rank as u32,
                    buffer: decl.name.clone(),
                    got: bufs[b].len(),
                    needed,
                });
            }
        }
    }
    Interpreter { sched, layout: layout.clone(), elem, dtype, op, queues: HashMap::new() }.run(buffers)?;
    if op == ReduceOp::Avg && sched.collective.reduces() {
        for rank in 0..sched.n_ranks {
            let (buf, offset) = sched.output_window(rank);
            let (_, out_chunks) = sched.collective.buffer_chunks(sched.n_ranks, sched.chunks);
            let bytes = byte_range(&layout, elem, Operand::new(buf, offset), out_chunks);
            reference::finish_avg(dtype, &mut buffers[rank as usize][buf.0 as usize][bytes], sched.n_ranks as usize)
                .map_err(|source| RuntimeError::Kernel { rank, index: 0, source })?;
        }
    }
    Ok(())
}

fn is_used(sched: &VerifiedSchedule, buf: usize) -> bool {
    sched
        .ranks
        .iter()
        .flat_map(|r| &r.instrs)
        .any(|i| [i.src, i.acc, i.dst].iter().any(|o| o.get().is_some_and(|o| o.buf.0 as usize == buf)))
}

fn byte_range(layout: &ChunkLayout, elem: usize, op: Operand, n: u32) -> std::ops::Range<usize> {
    let elements = layout.elements(op.index, n);
    elements.start * elem..elements.end * elem
}

struct Interpreter<'a> {
    sched: &'a VerifiedSchedule,
    layout: ChunkLayout,
    elem: usize,
    dtype: DataType,
    op: ReduceOp,
    queues: HashMap<(u32, u32, u8), VecDeque<Vec<u8>>>,
}

impl Interpreter<'_> {
    fn run(&mut self, buffers: &mut [RankBuffers]) -> Result<(), RuntimeError> {
        let p = self.sched.n_ranks as usize;
        let mut done: Vec<Vec<bool>> = self.sched.ranks.iter().map(|r| vec![false; r.len()]).collect();
        let mut remaining: usize = self.sched.n_instrs();
        while remaining > 0 {
            let before = remaining;
            for rank in 0..p {
                for i in 0..self.sched.ranks[rank].len() {
                    if !done[rank][i] && self.ready(rank, i, &done[rank]) {
                        self.execute(rank as u32, i, &mut buffers[rank])?;
                        done[rank][i] = true;
                        remaining -= 1;
                    }
                }
            }
            assert!(remaining < before, "a verified schedule always makes progress");
        }
        Ok(())
    }

    /// Dependencies done, earlier receives on the same connection done, and the message has arrived.
    fn ready(&self, rank: usize, i: usize, done: &[bool]) -> bool {
        let program = &self.sched.ranks[rank];
        let instr = &program.instrs[i];
        if !program.deps_of(i).iter().all(|&d| done[d as usize]) {
            return false;
        }
        let same_connection = |other: &Instr| {
            (instr.recv_peer().is_some() && other.recv_peer() == instr.recv_peer() && other.channel == instr.channel)
                || (instr.send_peer().is_some()
                    && other.send_peer() == instr.send_peer()
                    && other.channel == instr.channel)
        };
        if (0..i).any(|k| !done[k] && same_connection(&program.instrs[k])) {
            return false;
        }
        match instr.recv_peer() {
            Some(peer) => self.queues.get(&(peer, rank as u32, instr.channel)).is_some_and(|q| !q.is_empty()),
            None => true,
        }
    }

    fn read(&self, bufs: &RankBuffers, op: Operand, n: u32) -> Vec<u8> {
        bufs[op.buf.0 as usize][byte_range(&self.layout, self.elem, op, n)].to_vec()
    }

    fn execute(&mut self, rank: u32, index: usize, bufs: &mut RankBuffers) -> Result<(), RuntimeError> {
        let instr = self.sched.ranks[rank as usize].instrs[index];
        let kernel = |source| RuntimeError::Kernel { rank, index, source };
        let mut value = match instr.recv_peer() {
            Some(peer) => self
                .queues
                .get_mut(&(peer, rank, instr.channel))
                .and_then(VecDeque::pop_front)
                .expect("ready() saw the message"),
            None => self.read(bufs, instr.src, instr.count),
        };
        if let Some(acc) = instr.acc.get() {
            let mut sum = self.read(bufs, acc, instr.count);
            reference::reduce(self.dtype, self.op, &mut sum, &value).map_err(kernel)?;
            value = sum;
        }
        if let Some(dst) = instr.dst.get() {
            let range = byte_range(&self.layout, self.elem, dst, instr.count);
            reference::copy(&mut bufs[dst.buf.0 as usize][range], &value).map_err(kernel)?;
        }
        if let Some(peer) = instr.send_peer() {
            debug_assert!(instr.op != Op::Copy);
            self.queues.entry((rank, peer, instr.channel)).or_default().push_back(value);
        }
        Ok(())
    }
}
