//! One element of each data type as a Rust scalar: how it is read from and written to
//! little-endian bytes, and how two elements combine under each operator.
//!
//! The arithmetic follows what NCCL's device code computes, so the reference agrees with a
//! real GPU run bit for bit wherever NCCL is deterministic:
//! - integer `sum` and `prod` wrap, as unsigned arithmetic on the GPU does;
//! - `f16` and `bf16` combine in `f32` and round back to nearest-even, which gives the same
//!   bits as native half arithmetic because `f32` holds more than twice their precision;
//! - float `max`/`min` are CUDA's `fmax`/`fmin`: a NaN loses to a number. CUDA leaves the sign
//!   of `max(-0, +0)` open, so the reference picks `-0 < +0` to stay deterministic.

use half::{bf16, f16};

/// A Rust scalar that holds one element of some [`crate::DataType`].
pub(crate) trait Element: Copy {
    /// Bytes per element; equal to the matching `DataType::size_bytes()`.
    const SIZE: usize;

    /// Reads one element from exactly `SIZE` little-endian bytes at any alignment.
    fn load(bytes: &[u8]) -> Self;
    /// Writes one element into exactly `SIZE` bytes, little-endian.
    fn store(self, bytes: &mut [u8]);

    fn sum(a: Self, b: Self) -> Self;
    fn prod(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;

    /// The `Avg` epilogue: `value / n_ranks`, truncating toward zero for integers.
    fn divide(value: Self, n_ranks: usize) -> Self;
}

/// Implements `load`/`store` for a type with `from_le_bytes`/`to_le_bytes`.
macro_rules! le_bytes_access {
    ($scalar:ty) => {
        const SIZE: usize = std::mem::size_of::<$scalar>();

        fn load(bytes: &[u8]) -> Self {
            let mut raw = [0u8; std::mem::size_of::<$scalar>()];
            raw.copy_from_slice(bytes);
            <$scalar>::from_le_bytes(raw)
        }

        fn store(self, bytes: &mut [u8]) {
            bytes.copy_from_slice(&self.to_le_bytes());
        }
    };
}

/// Integers divide in a 128-bit type because `n_ranks` may not fit the element type
/// (`-128i8 / 128` is `-1`, not an overflow); the quotient never exceeds the dividend.
macro_rules! integer_element {
    ($($int:ty => $wide:ty),* $(,)?) => {$(
        impl Element for $int {
            le_bytes_access!($int);

            fn sum(a: Self, b: Self) -> Self {
                a.wrapping_add(b)
            }
            fn prod(a: Self, b: Self) -> Self {
                a.wrapping_mul(b)
            }
            fn max(a: Self, b: Self) -> Self {
                Ord::max(a, b)
            }
            fn min(a: Self, b: Self) -> Self {
                Ord::min(a, b)
            }
            fn divide(value: Self, n_ranks: usize) -> Self {
                (<$wide>::from(value) / n_ranks as $wide) as $int
            }
        }
    )*};
}

integer_element!(i8 => i128, u8 => u128, i32 => i128, u32 => u128, i64 => i128, u64 => u128);

macro_rules! float_element {
    ($($float:ty),* $(,)?) => {$(
        impl Element for $float {
            le_bytes_access!($float);

            fn sum(a: Self, b: Self) -> Self {
                a + b
            }
            fn prod(a: Self, b: Self) -> Self {
                a * b
            }
            fn max(a: Self, b: Self) -> Self {
                if a.is_nan() {
                    b
                } else if b.is_nan() || a > b || (a == b && b.is_sign_negative()) {
                    a
                } else {
                    b
                }
            }
            fn min(a: Self, b: Self) -> Self {
                if a.is_nan() {
                    b
                } else if b.is_nan() || a < b || (a == b && a.is_sign_negative()) {
                    a
                } else {
                    b
                }
            }
            fn divide(value: Self, n_ranks: usize) -> Self {
                value / n_ranks as $float
            }
        }
    )*};
}

float_element!(f32, f64);

/// Half types widen to `f32`, combine there and round back to nearest-even; for `max`/`min`
/// the round trip is exact because the result is one of the inputs.
macro_rules! half_element {
    ($($half:ty),* $(,)?) => {$(
        impl Element for $half {
            le_bytes_access!($half);

            fn sum(a: Self, b: Self) -> Self {
                <$half>::from_f32(a.to_f32() + b.to_f32())
            }
            fn prod(a: Self, b: Self) -> Self {
                <$half>::from_f32(a.to_f32() * b.to_f32())
            }
            fn max(a: Self, b: Self) -> Self {
                <$half>::from_f32(<f32 as Element>::max(a.to_f32(), b.to_f32()))
            }
            fn min(a: Self, b: Self) -> Self {
                <$half>::from_f32(<f32 as Element>::min(a.to_f32(), b.to_f32()))
            }
            fn divide(value: Self, n_ranks: usize) -> Self {
                <$half>::from_f32(value.to_f32() / n_ranks as f32)
            }
        }
    )*};
}

half_element!(f16, bf16);

/// Evaluates `$body` with the type alias `$scalar` bound to the Rust scalar that holds one
/// `$dtype` element, so callers match on the data type once per buffer, not per element.
macro_rules! with_element_type {
    ($dtype:expr, $scalar:ident => $body:expr) => {
        match $dtype {
            $crate::DataType::I8 => {
                type $scalar = i8;
                $body
            }
            $crate::DataType::U8 => {
                type $scalar = u8;
                $body
            }
            $crate::DataType::I32 => {
                type $scalar = i32;
                $body
            }
            $crate::DataType::U32 => {
                type $scalar = u32;
                $body
            }
            $crate::DataType::I64 => {
                type $scalar = i64;
                $body
            }
            $crate::DataType::U64 => {
                type $scalar = u64;
                $body
            }
            $crate::DataType::F16 => {
                type $scalar = ::half::f16;
                $body
            }
            $crate::DataType::F32 => {
                type $scalar = f32;
                $body
            }
            $crate::DataType::F64 => {
                type $scalar = f64;
                $body
            }
            $crate::DataType::Bf16 => {
                type $scalar = ::half::bf16;
                $body
            }
        }
    };
}

pub(crate) use with_element_type;
