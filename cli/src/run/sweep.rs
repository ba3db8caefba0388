//! One rank's part of `collc run`: for every size, data type and op, warm up, time `-n` back-to-back calls out of
//! place and in place, check one call of each on crafted data, and report to rank 0.

use super::{Choice, Job};
use collc_compiler::{Collective, Placement};
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
    /// `None` for a placement the job does not run (a `.sched` file holds one).
    pub out_of_place: Option<Cell>,
    pub in_place: Option<Cell>,
    /// The algorithm that ran this row (the job's, or the one selected for its size).
    pub algorithm: String,
    /// `Some(true)` when the cost model chose this row's algorithm for its size, `Some(false)` when `--compare` timed
    /// another candidate, `None` when the job names its algorithm.
    pub predicted: Option<bool>,
}

/// Elements of one call's `count` per byte of the size column: nccl-tests' S is count*size for allreduce,
/// broadcast, reduce and sendrecv, and count*size*nranks for the others.
pub fn size_factor(collective: Collective, n_ranks: u32) -> usize {
    collc_runtime::select::call_bytes(collective, 1, 1, n_ranks)
}

/// Switches to `choice` unless it already runs (a fixed algorithm always does) or the communicator chooses by
/// itself (a selection, which runs what it chooses for each call; `--compare` sets each candidate in turn).
fn use_algorithm(comm: &mut Communicator, job: &Job, choice: &Choice) {
    let choosing = job.algorithms.selected && job.algorithms.compared.is_empty();
    if !choosing && comm.algorithm(job.collective) != choice.name {
        comm.set_algorithm(job.collective, &choice.name, &choice.source, choice.params.clone());
    }
}

/// Runs the whole sweep on this rank; on rank 0 `on_row` gets each row as soon as it is measured, and `on_stage`
/// what the sweep does before its first row (the warm-up calls, which set the buffers up).
pub fn sweep(
    comm: &mut Communicator,
    job: &Job,
    on_row: &mut dyn FnMut(Row),
    on_stage: &mut dyn FnMut(&str, bool),
) -> Result<(), RuntimeError> {
    let ops: Vec<Option<ReduceOp>> =
        if job.collective.reduces() { job.ops.iter().copied().map(Some).collect() } else { vec![None] };
    let mut buffers = Scratch::default();
    warm_up(comm, job, &mut buffers, on_stage)?;
    for &dtype in &job.dtypes {
        for &op in &ops {
            for &bytes in &job.sizes {
                let model_choice = &job.algorithm_for(bytes).name;
                for choice in job.timed_at(bytes) {
                    use_algorithm(comm, job, choice);
                    let comparing = !job.algorithms.compared.is_empty();
                    let predicted = job.algorithms.selected.then(|| !comparing || choice.name == *model_choice);
                    let row = measure_row(comm, job, bytes, (dtype, op), predicted, &mut buffers)?;
                    row.into_iter().for_each(&mut *on_row);
                }
            }
        }
    }
    Ok(())
}

/// One row: `bytes` of `dtype` timed out of place and in place with the algorithm the communicator runs for it,
/// which the cost model `predicted` or not (rank 0 gets the row, the other ranks `None`).
fn measure_row(
    comm: &mut Communicator,
    job: &Job,
    bytes: usize,
    (dtype, op): (DataType, Option<ReduceOp>),
    predicted: Option<bool>,
    buffers: &mut Scratch,
) -> Result<Option<Row>, RuntimeError> {
    let count = bytes / (dtype.size_bytes() * size_factor(job.collective, job.n_ranks));
    let shape = CallShape {
        collective: job.collective,
        count,
        dtype,
        op: op.unwrap_or(ReduceOp::Sum),
        root: job.root,
        peer: job.peer,
    };
    let mut cells = [None, None];
    for (cell, placement) in cells.iter_mut().zip(Placement::BOTH) {
        if job.runs(placement) {
            *cell = measure(comm, job, &shape, placement == Placement::InPlace, buffers)?;
        }
    }
    // Asked after the calls: with COLLC_LEARN=1 the size class's first calls explore, and then it runs what it learned.
    let algorithm = comm.algorithm_of(&shape)?;
    let [out_of_place, in_place] = cells;
    Ok((comm.rank() == 0).then(|| Row {
        bytes: count * dtype.size_bytes() * size_factor(job.collective, job.n_ranks),
        count: count * size_factor(job.collective, job.n_ranks),
        dtype,
        op,
        root: job.collective.rooted().then_some(job.root),
        out_of_place,
        in_place,
        algorithm: algorithm.to_string(),
        predicted,
    }))
}

