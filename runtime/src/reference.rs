//! The reference interpreter: runs every rank of a verified schedule in one thread, in dataflow order, with the
//! scalar kernels. Slow and simple on purpose: it is the oracle.
//!
//! PreMulSum follows docs/language.md §13 as it runs: a read of a chunk of the buffer that held a rank's input when
//! the call started, which nothing has written since, is multiplied by the factor. (The executors decide the same
//! from program order when a plan is prepared; this tracks it as the instructions execute.)

use crate::error::RuntimeError;
use crate::layout::ChunkLayout;
use collc_compiler::sched::{BufId, Instr, Op, Operand};
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
    let factor = match op.factor().filter(|_| sched.collective.reduces()) {
        Some(scalar) => Some(scalar.element(dtype).map_err(|source| RuntimeError::Factor { rank: 0, source })?),
        None => None,
    };
    let as_it_came = (0..sched.n_ranks)
        .map(|rank| {
            let (buf, _) = sched.input_window(rank);
            (buf, vec![true; sched.buffers[buf.0 as usize].chunks as usize])
        })
        .collect();
    let mut interpreter =
        Interpreter { sched, layout: layout.clone(), elem, dtype, op, factor, as_it_came, queues: HashMap::new() };
    interpreter.run(buffers)?;
    // An output chunk no instruction wrote still holds its rank's input (one rank's reduction): multiplied once.
    if let Some(factor) = &interpreter.factor {
        for (rank, (input, unwritten)) in interpreter.as_it_came.iter().enumerate() {
            let (buf, offset) = sched.output_window(rank as u32);
            let (_, out_chunks) = sched.collective.buffer_chunks(sched.n_ranks, sched.chunks);
            for chunk in (offset..offset + out_chunks).filter(|&c| buf == *input && unwritten[c as usize]) {
                let bytes = byte_range(&layout, elem, Operand::new(buf, chunk), 1);
                reference::premultiply(dtype, factor, &mut buffers[rank][buf.0 as usize][bytes])
                    .map_err(|source| RuntimeError::Kernel { rank: rank as u32, index: 0, source })?;
            }
        }
    }
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
    /// PreMulSum's factor as one element, and per rank the buffer that held its input and which of its chunks still do.
    factor: Option<[u8; 8]>,
    as_it_came: Vec<(BufId, Vec<bool>)>,
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

    /// The bytes of `n` chunks at `op`, those still holding the rank's input multiplied by a PreMulSum's factor.
    fn read(&self, rank: u32, bufs: &RankBuffers, op: Operand, n: u32) -> Result<Vec<u8>, RuntimeError> {
        let range = byte_range(&self.layout, self.elem, op, n);
        let mut bytes = bufs[op.buf.0 as usize][range.clone()].to_vec();
        let (input, unwritten) = &self.as_it_came[rank as usize];
        if let (Some(factor), true) = (&self.factor, op.buf == *input) {
            for k in (0..n).filter(|&k| unwritten[(op.index + k) as usize]) {
                let chunk = byte_range(&self.layout, self.elem, Operand::new(op.buf, op.index + k), 1);
                let at = chunk.start - range.start..chunk.end - range.start;
                reference::premultiply(self.dtype, factor, &mut bytes[at]).map_err(|source| RuntimeError::Kernel {
                    rank,
                    index: 0,
                    source,
                })?;
            }
        }
        Ok(bytes)
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
            None => self.read(rank, bufs, instr.src, instr.count)?,
        };
        if let Some(acc) = instr.acc.get() {
            let mut sum = self.read(rank, bufs, acc, instr.count)?;
            reference::reduce(self.dtype, self.op, &mut sum, &value).map_err(kernel)?;
            value = sum;
        }
        if let Some(dst) = instr.dst.get() {
            let range = byte_range(&self.layout, self.elem, dst, instr.count);
            reference::copy(&mut bufs[dst.buf.0 as usize][range], &value).map_err(kernel)?;
            let (input, unwritten) = &mut self.as_it_came[rank as usize];
            if dst.buf == *input {
                unwritten[dst.index as usize..(dst.index + instr.count) as usize].fill(false);
            }
        }
        if let Some(peer) = instr.send_peer() {
            debug_assert!(instr.op != Op::Copy);
            self.queues.entry((rank, peer, instr.channel)).or_default().push_back(value);
        }
        Ok(())
    }
}
