//! Optimisation passes: `pipeline` over an `ir::Program`, `fuse` over a `Schedule`. Each runs before
//! verification, which checks the final result.

mod fuse;
mod fuse_new;
mod pipeline;
mod receive_reduce;

pub use fuse::{fuse, fuse_rank};
pub use fuse_new::fuse_new_rank;
pub use pipeline::pipeline;