/// As nccl-tests does before its sweep: `-w` calls at the largest size, then at the smallest, so the first row does
/// not pay for first touches of the buffers and the FIFOs, nor for the ranks settling on their cores.
fn warm_up(
    comm: &mut Communicator,
    job: &Job,
    scratch: &mut Scratch,
    on_stage: &mut dyn FnMut(&str, bool),
) -> Result<(), RuntimeError> {
    let (Some(&dtype), Some(&op)) = (job.dtypes.first(), job.ops.first()) else { return Ok(()) };
    for &bytes in [job.sizes.last(), job.sizes.first()].into_iter().flatten() {
        for choice in job.timed_at(bytes) {
            use_algorithm(comm, job, choice);
            warm_up_at(comm, job, bytes, dtype, op, scratch, on_stage)?;
        }
    }
    Ok(())
}

/// Sizes from which a row's first call (its buffers' first touch) takes long enough to be announced.
const SLOW_SETUP_BYTES: usize = 64 << 20;

/// `-w` untimed calls of `bytes` out of place (in place where the job runs only that) with the algorithm that runs
/// now, each announced to `on_stage` on rank 0 (the first one at a size sets its buffers up).
fn warm_up_at(
    comm: &mut Communicator,
    job: &Job,
    bytes: usize,
    dtype: DataType,
    op: ReduceOp,
    scratch: &mut Scratch,
    on_stage: &mut dyn FnMut(&str, bool),
) -> Result<(), RuntimeError> {
    let count = bytes / (dtype.size_bytes() * size_factor(job.collective, job.n_ranks));
    let shape = CallShape { collective: job.collective, count, dtype, op, root: job.root, peer: job.peer };
    let in_place = !job.runs(Placement::OutOfPlace);
    let windows = check::windows(&shape, job.n_ranks, comm.rank(), in_place);
    for call in 0..job.warmup {
        if comm.rank() == 0 {
            // The first call at a size of many megabytes sets its buffers up, which takes seconds: said at once.
            let slow = call == 0 && bytes >= SLOW_SETUP_BYTES;
            on_stage(&format!("warm-up at {bytes} B: call {} of {}", call + 1, job.warmup), slow);
        }
        scratch.call(comm, &shape, &windows, in_place)?;
    }
    Ok(())
}

/// Buffers reused across rows, so a row pays no page faults of the last one's size; allocated by the communicator
/// (`Communicator::alloc`), so that over shm the ranks read them in place. Over the cuda transport the calls run on
/// device buffers of the rank's GPU, and `send`/`recv` are their host copies for the data check.
#[derive(Default)]
struct Scratch {
    send: Grown,
    recv: Grown,
    #[cfg(feature = "cuda")]
    device: Option<(collc_runtime::cuda::DeviceBuffer, collc_runtime::cuda::DeviceBuffer)>,
}

impl Scratch {
    /// One call on these buffers, laid out as `windows` says (in place: all in `send`).
    fn call(
        &mut self,
        comm: &mut Communicator,
        shape: &CallShape,
        windows: &check::Windows,
        in_place: bool,
    ) -> Result<(), RuntimeError> {
        #[cfg(feature = "cuda")]
        if comm.gpu_ordinal().is_some() {
            let (send, recv) = self.device_buffers(comm, windows)?;
            let buffers = match in_place {
                true => Buffers::DeviceInPlace(send.slice(0, windows.send)),
                false => {
                    Buffers::DeviceOutOfPlace { send: send.slice(0, windows.send), recv: recv.slice(0, windows.recv) }
                }
            };
            return comm.call(*shape, buffers);
        }
        self.send.grow(comm, windows.send);
        self.recv.grow(comm, windows.recv);
        let buffers = match in_place {
            true => Buffers::InPlace(&mut self.send[..windows.send]),
            false => Buffers::OutOfPlace { send: &self.send[..windows.send], recv: &mut self.recv[..windows.recv] },
        };
        comm.call(*shape, buffers)
    }

