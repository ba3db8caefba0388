//! One rank's part of `collc run`: for every size, data type and op, warm up, time `-n` back-to-back calls out of
//! place and in place, check one call of each on crafted data, and report to rank 0.

use super::Job;
use collc_compiler::Collective;
use collc_kernels::{DataType, ReduceOp};
use collc_runtime::{check, Buffers, CallShape, Communicator, RuntimeError};
use std::time::Instant;

/// One measured placement of one row, as rank 0 sees it: the slowest rank's time, wrong elements over all ranks.
#[derive(Clone, Copy, Debug)]
pub struct Cell {
    pub seconds: f64,
    pub wrong: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct Row {
    pub bytes: usize,
    pub count: usize,
    pub dtype: DataType,
    pub op: Option<ReduceOp>,
    pub root: Option<u32>,
    pub out_of_place: Cell,
    pub in_place: Cell,
}

/// Elements of one call's `count` per byte of the size column: nccl-tests' S is count*size for allreduce,
/// broadcast, reduce and sendrecv, and count*size*nranks for the others.
pub fn size_factor(collective: Collective, n_ranks: u32) -> usize {
    match collective {
        Collective::AllReduce | Collective::Broadcast | Collective::Reduce | Collective::SendRecv => 1,
        _ => n_ranks as usize,
    }
}

/// Runs the whole sweep on this rank; rank 0 gets the rows.
pub fn sweep(comm: &mut Communicator, job: &Job) -> Result<Option<Vec<Row>>, RuntimeError> {
    let ops: Vec<Option<ReduceOp>> =
        if job.collective.reduces() { job.ops.iter().copied().map(Some).collect() } else { vec![None] };
    let mut rows = Vec::new();
    let mut buffers = Scratch::default();
    warm_up(comm, job, &mut buffers)?;
    for &dtype in &job.dtypes {
        for &op in &ops {
            for &bytes in &job.sizes {
                let count = bytes / (dtype.size_bytes() * size_factor(job.collective, job.n_ranks));
                let shape = CallShape {
                    collective: job.collective,
                    count,
                    dtype,
                    op: op.unwrap_or(ReduceOp::Sum),
                    root: job.root,
                    peer: job.peer,
                };
                let out_of_place = measure(comm, job, &shape, false, &mut buffers)?;
                let in_place = measure(comm, job, &shape, true, &mut buffers)?;
                if let (Some(oop), Some(ip)) = (out_of_place, in_place) {
                    rows.push(Row {
                        bytes: count * dtype.size_bytes() * size_factor(job.collective, job.n_ranks),
                        count: count * size_factor(job.collective, job.n_ranks),
                        dtype,
                        op,
                        root: job.collective.rooted().then_some(job.root),
                        out_of_place: oop,
                        in_place: ip,
                    });
                }
            }
        }
    }
    Ok((comm.rank() == 0).then_some(rows))
}

/// As nccl-tests does before its sweep: `-w` calls at the largest size, then at the smallest, so the first row does
/// not pay for first touches of the buffers and the FIFOs, nor for the ranks settling on their cores.
fn warm_up(comm: &mut Communicator, job: &Job, scratch: &mut Scratch) -> Result<(), RuntimeError> {
    let (Some(&dtype), Some(&op)) = (job.dtypes.first(), job.ops.first()) else { return Ok(()) };
    let (in_blocks, out_blocks) = check::blocks(job.collective, job.n_ranks);
    for &bytes in [job.sizes.last(), job.sizes.first()].into_iter().flatten() {
        let count = bytes / (dtype.size_bytes() * size_factor(job.collective, job.n_ranks));
        let shape = CallShape { collective: job.collective, count, dtype, op, root: job.root, peer: job.peer };
        let (send_len, recv_len) = (in_blocks * count * dtype.size_bytes(), out_blocks * count * dtype.size_bytes());
        grow(&mut scratch.send, send_len);
        grow(&mut scratch.recv, recv_len);
        for _ in 0..job.warmup {
            let buffers = Buffers::OutOfPlace { send: &scratch.send[..send_len], recv: &mut scratch.recv[..recv_len] };
            comm.call(shape, buffers)?;
        }
    }
    Ok(())
}

/// Buffers reused across rows, so a row pays no page faults of the last one's size.
#[derive(Default)]
struct Scratch {
    send: Vec<u8>,
    recv: Vec<u8>,
}

fn grow(buf: &mut Vec<u8>, len: usize) {
    if buf.len() < len {
        buf.resize(len, 0);
    }
}

fn measure(
    comm: &mut Communicator,
    job: &Job,
    shape: &CallShape,
    in_place: bool,
    scratch: &mut Scratch,
) -> Result<Option<Cell>, RuntimeError> {
    let elem = shape.dtype.size_bytes();
    let (in_blocks, out_blocks) = check::blocks(shape.collective, job.n_ranks);
    let (send_len, recv_len) = (in_blocks * shape.count * elem, out_blocks * shape.count * elem);
    let shared_len = send_len.max(recv_len);
    grow(&mut scratch.send, send_len.max(shared_len));
    grow(&mut scratch.recv, recv_len);
    let mut call = |comm: &mut Communicator, scratch: &mut Scratch| {
        let buffers = if in_place {
            Buffers::InPlace(&mut scratch.send[..shared_len])
        } else {
            Buffers::OutOfPlace { send: &scratch.send[..send_len], recv: &mut scratch.recv[..recv_len] }
        };
        comm.call(*shape, buffers)
    };
    for _ in 0..job.warmup {
        call(comm, scratch)?;
    }
    comm.barrier()?;
    let started = Instant::now();
    for _ in 0..job.iters {
        call(comm, scratch)?;
    }
    let seconds = started.elapsed().as_secs_f64() / job.iters as f64;
    let wrong = if job.check { Some(check_one(comm, job, shape, in_place, scratch, &mut call)?) } else { None };
    let all = comm.gather_report(seconds, wrong.unwrap_or(0))?;
    Ok(all.map(|all| Cell {
        seconds: all.iter().map(|r| r.0).fold(0.0, f64::max),
        wrong: wrong.map(|_| all.iter().map(|r| r.1).sum()),
    }))
}

/// Fills the input with crafted data, runs one call and counts output elements that differ from the definition.
fn check_one(
    comm: &mut Communicator,
    job: &Job,
    shape: &CallShape,
    in_place: bool,
    scratch: &mut Scratch,
    call: &mut impl FnMut(&mut Communicator, &mut Scratch) -> Result<(), RuntimeError>,
) -> Result<u64, RuntimeError> {
    let (rank, block) = (comm.rank(), shape.count * shape.dtype.size_bytes());
    let input = check::input(shape, job.n_ranks, rank);
    let (in_offset, out_offset) = if in_place {
        let (i, o) = shape.collective.in_place_offsets(rank, 1);
        (i as usize * block, o as usize * block)
    } else {
        (0, 0)
    };
    scratch.recv.fill(0xEE);
    if in_place {
        scratch.send.fill(0xEE);
    }
    scratch.send[in_offset..in_offset + input.len()].copy_from_slice(&input);
    call(comm, scratch)?;
    let Some(want) = check::expected(shape, job.n_ranks, rank) else { return Ok(0) };
    let got = if in_place { &scratch.send[out_offset..out_offset + want.len()] } else { &scratch.recv[..want.len()] };
    Ok(check::count_wrong(shape.dtype, &want, got) as u64)
}
