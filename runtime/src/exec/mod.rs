//! Executors: what runs a rank's `Plan` on its buffers. A transport's `Fabric` prepares one per call shape (opening
//! the plan's links); `Communicator::call` runs it. The host executor (`host.rs`) is generic over the transport's
//! `Link`, so its loop is compiled once per link type: no dynamic dispatch per instruction or element, only the one
//! `Executor::run` per call.

mod device;
mod host;
mod plan;

#[cfg(feature = "cuda-host")]
pub use device::build_host_driver;
#[cfg(feature = "cuda")]
pub(crate) use device::cuda;
#[cfg(feature = "cuda")]
pub(crate) use device::{encode, Launcher};
pub(crate) use device::{twin_executor, TwinConns, TwinLaunchers};

pub(crate) use host::Host;
pub use plan::Plan;
pub(crate) use plan::{prepare, Origin, PlanInput};

use crate::error::RuntimeError;
use crate::link::{Bootstrap, CallInfo};
use crate::recorder::Recorder;
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
    fn run(&mut self, call: &Call) -> Result<(), RuntimeError>;
}
