//! Shared memory, for ranks on one host: NCCL's SHM transport. Every connection is a FIFO of message slots
//! (`fifo.rs`) in a segment (`segment.rs`) every rank can map: on the heap of one process for `threads`, a file in
//! `/dev/shm` for `shm`. The bootstrap is a control block in a segment of its own (`control.rs`).

mod control;
mod fifo;
mod segment;

pub(crate) use control::Control;
pub use fifo::segment_bytes;
pub use segment::Shm;
pub(crate) use segment::{Heap, Segments};

use crate::error::RuntimeError;
use crate::exec::{Executor, Host, Plan};
use crate::transport::{Bootstrap, Fabric, Status, Transport};
use fifo::Fifo;
use std::sync::Arc;

/// Links as FIFOs in the segments of one job.
pub(crate) struct Memory {
    segments: Arc<dyn Segments>,
}

impl Memory {
    pub fn new(segments: Arc<dyn Segments>) -> Memory {
        Memory { segments }
    }

    /// The job's control block, for a rank of `n_ranks`.
    pub fn bootstrap(&self, n_ranks: u32) -> Result<Control, RuntimeError> {
        Control::open(self.segments.as_ref(), n_ranks)
    }
}

impl Fabric for Memory {
    fn transport(&self) -> Transport {
        self.segments.transport()
    }

    fn remove_all(&self) {
        self.segments.remove_all();
    }

    fn prepare(&self, plan: Plan) -> Result<Box<dyn Executor>, RuntimeError> {
        let links = plan.links.iter().map(|end| Fifo::open(self.segments.as_ref(), end)).collect::<Result<_, _>>()?;
        Ok(Box::new(Host { plan, links }))
    }
}

/// For a launcher whose rank process `failed_rank` died: marks it failed in job `job`'s control block, so every
/// other rank stops with an error naming it instead of waiting for its timeout.
pub fn mark_rank_failed(job: &str, n_ranks: u32, failed_rank: u32) -> Result<(), RuntimeError> {
    let control = Control::open(&Shm::new(job), n_ranks)?;
    let _ = control.leave(failed_rank, Status::Failed);
    Ok(())
}
