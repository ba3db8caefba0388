//! collc-runtime: executes verified schedules on real data.
//!
//! Today this holds the reference interpreter (`reference::run`), the oracle every faster executor and transport
//! will be checked against. Architecture invariant: nothing here accepts an unverified `Schedule`.

pub mod layout;
pub mod reference;

pub use layout::ChunkLayout;
pub use reference::{run, RunError};
