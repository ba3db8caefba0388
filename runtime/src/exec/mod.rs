//! Executors: what runs a rank's `Plan` on its buffers. A transport's `Fabric` prepares one per call shape (opening
//! the plan's links); `Communicator::call` runs it. The host executor (`host.rs`) is generic over the transport's
//! `Link`, so its loop is compiled once per link type: no dynamic dispatch per instruction or element, only the one
//! `Executor::run` per call.

mod device;
mod host;
mod jit;
mod plan;

#[cfg(feature = "cuda-host")]
pub use device::build_host_driver;
#[cfg(feature = "cuda")]
pub(crate) use device::cuda;
pub(crate) use device::encode;
#[cfg(feature = "cuda")]
pub(crate) use device::Launcher;
pub(crate) use device::{twin_executor, TwinConns, TwinLaunchers};

pub(crate) use jit::executor;
pub use plan::Plan;
pub(crate) use plan::{prepare, Origin, PlanInput, NONE as NO_LINK};

use crate::error::RuntimeError;
use crate::link::{Bootstrap, CallInfo};
use crate::recorder::{Current, Recorder};
use std::cell::Cell;
use std::time::Duration;

/// One call as an executor runs it.
pub(crate) struct Call<'a> {
    pub bootstrap: &'a dyn Bootstrap,
    pub seq: u64,
    /// What the call is, as the links' headers and mismatch reports tell it.
    pub info: CallInfo,
    pub timeout: Duration,
    /// Idle rounds a wait spins before it yields the core.
    pub spins: u32,
    /// The communicator's flight recorder, and the dump requests (SIGUSR1) it has answered.
    pub recorder: &'a Recorder,
    pub answered: &'a Cell<u64>,
}

/// A plan prepared to run over its links: made once per call shape, run once per call.
pub(crate) trait Executor: Send {
    /// The plan, for setting the call's buffers (`Plan::bases`) before `run`.
    fn plan_mut(&mut self) -> &mut Plan;
    /// Runs the call; `run_recorded` is how a communicator calls it.
    fn run(&mut self, call: &Call) -> Result<(), RuntimeError>;
    /// Each instruction's state in call `seq`, in progress or just ended, as the flight recorder dumps it: read from
    /// the executor's own state (its counters, or the device interpreter's `done` words).
    fn snapshot(&self, seq: u64) -> Current;
    /// Whether a peer may still read this rank's buffers: a message of the last call it carried by reference has
    /// not been released.
    fn refs_outstanding(&self) -> bool {
        false
    }
    /// After a failed call, once the failure is announced: waits until no peer still reads this rank's buffers
    /// (each has released what it was reading, or stopped), within `timeout`.
    fn settle(&self, bootstrap: &dyn crate::link::Bootstrap, timeout: std::time::Duration) {
        let _ = (bootstrap, timeout);
    }
}

/// Runs `call` on `executor`; when it fails, the flight recorder's dump with the executor's snapshot: the one place
/// every executor's failure is dumped.
pub(crate) fn run_recorded(executor: &mut dyn Executor, call: &Call) -> Result<(), RuntimeError> {
    let outcome = executor.run(call);
    if let Err(error) = &outcome {
        call.recorder.dump(dump_reason(error), Some(executor.snapshot(call.seq)));
    }
    outcome
}

/// Why a dump is written for a call that failed with `error`.
pub(crate) fn dump_reason(error: &RuntimeError) -> &'static str {
    match error {
        RuntimeError::Timeout { .. } => "timeout",
        RuntimeError::PeerFailed { peer, rank, .. } if peer == rank => "abort",
        RuntimeError::PeerFailed { .. } => "peer failed",
        RuntimeError::Mismatch { .. } => "mismatch",
        _ => "error",
    }
}

/// Answers a dump request (SIGUSR1) that came since the last one this communicator answered, with `snapshot`:
/// what an executor calls while it waits, so a rank stuck in a call still dumps.
pub(crate) fn answer_dump_request(call: &Call, snapshot: impl FnOnce() -> Current) {
    let requests = crate::recorder::requests();
    if requests != call.answered.get() {
        call.answered.set(requests);
        call.recorder.dump("SIGUSR1", Some(snapshot()));
    }
}
