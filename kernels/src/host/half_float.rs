//! `f16` and `bf16` to `f32` and back without branches, so the block loop vectorises.
//!
//! Each function returns the same bits as `half`'s `to_f32`/`from_f32` (which use F16C or
//! their software fallback) for every input: NaNs come out quiet with their payload kept,
//! narrowing rounds to nearest-even, overflows to infinity and keeps subnormals. `half`'s own
//! conversions test a CPU feature on every call, which keeps LLVM from vectorising a loop
//! around them.

/// Bits of `f32` that make a NaN quiet.
const F32_QUIET: u32 = 0x0040_0000;

/// Widens `f16` bits to `f32`.
#[inline(always)]
pub(super) fn f16_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits & 0x8000) << 16;
    let magnitude = u32::from(bits & 0x7FFF);
    // Rebiasing the exponent from 15 to 127 is one add on the shifted bits.
    let normal = (magnitude << 13) + ((127 - 15) << 23);
    // A subnormal is m * 2^-24: build 0.5 + m * 2^-24 from bits and subtract 0.5, exactly.
    let subnormal = (f32::from_bits((126 << 23) | magnitude) - 0.5).to_bits();
    let quiet = if magnitude > 0x7C00 { F32_QUIET } else { 0 };
    let infinite_or_nan = 0x7F80_0000 | (magnitude << 13) | quiet;
    let widened = if magnitude >= 0x7C00 {
        infinite_or_nan
    } else if magnitude < 0x0400 {
        subnormal
    } else {
        normal
    };
    f32::from_bits(sign | widened)
}

/// Narrows `f32` to `f16` bits, rounding to nearest-even.
///
/// The rounding is done by the FPU (Marat Dukhan's method, as in PyTorch's `c10::Half`):
/// scaling by 2^112 then 2^-110 turns values past the `f16` range into infinity, and adding a
/// power of two chosen from the exponent makes the FPU's own rounding drop exactly the bits
/// `f16` cannot hold, subnormals included.
#[inline(always)]
pub(super) fn f32_to_f16(value: f32) -> u16 {
    let bits = value.to_bits();
    let sign = (bits >> 16) & 0x8000;
    let magnitude = bits & 0x7FFF_FFFF;
    let scaled = (value.abs() * f32::from_bits(0x7780_0000)) * f32::from_bits(0x0880_0000);
    let bias = ((magnitude << 1) & 0xFF00_0000).max(0x7100_0000);
    let rounded = (f32::from_bits((bias >> 1) + 0x0780_0000) + scaled).to_bits();
    let finite_or_infinite = ((rounded >> 13) & 0x7C00) + (rounded & 0x0FFF);
    let nan = 0x7E00 | ((magnitude & 0x007F_FFFF) >> 13);
    let narrowed = if magnitude > 0x7F80_0000 { nan } else { finite_or_infinite };
    (sign | narrowed) as u16
}

/// Widens `bf16` bits to `f32`: the top half of the `f32`, with NaNs made quiet.
#[inline(always)]
pub(super) fn bf16_to_f32(bits: u16) -> f32 {
    let quiet = if bits & 0x7FFF > 0x7F80 { 0x0040 } else { 0 };
    f32::from_bits(u32::from(bits | quiet) << 16)
}

/// Narrows `f32` to `bf16` bits, rounding to nearest-even; NaNs keep their top bits, quiet.
#[inline(always)]
pub(super) fn f32_to_bf16(value: f32) -> u16 {
    let bits = value.to_bits();
    let lowest_kept = (bits >> 16) & 1;
    let rounded = bits.wrapping_add(0x7FFF + lowest_kept) >> 16;
    let nan = (bits >> 16) | 0x0040;
    let narrowed = if value.is_nan() { nan } else { rounded };
    narrowed as u16
}
