//! Whole-block sums and products for the half types, which lane-by-lane code widens and
//! narrows slowly. Both combine in `f32` with `f32`'s lane operators, as a single lane does:
//! - `f16` through F16C, where allowed: eight lanes widen in one instruction and narrow back,
//!   rounding to nearest-even, in one more. F16C gives the same bits as the software
//!   conversion in `half_float.rs` (NaNs quieted with their payload kept, subnormals exact),
//!   which is what `half` itself uses when the CPU has F16C.
//! - `bf16` two lanes to a `u32`, so widening and narrowing are shifts and masks within
//!   32-bit vector lanes, with no shuffles between 16- and 32-bit lanes.
//!
//! `Max` and `Min` need no widening and go lane by lane.

use half::{bf16, f16};

use super::half_float::{bf16_to_f32, f32_to_bf16};
use super::lane::{combine_each, Combine};

/// `lanes[i] = lanes[i] (O) other[i]` for a block of `f16`s whose length is a multiple of 8;
/// F16C only pays for `Sum` and `Prod`, as `Max` and `Min` need no conversion.
///
/// # Safety
/// With `F16C`, the CPU must have F16C.
#[inline(always)]
pub(super) unsafe fn combine_f16_block<O: Combine, const F16C: bool>(lanes: &mut [f16], other: &[f16]) {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    if F16C && O::COMPUTES {
        // SAFETY: the caller vouches for F16C.
        unsafe { combine_with_f16c::<O>(lanes, other) };
        return;
    }
    combine_each::<f16, O>(lanes, other);
}

#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
#[inline(always)]
unsafe fn combine_with_f16c<O: Combine>(lanes: &mut [f16], other: &[f16]) {
    #[cfg(target_arch = "x86")]
    use std::arch::x86::{
        __m256, _mm256_cvtph_ps, _mm256_cvtps_ph, _mm_loadu_si128, _mm_storeu_si128, _MM_FROUND_TO_NEAREST_INT,
    };
    #[cfg(target_arch = "x86_64")]
    use std::arch::x86_64::{
        __m256, _mm256_cvtph_ps, _mm256_cvtps_ph, _mm_loadu_si128, _mm_storeu_si128, _MM_FROUND_TO_NEAREST_INT,
    };
    use std::mem::transmute;

    debug_assert_eq!(lanes.len() % 8, 0);
    for (chunk, other_chunk) in lanes.chunks_exact_mut(8).zip(other.chunks_exact(8)) {
        // SAFETY: each chunk is 16 bytes (unaligned loads and stores); F16C is the caller's
        // promise; `__m256` and `[f32; 8]` have the same size and any bits are valid in both.
        unsafe {
            let wide: [f32; 8] = transmute(_mm256_cvtph_ps(_mm_loadu_si128(chunk.as_ptr().cast())));
            let other_wide: [f32; 8] = transmute(_mm256_cvtph_ps(_mm_loadu_si128(other_chunk.as_ptr().cast())));
            let combined: [f32; 8] = std::array::from_fn(|lane| O::apply(wide[lane], other_wide[lane]));
            let narrowed = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(transmute::<[f32; 8], __m256>(combined));
            _mm_storeu_si128(chunk.as_mut_ptr().cast(), narrowed);
        }
    }
}

/// `lanes[i] = lanes[i] (O) other[i]` for a block of `bf16`s whose length is even.
///
/// # Safety
/// None beyond the signature's; `unsafe` to match the other block hooks.
#[inline(always)]
pub(super) unsafe fn combine_bf16_block<O: Combine, const F16C: bool>(lanes: &mut [bf16], other: &[bf16]) {
    if !O::COMPUTES {
        return combine_each::<bf16, O>(lanes, other);
    }
    debug_assert_eq!(lanes.len() % 2, 0);
    debug_assert_eq!(lanes.len(), other.len());
    let (lane_pairs, other_pairs) = (lanes.as_mut_ptr().cast::<u32>(), other.as_ptr().cast::<u32>());
    for pair in 0..lanes.len() / 2 {
        // SAFETY: `pair * 2 + 1 < len` for both slices; unaligned accesses need no alignment.
        unsafe {
            let combined = combine_pair::<O>(
                u32::from_le(lane_pairs.add(pair).read_unaligned()),
                u32::from_le(other_pairs.add(pair).read_unaligned()),
            );
            lane_pairs.add(pair).write_unaligned(combined.to_le());
        }
    }
}

/// Two `bf16` lanes (low half first) of `a (O) b`.
#[inline(always)]
fn combine_pair<O: Combine>(a: u32, b: u32) -> u32 {
    let combine = |a: u32, b: u32| {
        let wide = O::apply(bf16_to_f32(a as u16), bf16_to_f32(b as u16));
        u32::from(f32_to_bf16(wide))
    };
    combine(a, b) | combine(a >> 16, b >> 16) << 16
}
