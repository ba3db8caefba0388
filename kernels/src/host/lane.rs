//! One element of each data type as a SIMD lane: how it combines under each operator, written
//! without branches so LLVM turns a block of lanes into vector instructions.
//!
//! The semantics are `element.rs`'s, re-expressed: wrapping integers, NaN-losing float
//! `max`/`min` with `-0 < +0`, and `f16`/`bf16` combined in `f32` (through `half_float.rs`).
//! The host tests compare every type and operator with the reference bit for bit.

use half::{bf16, f16};

use super::half_float::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

/// Bytes one main-loop block covers per operand: two AVX-512 or four AVX2 registers, few
/// enough that a block's operands stay in registers until its result is stored.
pub(super) const WIDE_BYTES: usize = 128;
/// Bytes one tail block covers per operand: one SSE2 or NEON register.
pub(super) const NARROW_BYTES: usize = 16;

/// A fixed-size array of lanes, loaded and stored whole.
pub(super) trait Block<T>: Copy {
    const LEN: usize;
    fn lanes(&self) -> &[T];
    fn lanes_mut(&mut self) -> &mut [T];
}

impl<T: Copy, const N: usize> Block<T> for [T; N] {
    const LEN: usize = N;

    #[inline(always)]
    fn lanes(&self) -> &[T] {
        self
    }

    #[inline(always)]
    fn lanes_mut(&mut self) -> &mut [T] {
        self
    }
}

/// The Rust scalar that holds one element, as the block loop sees it.
pub(super) trait Lane: Copy {
    /// `WIDE_BYTES` of lanes.
    type Wide: Block<Self>;
    /// `NARROW_BYTES` of lanes.
    type Narrow: Block<Self>;

    /// Buffers are little-endian; these are no-ops on little-endian hosts.
    fn from_le(self) -> Self;
    fn to_le(self) -> Self;

    fn sum(a: Self, b: Self) -> Self;
    fn prod(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;
}

/// An operator, as a type, so each block loop is compiled for exactly one.
pub(super) trait Combine {
    fn apply<T: Lane>(a: T, b: T) -> T;
}

/// `Sum`, and `Avg`, which combines as `Sum`.
pub(super) struct Sum;
pub(super) struct Prod;
pub(super) struct Max;
pub(super) struct Min;

macro_rules! combine_with {
    ($($op:ident => $method:ident),*) => {$(
        impl Combine for $op {
            #[inline(always)]
            fn apply<T: Lane>(a: T, b: T) -> T {
                T::$method(a, b)
            }
        }
    )*};
}

combine_with!(Sum => sum, Prod => prod, Max => max, Min => min);

macro_rules! integer_lane {
    ($($int:ty),*) => {$(
        impl Lane for $int {
            type Wide = [$int; WIDE_BYTES / std::mem::size_of::<$int>()];
            type Narrow = [$int; NARROW_BYTES / std::mem::size_of::<$int>()];

            #[inline(always)]
            fn from_le(self) -> Self {
                <$int>::from_le(self)
            }
            #[inline(always)]
            fn to_le(self) -> Self {
                <$int>::to_le(self)
            }
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn prod(a: Self, b: Self) -> Self {
                a.wrapping_mul(b)
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                Ord::max(a, b)
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                Ord::min(a, b)
            }
        }
    )*};
}

integer_lane!(i8, u8, i32, u32, i64, u64);

/// Whether to fix which NaN a float sum or product of two NaNs returns. x86 returns the first
/// operand's, quieted, and so does the reference as compiled, but LLVM may swap the operands
/// of a commutative instruction (to fold a load), so the kernel picks `a`'s itself. Other
/// targets have other rules (aarch64 prefers a signalling NaN in either place), so there the
/// operands stay as written, as in the reference.
const PIN_FIRST_NAN: bool = cfg!(any(target_arch = "x86", target_arch = "x86_64"));

macro_rules! float_lane {
    ($($float:ty => $bits:ty, quiet $quiet:expr);*) => {$(
        impl Lane for $float {
            type Wide = [$float; WIDE_BYTES / std::mem::size_of::<$float>()];
            type Narrow = [$float; NARROW_BYTES / std::mem::size_of::<$float>()];

            #[inline(always)]
            fn from_le(self) -> Self {
                <$float>::from_bits(<$bits>::from_le(self.to_bits()))
            }
            #[inline(always)]
            fn to_le(self) -> Self {
                <$float>::from_bits(<$bits>::to_le(self.to_bits()))
            }
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self {
                let sum = a + b;
                if PIN_FIRST_NAN && a.is_nan() { <$float>::from_bits(a.to_bits() | $quiet) } else { sum }
            }
            #[inline(always)]
            fn prod(a: Self, b: Self) -> Self {
                let prod = a * b;
                if PIN_FIRST_NAN && a.is_nan() { <$float>::from_bits(a.to_bits() | $quiet) } else { prod }
            }
            /// `element.rs`'s `max` as one select: non-short-circuit `&`/`|` keep it branch-free.
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                let keep_a = !a.is_nan() & (b.is_nan() | (a > b) | ((a == b) & b.is_sign_negative()));
                if keep_a { a } else { b }
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                let keep_a = !a.is_nan() & (b.is_nan() | (a < b) | ((a == b) & a.is_sign_negative()));
                if keep_a { a } else { b }
            }
        }
    )*};
}

float_lane!(f32 => u32, quiet 1 << 22; f64 => u64, quiet 1 << 51);

/// Half types widen both operands to `f32`, combine there with `f32`'s lane operators and
/// narrow back, as `element.rs` does.
macro_rules! half_lane {
    ($($half:ty => $widen:ident, $narrow:ident);*) => {$(
        impl Lane for $half {
            type Wide = [$half; WIDE_BYTES / 2];
            type Narrow = [$half; NARROW_BYTES / 2];

            #[inline(always)]
            fn from_le(self) -> Self {
                <$half>::from_bits(u16::from_le(self.to_bits()))
            }
            #[inline(always)]
            fn to_le(self) -> Self {
                <$half>::from_bits(u16::to_le(self.to_bits()))
            }
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self {
                <$half>::from_bits($narrow(<f32 as Lane>::sum($widen(a.to_bits()), $widen(b.to_bits()))))
            }
            #[inline(always)]
            fn prod(a: Self, b: Self) -> Self {
                <$half>::from_bits($narrow(<f32 as Lane>::prod($widen(a.to_bits()), $widen(b.to_bits()))))
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                <$half>::from_bits($narrow(<f32 as Lane>::max($widen(a.to_bits()), $widen(b.to_bits()))))
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                <$half>::from_bits($narrow(<f32 as Lane>::min($widen(a.to_bits()), $widen(b.to_bits()))))
            }
        }
    )*};
}

half_lane!(f16 => f16_to_f32, f32_to_f16; bf16 => bf16_to_f32, f32_to_bf16);
