//! A GPU as a launch target (the ranks of a GPU in one cooperative grid) and the executor of one rank's plan on it.

use super::super::super::host::instr_state;
use super::super::super::{answer_dump_request, Call, Executor, Plan};
use super::super::encode::{self, code, control, CONTROL_WORDS, THREADS};
use super::super::launch::{self, most_telling, Launcher, Target};
use super::memory::{is_device_memory, DeviceAlloc, Pinned};
use super::{ok, Gpu};
use crate::error::RuntimeError;
use crate::recorder::Current;
use crate::wait::Backoff;
use cudarc::driver::sys::{self, CUdeviceptr, CUresult};
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One rank's part in the launches of its GPU.
pub(crate) struct CudaEntry {
    /// The interpreter it runs in: the kernels' own, or one compiled with the call's user operator.
    interpreter: sys::CUfunction,
    image: CUdeviceptr,
    state: CUdeviceptr,
    bases: CUdeviceptr,
    blocks: u32,
}

// SAFETY: CUDA handles may be used from any thread once the context is made current there (`Gpu::bind`), as `Gpu`'s.
unsafe impl Send for CudaEntry {}

/// A GPU as a launch target: cooperative grids of the interpreter, with the device word a faulting block sets to
/// the call's sequence number so every block stops.
pub(crate) struct CudaTarget {
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) system_scope: bool,
    pub(crate) stop: DeviceAlloc,
}

impl Target for CudaTarget {
    type Entry = CudaEntry;
    /// The launch table (4 words per block) and the control words (the abort request, then a fault report of
    /// `CONTROL_WORDS` per block), both host-mapped, and the grid.
    type Cached = (Pinned, Pinned, u32);

    fn blocks(entry: &CudaEntry) -> u32 {
        entry.blocks
    }

    fn run(
        &self,
        entries: &[(u32, CudaEntry)],
        cached: &mut Option<(Pinned, Pinned, u32)>,
        call: &Call,
        peers: &[u32],
        answer: &dyn Fn(),
    ) -> Result<[u64; CONTROL_WORDS], String> {
        if cached.is_none() {
            let grid: u32 = entries.iter().map(|(_, e)| e.blocks).sum();
            let fits = self.gpu.per_sm * self.gpu.sms;
            if grid > fits {
                return Err(format!(
                    "the launch needs {grid} blocks resident at once and GPU {} ({}) holds {fits}: put fewer \
                     ranks on it, or use an algorithm with fewer channels",
                    self.gpu.ordinal, self.gpu.name
                ));
            }
            let table = Pinned::new(&self.gpu, 4 * grid as usize)?;
            let mut at = 0;
            for (_, entry) in entries {
                for b in 0..entry.blocks {
                    table.set(4 * at, entry.image);
                    table.set(4 * at + 1, entry.state);
                    table.set(4 * at + 2, entry.bases);
                    table.set(4 * at + 3, b as u64);
                    at += 1;
                }
            }
            let control = Pinned::new(&self.gpu, 1 + CONTROL_WORDS * grid as usize)?;
            *cached = Some((table, control, grid));
        }
        let (table, control, grid) = cached.as_ref().expect("made above");
        if self.gpu.is_wedged() {
            return Err(format!(
                "GPU {} still runs an interpreter kernel that never finished (see the first error): this process \
                 cannot launch on it again; restart the job (the GPU may need a reset)",
                self.gpu.ordinal
            ));
        }
        self.gpu.bind()?;
        // The ranks of a launch make one call, by one operator (their fingerprints say so): one interpreter.
        let interpreter = entries.first().map_or(self.gpu.interpret, |(_, e)| e.interpreter);
        if entries.iter().any(|(_, e)| e.interpreter != interpreter) {
            return Err("the ranks of one launch reduce with different operators".into());
        }
        let (mut table_ptr, mut control_ptr, mut stop_ptr, mut seq) = (table.dev, control.dev, self.stop.ptr, call.seq);
        let mut timeout_ns = call.timeout.as_nanos().min(u64::MAX as u128) as u64;
        let mut system = self.system_scope as u32;
        let mut params: [*mut c_void; 6] = [
            (&mut table_ptr as *mut u64).cast(),
            (&mut control_ptr as *mut u64).cast(),
            (&mut stop_ptr as *mut u64).cast(),
            (&mut seq as *mut u64).cast(),
            (&mut timeout_ns as *mut u64).cast(),
            (&mut system as *mut u32).cast(),
        ];
        // SAFETY: the function takes these six parameters; the memory they point at lives in this launcher and in
        // the executors that registered, which wait for this launch before they return.
        ok(
            unsafe {
                sys::cuLaunchCooperativeKernel(
                    interpreter,
                    *grid,
                    1,
                    1,
                    THREADS,
                    1,
                    1,
                    0,
                    self.gpu.stream,
                    params.as_mut_ptr(),
                )
            },
            "cuLaunchCooperativeKernel",
        )?;
        let mut wait = Backoff::new(Duration::MAX, call.spins);
        let started = Instant::now();
        let mut asked_to_stop = false;
        let waited = loop {
            // SAFETY: a stream of this context.
            let status = unsafe { sys::cuStreamQuery(self.gpu.stream) };
            if status == CUresult::CUDA_SUCCESS {
                break Ok(());
            }
            if status != CUresult::CUDA_ERROR_NOT_READY {
                break ok(status, "the interpreter kernel");
            }
            // The kernel times out on its own (a block idle for the timeout); a peer's failure asks it to stop. A
            // call still running long after that is a kernel that cannot stop.
            let health = wait.idle(|| {
                answer();
                call.bootstrap.health(peers)
            });
            if health.is_err() && !asked_to_stop {
                control.set(0, call.seq);
                asked_to_stop = true;
            }
            if started.elapsed() > call.timeout * 10 + Duration::from_secs(60) {
                // The kernel may still read and write any memory of this GPU's launches: keep all of it.
                self.gpu.wedged.store(true, Ordering::Release);
                break Err(format!(
                    "the interpreter kernel on GPU {} ran 10 times its timeout without finishing or timing out: \
                     the GPU may need a reset",
                    self.gpu.ordinal
                ));
            }
        };
        // The most telling report of any block, all cleared.
        let words = most_telling(*grid as usize, |b, w| control.get(1 + CONTROL_WORDS * b + w));
        for b in 0..*grid as usize {
            control.set(1 + CONTROL_WORDS * b + control::CODE, code::OK);
        }
        waited?;
        Ok(words)
    }
}

