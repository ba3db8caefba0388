//! One element of each data type as a SIMD lane: how it combines under each operator, written
//! without branches so LLVM turns a block of lanes into vector instructions.
//!
//! The semantics are `element.rs`'s, re-expressed: wrapping integers, NaN-losing float
//! `max`/`min` with `-0 < +0`, and `f16`/`bf16` combined in `f32` (through `half_float.rs`).
//! The host tests compare every type and operator with the reference bit for bit.

use half::{bf16, f16};

use super::half_blocks::{combine_bf16_block, combine_f16_block};
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

    /// Buffers are little-endian: a lane read from one becomes native with `to_native` and
    /// goes back with `to_le`; both are no-ops on little-endian hosts.
    fn to_native(self) -> Self;
    fn to_le(self) -> Self;

    fn sum(a: Self, b: Self) -> Self;
    fn prod(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;

    /// `lanes[i] = lanes[i] (O) other[i]` for one block. `f16` overrides it to convert with
    /// F16C instructions when `F16C` allows and `bf16` to work two lanes to a `u32`;
    /// everything else combines lane by lane.
    ///
    /// # Safety
    /// With `F16C`, the CPU must have F16C.
    #[inline(always)]
    unsafe fn combine_block<O: Combine, const F16C: bool>(lanes: &mut [Self], other: &[Self]) {
        combine_each::<Self, O>(lanes, other);
    }
}

/// `lanes[i] = lanes[i] (O) other[i]`, lane by lane.
#[inline(always)]
pub(super) fn combine_each<T: Lane, O: Combine>(lanes: &mut [T], other: &[T]) {
    for (lane, &other_lane) in lanes.iter_mut().zip(other) {
        *lane = combine_lane::<T, O>(*lane, other_lane);
    }
}

/// One little-endian element of `a (O) b`.
#[inline(always)]
pub(super) fn combine_lane<T: Lane, O: Combine>(a: T, b: T) -> T {
    O::apply(a.to_native(), b.to_native()).to_le()
}

/// An operator, as a type, so each block loop is compiled for exactly one.
pub(super) trait Combine {
    /// Whether the result is computed (`Sum`, `Prod`) rather than one operand chosen
    /// (`Max`, `Min`), which half types can do without widening.
    const COMPUTES: bool;
    fn apply<T: Lane>(a: T, b: T) -> T;
}

/// `Sum`, and `Avg`, which combines as `Sum`.
pub(super) struct Sum;
pub(super) struct Prod;
pub(super) struct Max;
pub(super) struct Min;

macro_rules! combine_with {
    ($($op:ident => $method:ident, computes $computes:expr),*) => {$(
        impl Combine for $op {
            const COMPUTES: bool = $computes;
            #[inline(always)]
            fn apply<T: Lane>(a: T, b: T) -> T {
                T::$method(a, b)
            }
        }
    )*};
}

combine_with!(Sum => sum, computes true, Prod => prod, computes true, Max => max, computes false, Min => min, computes false);

macro_rules! integer_lane {
    ($($int:ty),*) => {$(
        impl Lane for $int {
            type Wide = [$int; WIDE_BYTES / std::mem::size_of::<$int>()];
            type Narrow = [$int; NARROW_BYTES / std::mem::size_of::<$int>()];

            #[inline(always)]
            fn to_native(self) -> Self {
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

/// Whether to fix which NaN a float sum or product of two NaNs returns. LLVM leaves it open:
/// x86 returns the first operand's, quieted, but LLVM may swap the operands of a commutative
/// instruction (to fold a load), so the same source gives `a`'s NaN in one loop and `b`'s in
/// another (the reference gives `a`'s at opt-level 0, sometimes `b`'s when optimised). Pinning
/// `a`'s makes the result the same on every instruction set and build, so ranks agree. Other
/// targets have other hardware rules (aarch64 prefers a signalling NaN in either place), so
/// there the operands stay as written.
const PIN_FIRST_NAN: bool = cfg!(any(target_arch = "x86", target_arch = "x86_64"));

macro_rules! float_lane {
    ($($float:ty => $bits:ty, quiet $quiet:expr);*) => {$(
        impl Lane for $float {
            type Wide = [$float; WIDE_BYTES / std::mem::size_of::<$float>()];
            type Narrow = [$float; NARROW_BYTES / std::mem::size_of::<$float>()];

            #[inline(always)]
            fn to_native(self) -> Self {
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

/// Half types widen both operands to `f32`, add or multiply there with `f32`'s lane operators
/// and narrow back, as `element.rs` does. `max`/`min` return one operand, so they stay in 16
/// bits: comparing order keys (below) and quieting a NaN result gives the bits the `f32`
/// round trip gives, without two conversions per lane.
macro_rules! half_lane {
    ($($half:ty => $widen:ident, $narrow:ident, quiet $quiet:expr $(, blocks by $combine_block:ident)?);*) => {$(
        impl Lane for $half {
            type Wide = [$half; WIDE_BYTES / 2];
            type Narrow = [$half; NARROW_BYTES / 2];

            #[inline(always)]
            fn to_native(self) -> Self {
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
                let keep_a = !a.is_nan() & (b.is_nan() | (order_key(a.to_bits()) > order_key(b.to_bits())));
                quiet_if_nan(if keep_a { a } else { b }, $quiet)
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                let keep_a = !a.is_nan() & (b.is_nan() | (order_key(a.to_bits()) < order_key(b.to_bits())));
                quiet_if_nan(if keep_a { a } else { b }, $quiet)
            }
            $(
                #[inline(always)]
                unsafe fn combine_block<O: Combine, const F16C: bool>(lanes: &mut [Self], other: &[Self]) {
                    // SAFETY: forwarded from the caller.
                    unsafe { $combine_block::<O, F16C>(lanes, other) }
                }
            )?
        }
    )*};
}

/// Sign-magnitude half bits as an integer in the floats' order, `-0` just below `+0`:
/// negative values get their magnitude bits flipped. Meaningless for NaNs.
#[inline(always)]
fn order_key(bits: u16) -> i16 {
    let signed = bits as i16;
    signed ^ ((signed >> 15) & 0x7FFF)
}

/// What widening to `f32` and narrowing back does to a half: a NaN comes back quiet.
#[inline(always)]
fn quiet_if_nan<H: HalfBits>(value: H, quiet: u16) -> H {
    if value.is_nan() {
        H::from_bits(value.to_bits() | quiet)
    } else {
        value
    }
}

/// The bit access `quiet_if_nan` needs from both half types.
trait HalfBits: Copy {
    fn is_nan(self) -> bool;
    fn to_bits(self) -> u16;
    fn from_bits(bits: u16) -> Self;
}

macro_rules! half_bits {
    ($($half:ty),*) => {$(
        impl HalfBits for $half {
            #[inline(always)]
            fn is_nan(self) -> bool {
                <$half>::is_nan(self)
            }
            #[inline(always)]
            fn to_bits(self) -> u16 {
                <$half>::to_bits(self)
            }
            #[inline(always)]
            fn from_bits(bits: u16) -> Self {
                <$half>::from_bits(bits)
            }
        }
    )*};
}

half_bits!(f16, bf16);

half_lane!(
    f16 => f16_to_f32, f32_to_f16, quiet 0x0200, blocks by combine_f16_block;
    bf16 => bf16_to_f32, f32_to_bf16, quiet 0x0040, blocks by combine_bf16_block
);
