//! The `twin` transport: rank threads whose plans run on the host twin of the CUDA interpreter (`exec/device/`),
//! with its plan encoding and flag protocol, on the CPU. Connection records live on the heap, one per (sender,
//! receiver, channel, slot size, lane); a launcher per call shape runs every rank's blocks in one launch, as ranks
//! sharing a GPU do. The bootstrap is the `threads` one.

use super::shm::{Heap, Memory};
use super::{Backend, Fabric, Ranks, Transport};
use crate::comm::{Communicator, Options};
use crate::error::RuntimeError;
use crate::exec::{twin_executor, Executor, Plan, TwinConns, TwinLaunchers};
use crate::launch::Launch;
use std::sync::Arc;

pub(crate) static TWIN: Twin = Twin;

pub(crate) struct Twin;

impl Backend for Twin {
    fn name(&self) -> &'static str {
        "twin"
    }

    fn about(&self) -> &'static str {
        "Ranks are threads running the CUDA interpreter's host twin (its plan encoding and flag protocol, on the CPU)"
    }

    fn ranks(&self) -> Ranks {
        Ranks::Threads
    }

    fn executor(&self, slots: u64, _gpu: Option<i32>) -> String {
        format!("device interpreter's host twin (one launch per call, single copy where a send's source stays, else {slots}-slot records")
    }

    fn group(&self, n_ranks: u32, options: Options) -> Result<Vec<Communicator>, RuntimeError> {
        let fabric = Arc::new(TwinFabric { n_ranks, conns: TwinConns::default(), launchers: TwinLaunchers::default() });
        Communicator::heap_group(fabric, &Memory::new(Arc::new(Heap::default())), n_ranks, options)
    }

    fn join(&self, _launch: &Launch, _options: Options) -> Result<Communicator, RuntimeError> {
        Err(RuntimeError::Config(Transport::of(&TWIN).for_processes(true).expect_err("its ranks are threads")))
    }
}

struct TwinFabric {
    n_ranks: u32,
    conns: TwinConns,
    launchers: TwinLaunchers,
}

impl Fabric for TwinFabric {
    fn transport(&self) -> Transport {
        Transport::of(&TWIN)
    }

    fn remove_all(&self) {}

    fn prepare(&self, plan: Plan) -> Result<Box<dyn Executor>, RuntimeError> {
        twin_executor(plan, self.n_ranks, &self.conns, &self.launchers)
    }
}
