//! The one error type every kernel returns: buffers that do not line up.

use thiserror::Error;

use crate::DataType;

/// Why a kernel refused its buffers; kernels check before touching any byte, so on error
/// the destination is unchanged.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum KernelError {
    #[error("destination has {dst_bytes} bytes but source has {src_bytes}")]
    LengthMismatch { dst_bytes: usize, src_bytes: usize },

    #[error(
        "{bytes} bytes is not a whole number of {dtype} elements ({} bytes each)",
        dtype.size_bytes()
    )]
    PartialElement { dtype: DataType, bytes: usize },

    #[error("cannot average over zero ranks")]
    ZeroRanks,

    #[error("the operator `{name}` does not type on {dtype}: {message}")]
    Operator { name: &'static str, dtype: DataType, message: String },
}
