//! Copy and reduce kernels over raw byte buffers, and the data types and operators they
//! understand.
//!
//! [`mod@reference`] is the scalar oracle: one element at a time, NCCL's arithmetic, no
//! alignment needs. Every faster executor is tested by comparing its output with it.
//!
//! [`host`] is the fast path the runtime runs: the same results, bit for bit, a vector
//! block at a time, with the instruction set picked at run time.
//!
//! Architecture Invariant: kernels take bytes (`&mut [u8]`/`&[u8]`, or raw pointers and a
//! length in `host`, whose destination may be one of its sources) and a [`DataType`]; they
//! never allocate, lock or dispatch per element, so a runtime can call them on any part of
//! any buffer it owns.

pub mod cuda;
#[cfg(feature = "cuda-host")]
pub mod cuda_host;
mod dtype;
mod element;
mod error;
mod factor;
pub mod host;
mod op;
pub mod operator;
pub mod reference;

pub use dtype::{DataType, UnknownDataType};
pub use error::KernelError;
pub use factor::{NotAScalar, Scalar, ScalarError};
pub use op::{ReduceOp, UnknownReduceOp};
