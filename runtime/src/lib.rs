//! collc-runtime: executes verified schedules on real data.
//!
//! - `reference`: the interpreter every executor and transport is checked against (the oracle).
//! - `Communicator` (`comm.rs`): one rank's handle, NCCL-shaped calls; `Plan` (`plan.rs`) prepared once per call
//!   shape; the host executor (`exec.rs`) runs it over FIFOs (`fifo.rs`) in shared segments (`segment.rs`) with a
//!   control block (`control.rs`) for joins, barriers, call fingerprints and aborts.
//! - Transports: `threads` (heap segments shared by rank threads) and `shm` (`/dev/shm` files mapped by rank
//!   processes); `launch.rs` reads torchrun / mpirun / Slurm environments.
//!
//! Architecture invariant: nothing here accepts an unverified `Schedule`; a `Plan` is made from a
//! `VerifiedSchedule` only.

pub mod check;
mod collectives;
pub mod comm;
mod control;
mod error;
mod exec;
mod fifo;
pub mod launch;
pub mod layout;
mod plan;
pub mod reference;
mod segment;
pub mod transport;
mod wait;

pub use collc_compiler::Collective;
pub use collc_kernels::{DataType, ReduceOp};
pub use collectives::Element;
pub use comm::{mark_shm_rank_failed, Buffers, CallShape, Communicator, Options};
pub use error::RuntimeError;
pub use fifo::segment_bytes as fifo_bytes;
pub use layout::ChunkLayout;
pub use plan::Plan;
pub use reference::run;
pub use segment::Shm;
pub use transport::Transport;
