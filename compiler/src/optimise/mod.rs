//! Optimisation passes over a `Schedule`. Each runs before verification, which checks the final result.

mod fuse;

pub use fuse::fuse;
