//! PreMulSum on the host: a rank's input multiplied by its factor as a kernel reads it, a block at a time through the
//! vector `Prod` kernel against a block of the factor, so it runs at the kernels' speed and matches
//! [`crate::reference::premultiply`] bit for bit. The products of a block stay in L1 until the sum reads them.

use super::reduce;
use crate::{DataType, ReduceOp, Scalar, ScalarError};

/// Bytes of one block: a whole number of elements of every type.
const BLOCK_BYTES: usize = 2048;
const BLOCK_WORDS: usize = BLOCK_BYTES / 8;

/// A factor in one data type, repeated over a block for the vector kernels.
#[derive(Clone)]
pub struct Factor {
    dtype: DataType,
    element: [u8; 8],
    block: [u64; BLOCK_WORDS],
}

impl Factor {
    /// `scalar` in `dtype`, or why that type cannot hold it.
    pub fn of(dtype: DataType, scalar: Scalar) -> Result<Factor, ScalarError> {
        Ok(Factor::new(dtype, scalar.element(dtype)?))
    }

    /// A factor from its element bytes (`Scalar::element`'s form), as another rank sent them.
    pub fn new(dtype: DataType, element: [u8; 8]) -> Factor {
        let mut block = [0u64; BLOCK_WORDS];
        let size = dtype.size_bytes();
        // SAFETY: `block` is BLOCK_BYTES of plain integers; every byte of it is written below.
        let bytes = unsafe { std::slice::from_raw_parts_mut(block.as_mut_ptr().cast::<u8>(), BLOCK_BYTES) };
        for slot in bytes.chunks_exact_mut(size) {
            slot.copy_from_slice(&element[..size]);
        }
        Factor { dtype, element, block }
    }

    /// The factor as one element (little-endian in the first `dtype.size_bytes()` bytes), for a message.
    pub fn element(&self) -> [u8; 8] {
        self.element
    }

    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// `dst[i] = src[i] * factor` for `n_elems` elements.
    ///
    /// # Safety
    /// As [`super::reduce`] with `a = src`: `dst` is exactly `src` or does not overlap it.
    pub unsafe fn apply(&self, dst: *mut u8, src: *const u8, n_elems: usize) {
        let per_block = BLOCK_BYTES / self.dtype.size_bytes();
        let elem = self.dtype.size_bytes();
        for start in (0..n_elems).step_by(per_block) {
            let m = per_block.min(n_elems - start);
            // SAFETY: forwarded from the caller; the factor block holds `per_block` elements.
            unsafe {
                let at = start * elem;
                reduce(self.dtype, ReduceOp::Prod, dst.add(at), src.add(at), self.block.as_ptr().cast(), m);
            }
        }
    }
}

/// `dst[i] = a'[i] + b'[i]`, where an operand with a factor is multiplied by it first (a rank's input as it came,
/// under PreMulSum) and one without is read as it is. Without either factor it is the `Sum` kernel.
///
/// # Safety
/// As [`super::reduce`]; both factors are of `dtype`.
pub unsafe fn premul_sum(
    dtype: DataType,
    dst: *mut u8,
    (a, a_factor): (*const u8, Option<&Factor>),
    (b, b_factor): (*const u8, Option<&Factor>),
    n_elems: usize,
) {
    if a_factor.is_none() && b_factor.is_none() {
        // SAFETY: forwarded from the caller.
        return unsafe { reduce(dtype, ReduceOp::Sum, dst, a, b, n_elems) };
    }
    let elem = dtype.size_bytes();
    let per_block = BLOCK_BYTES / elem;
    let mut a_scaled = [0u64; BLOCK_WORDS];
    let mut b_scaled = [0u64; BLOCK_WORDS];
    for start in (0..n_elems).step_by(per_block) {
        let m = per_block.min(n_elems - start);
        let at = start * elem;
        // SAFETY: forwarded from the caller; the scaled blocks hold `per_block` elements and overlap nothing. A block
        // of `a` and `b` is read before the same block of `dst` is written, so `dst` may be exactly `a` or `b`.
        unsafe {
            let (mut a_read, mut b_read) = (a.add(at), b.add(at));
            if let Some(factor) = a_factor {
                factor.apply(a_scaled.as_mut_ptr().cast(), a_read, m);
                a_read = a_scaled.as_ptr().cast();
            }
            if let Some(factor) = b_factor {
                factor.apply(b_scaled.as_mut_ptr().cast(), b_read, m);
                b_read = b_scaled.as_ptr().cast();
            }
            reduce(dtype, ReduceOp::Sum, dst.add(at), a_read, b_read, m);
        }
    }
}