/// One rank's plan on a GPU.
pub(crate) struct CudaExec {
    plan: Plan,
    _image: DeviceAlloc,
    /// The plan's part of the image, where the snapshot finds its `done` words in `state`.
    desc: encode::PlanDesc,
    state: DeviceAlloc,
    bases: Pinned,
    _scratch: Vec<DeviceAlloc>,
    /// The connection memory the transport keeps alive while this plan may run (records, mappings of a peer's).
    _conns: Box<dyn std::any::Any + Send>,
    launcher: Arc<Launcher<CudaTarget>>,
    token: u64,
}

impl CudaExec {
    /// Puts `plan`'s image on `gpu` with its state (`conn_table`: each connection record's address), scratch and
    /// host-mapped bases, and registers it with `launcher`.
    pub(crate) fn upload(
        plan: Plan,
        gpu: &Arc<Gpu>,
        image: &encode::Image,
        conn_table: &[u64],
        keep: Box<dyn std::any::Any + Send>,
        launcher: Arc<Launcher<CudaTarget>>,
    ) -> Result<Box<dyn Executor>, String> {
        let op = if plan.collective.reduces() { plan.op } else { collc_kernels::ReduceOp::Sum };
        let interpreter = gpu.interpreter_for(op)?;
        let image_mem = DeviceAlloc::zeroed(gpu, image.bytes().len())?;
        image_mem.write(0, image.bytes())?;
        let state = DeviceAlloc::zeroed(gpu, image.state_words() * 8)?;
        let table: Vec<u8> = conn_table.iter().flat_map(|a| a.to_le_bytes()).collect();
        state.write(image.conn_table_at() * 8, &table)?;
        let scratch: Vec<DeviceAlloc> =
            plan.scratch_bytes().into_iter().map(|bytes| DeviceAlloc::zeroed(gpu, bytes)).collect::<Result<_, _>>()?;
        let bases = Pinned::new(gpu, image.bases_words())?;
        for (b, memory) in scratch.iter().enumerate() {
            bases.set(2 + b, memory.ptr);
        }
        let blocks = image.header().n_blocks;
        let entry = CudaEntry { interpreter, image: image_mem.ptr, state: state.ptr, bases: bases.dev, blocks };
        let token = launcher.register(plan.rank, entry);
        Ok(Box::new(CudaExec {
            plan,
            _image: image_mem,
            desc: image.plan(0),
            state,
            bases,
            _scratch: scratch,
            _conns: keep,
            launcher,
            token,
        }))
    }
}

impl Drop for CudaExec {
    fn drop(&mut self) {
        // Its image, state and bases go with it: the next launch must not name them.
        self.launcher.unregister(self.plan.rank, self.token);
    }
}

impl Executor for CudaExec {
    fn plan_mut(&mut self) -> &mut Plan {
        &mut self.plan
    }

    fn run(&mut self, call: &Call) -> Result<(), RuntimeError> {
        let plan = &self.plan;
        for b in 0..2 {
            let addr = plan.bases[b] as u64;
            if addr != 0 && !is_device_memory(&self.launcher.target().gpu, addr) {
                return Err(RuntimeError::Config(format!(
                    "rank {}: buffer {addr:#x} is not device memory of its GPU {}: the cuda transport computes on \
                     memory from collc_runtime::cuda::DeviceBuffer::new(comm, ..) (or cuMemAlloc on that GPU)",
                    plan.rank,
                    self.launcher.target().gpu.ordinal
                )));
            }
            self.bases.set(b, addr);
        }
        let answer = || answer_dump_request(call, || self.snapshot(call.seq));
        let words = self.launcher.arrive(plan, call, &answer)?;
        launch::outcome(plan, &words, call)
    }

    /// The `done` words read from device memory while the kernel may still run (the launch stream does not block
    /// the copy); where they cannot be read (a wedged GPU), every instruction is `unknown`.
    fn snapshot(&self, seq: u64) -> Current {
        let mut bytes = vec![0u8; self.state.bytes];
        match self.state.read(0, &mut bytes) {
            Ok(()) => {
                let word = |w: usize| u64::from_le_bytes(bytes[8 * w..8 * w + 8].try_into().expect("8 bytes"));
                super::super::snapshot(&self.plan, &self.desc, seq, word)
            }
            Err(_) => {
                let plan = &self.plan;
                let instructions = (0..plan.steps.len()).map(|i| instr_state(plan, i, "unknown", false)).collect();
                Current { seq, algorithm: plan.algorithm.clone(), tile: 0, tiles: plan.n_tiles, instructions }
            }
        }
    }
}
