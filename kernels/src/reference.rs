//! The scalar reference kernels: the oracle every executor's output is checked against.
//!
//! Each kernel reads and writes little-endian bytes one element at a time, so buffers need
//! no alignment and the result does not depend on the host's SIMD width. Element arithmetic
//! (wrapping integers, half types through `f32`, NaN-losing `max`/`min`) lives in
//! `element.rs`; this file checks the buffers and walks them.

use crate::element::{with_element_type, Element};
use crate::{DataType, KernelError, ReduceOp};

/// Copies `src` into `dst` byte for byte; a copy needs no data type.
pub fn copy(dst: &mut [u8], src: &[u8]) -> Result<(), KernelError> {
    check_same_length(dst, src)?;
    dst.copy_from_slice(src);
    Ok(())
}

/// Combines `src` into `dst` elementwise: `dst[i] = dst[i] (op) src[i]`.
///
/// `Avg` combines as `Sum`, matching NCCL, which divides once after all ranks are summed;
/// call [`finish_avg`] on the final buffer. `PreMulSum` combines as `Sum` too: its multiplication is
/// [`premultiply`], on a rank's input. A user's operator is evaluated as its expression says
/// (`operator::Typed::reduce`), `dst` its first operand.
pub fn reduce(dtype: DataType, op: ReduceOp, dst: &mut [u8], src: &[u8]) -> Result<(), KernelError> {
    check_same_length(dst, src)?;
    check_whole_elements(dtype, dst)?;
    if let ReduceOp::User(user) = op {
        // The expression evaluated, never its compiled form: the oracle stays independent of what it checks.
        let prepared = user.prepare(dtype).map_err(|e| KernelError::Operator {
            name: user.name(),
            dtype,
            message: e.message.clone(),
        })?;
        prepared.typed.reduce(dst, src);
        return Ok(());
    }
    with_element_type!(dtype, Scalar => reduce_elements::<Scalar>(op, dst, src));
    Ok(())
}

/// Multiplies every element of `buf` by `factor` (one `dtype` element, little-endian: `Scalar::element`), with the
/// operator `Prod`'s arithmetic: PreMulSum's multiplication of a rank's input as it came.
pub fn premultiply(dtype: DataType, factor: &[u8], buf: &mut [u8]) -> Result<(), KernelError> {
    check_whole_elements(dtype, buf)?;
    let factor = &factor[..dtype.size_bytes()];
    with_element_type!(dtype, T => {
        let factor = T::load(factor);
        for element in buf.chunks_exact_mut(T::SIZE) {
            T::prod(T::load(element), factor).store(element);
        }
    });
    Ok(())
}

/// Divides every element of `buf` by `n_ranks`: the last step of an `Avg` reduction.
///
/// Integers truncate toward zero; `f16`/`bf16` divide in `f32` and round to nearest-even.
/// NCCL instead pre-multiplies float inputs by `1/n_ranks`, so float results may differ from
/// a GPU run in the last place; checkers compare floats with a tolerance.
pub fn finish_avg(dtype: DataType, buf: &mut [u8], n_ranks: usize) -> Result<(), KernelError> {
    if n_ranks == 0 {
        return Err(KernelError::ZeroRanks);
    }
    check_whole_elements(dtype, buf)?;
    with_element_type!(dtype, Scalar => divide_elements::<Scalar>(buf, n_ranks));
    Ok(())
}

fn check_same_length(dst: &[u8], src: &[u8]) -> Result<(), KernelError> {
    if dst.len() == src.len() {
        Ok(())
    } else {
        Err(KernelError::LengthMismatch { dst_bytes: dst.len(), src_bytes: src.len() })
    }
}

fn check_whole_elements(dtype: DataType, buf: &[u8]) -> Result<(), KernelError> {
    if buf.chunks_exact(dtype.size_bytes()).remainder().is_empty() {
        Ok(())
    } else {
        Err(KernelError::PartialElement { dtype, bytes: buf.len() })
    }
}

/// Picks the operator once, so the per-element loop is monomorphic.
fn reduce_elements<T: Element>(op: ReduceOp, dst: &mut [u8], src: &[u8]) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PreMulSum(_) => combine_each(dst, src, T::sum),
        ReduceOp::Prod => combine_each(dst, src, T::prod),
        ReduceOp::Max => combine_each(dst, src, T::max),
        ReduceOp::Min => combine_each(dst, src, T::min),
        ReduceOp::User(_) => unreachable!("evaluated by `reduce`"),
    }
}

fn combine_each<T: Element>(dst: &mut [u8], src: &[u8], combine: impl Fn(T, T) -> T) {
    let dst_elements = dst.chunks_exact_mut(T::SIZE);
    for (dst_element, src_element) in dst_elements.zip(src.chunks_exact(T::SIZE)) {
        combine(T::load(dst_element), T::load(src_element)).store(dst_element);
    }
}

fn divide_elements<T: Element>(buf: &mut [u8], n_ranks: usize) {
    for element in buf.chunks_exact_mut(T::SIZE) {
        T::divide(T::load(element), n_ranks).store(element);
    }
}

#[cfg(test)]
mod tests;
