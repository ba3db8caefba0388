//! collc-runtime: executes verified schedules on real data.
//!
//! - `reference`: the interpreter every executor and transport is checked against (the oracle).
//! - `Communicator` (`comm.rs`): one rank's handle, NCCL-shaped calls; a `Plan` (`exec/plan.rs`) prepared once per
//!   call shape and run by an executor (`exec/`) over the links of a transport (`transport/`), whose bootstrap
//!   does joins, barriers, call fingerprints and aborts.
//! - Transports, one `Backend` each in `transport::backends()`: `threads` (heap segments shared by rank threads) and
//!   `shm` (`/dev/shm` files mapped by rank processes), both `transport/shm/`; `tcp` (`transport/tcp/`); `twin` and
//!   `cuda` (`transport/twin/`, `transport/cuda/`: where their connection records live; their executors, the device
//!   interpreter's encoding, its host twin and with the `cuda` feature the GPU executor, in `exec/device/`);
//!   `link.rs`, what executors and transports share; `launch.rs` reads torchrun / mpirun / Slurm environments.
//! - `select`: the choice of algorithm per call for a collective no algorithm is set for; `algo_path`, users' own
//!   algorithms (`COLLC_ALGO_PATH`) beside the library's.
//!
//! Architecture invariant: nothing here accepts an unverified `Schedule`; a `Plan` is made from a
//! `VerifiedSchedule` only.

pub mod algo_path;
pub mod check;
mod collectives;
pub mod comm;
#[cfg(feature = "cuda")]
pub mod cuda;
mod error;
mod exec;
mod host_buffer;
pub mod launch;
pub mod layout;
mod link;
pub mod log;
pub mod recorder;
pub mod reference;
pub mod select;
pub mod trace;
pub mod transport;
mod wait;

pub use collc_compiler::Collective;
pub use collc_kernels::{DataType, ReduceOp};
pub use collectives::Element;
pub use comm::{AbortHandle, Buffers, CallShape, Communicator, DevicePtr, HostExecutor, Options};
pub use error::RuntimeError;
#[cfg(feature = "cuda-host")]
pub use exec::build_host_driver;
pub use exec::Plan;
pub use host_buffer::HostBuffer;
pub use layout::ChunkLayout;
pub use reference::run;
#[cfg(feature = "ib")]
pub use transport::ib::soft::build_soft_verbs;
pub use transport::shm::{mark_rank_failed as mark_shm_rank_failed, segment_bytes as fifo_bytes, Shm};
pub use transport::{backends, Backend, Ranks, SlotPolicy, Transport};