    /// The device buffers, grown to `windows` (a new pair when the last is too small).
    #[cfg(feature = "cuda")]
    fn device_buffers(
        &mut self,
        comm: &Communicator,
        windows: &check::Windows,
    ) -> Result<&(collc_runtime::cuda::DeviceBuffer, collc_runtime::cuda::DeviceBuffer), RuntimeError> {
        use collc_runtime::cuda::DeviceBuffer;
        let fits = self.device.as_ref().is_some_and(|(s, r)| s.len() >= windows.send && r.len() >= windows.recv);
        if !fits {
            self.device = None;
            self.device = Some((DeviceBuffer::new(comm, windows.send)?, DeviceBuffer::new(comm, windows.recv)?));
        }
        Ok(self.device.as_ref().expect("set above"))
    }

    /// Before a checked call: the host copies (filled by the caller) go to the device buffers.
    fn upload(&mut self, comm: &Communicator, windows: &check::Windows) -> Result<(), RuntimeError> {
        #[cfg(feature = "cuda")]
        if comm.gpu_ordinal().is_some() {
            let (send, recv) = (self.send[..windows.send].to_vec(), self.recv[..windows.recv].to_vec());
            let (d_send, d_recv) = self.device_buffers(comm, windows)?;
            d_send.write(0, &send)?;
            d_recv.write(0, &recv)?;
        }
        let _ = (comm, windows);
        Ok(())
    }

    /// After a checked call: the device buffers come back into the host copies.
    fn download(&mut self, comm: &Communicator, windows: &check::Windows) -> Result<(), RuntimeError> {
        #[cfg(feature = "cuda")]
        if comm.gpu_ordinal().is_some() {
            if let Some((d_send, d_recv)) = &self.device {
                d_send.read(0, &mut self.send[..windows.send])?;
                d_recv.read(0, &mut self.recv[..windows.recv])?;
            }
        }
        let _ = (comm, windows);
        Ok(())
    }
}

/// A buffer from the communicator, replaced by a larger one when a row needs more (its bytes are the caller's to set).
#[derive(Default)]
struct Grown(Option<collc_runtime::HostBuffer>);

impl Grown {
    fn grow(&mut self, comm: &Communicator, len: usize) {
        if self.0.as_ref().map_or(0, |buf| buf.len()) < len {
            self.0 = None;
            self.0 = Some(comm.alloc(len));
        }
    }
}

impl std::ops::Deref for Grown {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.0.as_deref().unwrap_or(&[])
    }
}

impl std::ops::DerefMut for Grown {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.0.as_deref_mut().unwrap_or(&mut [])
    }
}

fn measure(
    comm: &mut Communicator,
    job: &Job,
    shape: &CallShape,
    in_place: bool,
    scratch: &mut Scratch,
) -> Result<Option<Cell>, RuntimeError> {
    let windows = check::windows(shape, job.n_ranks, comm.rank(), in_place);
    for _ in 0..job.warmup {
        scratch.call(comm, shape, &windows, in_place)?;
    }
    comm.barrier()?;
    let started = Instant::now();
    for k in 0..job.iters {
        // `--trace`: the last timed calls are recorded (the check after them is not).
        if let Some(trace) = &job.trace {
            comm.trace_calls(trace.records(k, job.iters));
        }
        scratch.call(comm, shape, &windows, in_place)?;
    }
    comm.trace_calls(false);
    let seconds = started.elapsed().as_secs_f64() / job.iters as f64;
    // Every rank stops its clock before any rank goes on to the data check: with more ranks than cores, a rank
    // still in its last call would otherwise wait for a core while the others fill their buffers for the check.
    comm.barrier()?;
    let wrong = if job.check { Some(check_one(comm, job, shape, &windows, in_place, scratch)?) } else { None };
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
    windows: &check::Windows,
    in_place: bool,
    scratch: &mut Scratch,
) -> Result<u64, RuntimeError> {
    let rank = comm.rank();
    scratch.send.grow(comm, windows.send);
    scratch.recv.grow(comm, windows.recv);
    scratch.send.fill(0xEE);
    scratch.recv.fill(0xEE);
    scratch.send[windows.input.clone()].copy_from_slice(&check::input(shape, job.n_ranks, rank));
    scratch.upload(comm, windows)?;
    scratch.call(comm, shape, windows, in_place)?;
    scratch.download(comm, windows)?;
    let Some(want) = check::expected(shape, job.n_ranks, rank) else { return Ok(0) };
    let got = if in_place { &scratch.send[windows.output.clone()] } else { &scratch.recv[windows.output.clone()] };
    Ok(check::count_wrong_for(shape, job.n_ranks, &want, got) as u64)
}
