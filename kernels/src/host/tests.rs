//! The host kernels against the reference, bit for bit: every data type under every operator,
//! on random and special values (NaNs with payloads, signed zeros, infinities, subnormals,
//! rounding ties, integer extremes), at every length class around the block sizes, at
//! misaligned addresses, in place on either operand, and with every instruction set this CPU
//! has. Also the half-float conversions against `half`, and the checked wrappers.
//!
//! At the dev profile's opt-level 0 nothing is vectorised; `cargo test --release` runs the
//! same cases through the vector code LLVM generates.

use half::{bf16, f16};

use super::half_float::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use super::lane::{Lane, Max, Min, Prod, Sum};
use super::{copy, isa, reduce_into, reduce_slices, VectorIsa};
use crate::element::with_element_type;
use crate::{reference, DataType, KernelError, ReduceOp};

/// Lengths in elements: empty, tails only, one short of / exactly / one past a narrow or
/// wide block for most types, and long runs with a ragged end.
const LENGTHS: &[usize] = &[0, 1, 2, 3, 7, 15, 16, 17, 63, 64, 65, 255, 256, 383, 1000, 4099];

/// Bytes past the end of each buffer that must come back untouched.
const GUARD_BYTES: usize = 64;
const GUARD: u8 = 0xA5;

/// SplitMix64: enough randomness for test inputs, and reproducible from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }
}

/// Bit patterns worth pairing with anything: zeros, infinities, NaNs (quiet, signalling,
/// negative, with payloads), the extremes of each range, subnormals, and values whose sums
/// round on a tie.
fn special_values(dtype: DataType) -> &'static [u64] {
    match dtype {
        DataType::I8 | DataType::U8 => &[0, 1, 0xFF, 0x7F, 0x80, 0x02, 0xFE],
        DataType::I32 | DataType::U32 => &[0, 1, 0xFFFF_FFFF, 0x7FFF_FFFF, 0x8000_0000, 0x0001_0000, 0xFFFF_FFFE],
        DataType::I64 | DataType::U64 => {
            &[0, 1, u64::MAX, i64::MAX as u64, 1 << 63, 1 << 32, 0xFFFF_FFFF, u64::MAX - 1]
        }
        DataType::F16 => &[
            0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0x7D55, 0xFF3F, 0x7BFF, 0xFBFF, 0x0001, 0x8001,
            0x03FF, 0x0400, 0x3C00, 0xBC00, 0x3C01, 0x6800, 0x1400,
        ],
        DataType::Bf16 => &[
            0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0x7FA5, 0xFFF1, 0x7F7F, 0xFF7F, 0x0001, 0x8001,
            0x007F, 0x0080, 0x3F80, 0xBF80, 0x3F81, 0x4B00, 0x3B80,
        ],
        DataType::F32 => &[
            0x0000_0000,
            0x8000_0000,
            0x7F80_0000,
            0xFF80_0000,
            0x7FC0_0000,
            0xFFC0_0000,
            0x7F80_0001,
            0x7FA5_5555,
            0xFFC1_2345,
            0x7F7F_FFFF,
            0xFF7F_FFFF,
            0x0000_0001,
            0x8000_0001,
            0x007F_FFFF,
            0x0080_0000,
            0x3F80_0000,
            0xBF80_0000,
            0x3F80_0001,
            0x4B00_0000,
            0x3380_0000,
        ],
        DataType::F64 => &[
            0x0000_0000_0000_0000,
            0x8000_0000_0000_0000,
            0x7FF0_0000_0000_0000,
            0xFFF0_0000_0000_0000,
            0x7FF8_0000_0000_0000,
            0xFFF8_0000_0000_0000,
            0x7FF0_0000_0000_0001,
            0x7FF5_5555_5555_5555,
            0xFFF8_1234_5678_9ABC,
            0x7FEF_FFFF_FFFF_FFFF,
            0xFFEF_FFFF_FFFF_FFFF,
            0x0000_0000_0000_0001,
            0x8000_0000_0000_0001,
            0x0010_0000_0000_0000,
            0x3FF0_0000_0000_0000,
            0xBFF0_0000_0000_0000,
            0x3FF0_0000_0000_0001,
            0x4340_0000_0000_0000,
            0x3CA0_0000_0000_0000,
        ],
    }
}

/// One random element's bits: a quarter special values, a quarter arbitrary bits, and half
/// small magnitudes (exponents near 1 for floats, -4..=4 for integers) so that sums and
/// products round, cancel and tie often.
fn random_element(dtype: DataType, rng: &mut Rng) -> u64 {
    let bits = rng.next();
    match rng.below(4) {
        0 => {
            let specials = special_values(dtype);
            specials[rng.below(specials.len())]
        }
        1 => bits,
        _ => {
            let sign = bits >> 63;
            let (mantissa_bits, exponent_one) = match dtype {
                DataType::F16 => (10, 15),
                DataType::Bf16 => (7, 127),
                DataType::F32 => (23, 127),
                DataType::F64 => (52, 1023),
                _ => return (bits % 9).wrapping_sub(4),
            };
            let exponent = exponent_one - 3 + (bits >> 32) % 7;
            let width = 8 * dtype.size_bytes() as u32;
            (sign << (width - 1)) | (exponent << mantissa_bits) | (bits & ((1 << mantissa_bits) - 1))
        }
    }
}

fn random_buffer(dtype: DataType, n_elems: usize, rng: &mut Rng) -> Vec<u8> {
    let size = dtype.size_bytes();
    let mut bytes = Vec::with_capacity(n_elems * size);
    for _ in 0..n_elems {
        bytes.extend_from_slice(&random_element(dtype, rng).to_le_bytes()[..size]);
    }
    bytes
}

/// Where the destination is.
#[derive(Clone, Copy, Debug)]
enum Placement {
    Separate,
    InPlaceOnA,
    InPlaceOnB,
    AllThreeShared,
}

const PLACEMENTS: &[Placement] =
    &[Placement::Separate, Placement::InPlaceOnA, Placement::InPlaceOnB, Placement::AllThreeShared];

/// `bytes` copied to `offset` bytes into a fresh buffer, followed by guard bytes; returns the
/// buffer (whose start is 8-aligned by `Vec<u64>`'s allocation, so `offset` sets the alignment).
fn placed(bytes: &[u8], offset: usize) -> Vec<u64> {
    let words = (offset + bytes.len() + GUARD_BYTES).div_ceil(8);
    let mut storage = vec![u64::from_ne_bytes([GUARD; 8]); words];
    as_bytes_mut(&mut storage)[offset..offset + bytes.len()].copy_from_slice(bytes);
    storage
}

fn as_bytes_mut(storage: &mut [u64]) -> &mut [u8] {
    // SAFETY: any bytes are valid `u8`s, and the slice covers exactly the words' memory.
    unsafe { std::slice::from_raw_parts_mut(storage.as_mut_ptr().cast::<u8>(), storage.len() * 8) }
}

/// Runs one case through the host kernel compiled for `isa` and returns the destination
/// bytes, after checking that the bytes around it are untouched.
fn host_result(
    isa: VectorIsa,
    dtype: DataType,
    op: ReduceOp,
    placement: Placement,
    offset: usize,
    a: &[u8],
    b: &[u8],
) -> Vec<u8> {
    let len = a.len();
    let n_elems = len / dtype.size_bytes();
    let mut buffers = [placed(a, offset), placed(b, offset), placed(&vec![GUARD; len], offset)];
    let [a_ptr, b_ptr, separate_dst] = buffers.each_mut().map(|buffer| as_bytes_mut(buffer)[offset..].as_mut_ptr());
    let (dst_buffer, dst, a_ptr, b_ptr) = match placement {
        Placement::Separate => (2, separate_dst, a_ptr, b_ptr),
        Placement::InPlaceOnA => (0, a_ptr, a_ptr, b_ptr),
        Placement::InPlaceOnB => (1, b_ptr, a_ptr, b_ptr),
        Placement::AllThreeShared => (0, a_ptr, a_ptr, a_ptr),
    };
    // SAFETY: each pointer has `len` bytes behind it in live storage, `dst` is separate or
    // exactly an operand, and `isa` comes from `isas_to_test`.
    unsafe { reduce_for_isa(isa, dtype, op, dst, a_ptr, b_ptr, n_elems) };
    let dst_bytes = as_bytes_mut(&mut buffers[dst_buffer]);
    let (before, rest) = dst_bytes.split_at(offset);
    let (result, after) = rest.split_at(len);
    let untouched = |bytes: &[u8]| bytes.iter().all(|&byte| byte == GUARD);
    assert!(untouched(before) && untouched(after), "{isa} {dtype} {op} n={n_elems}: wrote outside dst");
    result.to_vec()
}

/// [`reduce`], but through the loop compiled for `isa` whatever the length.
///
/// # Safety
/// As [`reduce`], and `isa` must not be wider than [`VectorIsa::detected`].
unsafe fn reduce_for_isa(
    isa: VectorIsa,
    dtype: DataType,
    op: ReduceOp,
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    n_elems: usize,
) {
    assert!(isa <= VectorIsa::detected(), "{isa} is not available on this CPU");
    with_element_type!(dtype, Scalar => unsafe { reduce_for_isa_as::<Scalar>(isa, op, dst, a, b, n_elems) })
}

unsafe fn reduce_for_isa_as<T: Lane>(
    isa: VectorIsa,
    op: ReduceOp,
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    n_elems: usize,
) {
    let (dst, a, b) = (dst.cast::<T>(), a.cast::<T>(), b.cast::<T>());
    // SAFETY: forwarded from the caller.
    unsafe {
        match op {
            ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PreMulSum(_) => {
                isa::combine_with::<T, Sum>(isa, dst, a, b, n_elems)
            }
            ReduceOp::Prod => isa::combine_with::<T, Prod>(isa, dst, a, b, n_elems),
            ReduceOp::Max => isa::combine_with::<T, Max>(isa, dst, a, b, n_elems),
            ReduceOp::Min => isa::combine_with::<T, Min>(isa, dst, a, b, n_elems),
            ReduceOp::User(_) => unreachable!("the built-in operators' loops"),
        }
    }
}

/// Every instruction set this CPU runs; on an AVX-512 machine that is all three.
fn isas_to_test() -> Vec<VectorIsa> {
    VectorIsa::ALL.iter().copied().filter(|&isa| isa <= VectorIsa::detected()).collect()
}

fn reference_result(dtype: DataType, op: ReduceOp, a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut expected = a.to_vec();
    reference::reduce(dtype, op, &mut expected, b).unwrap();
    expected
}

/// An element's bits, read little-endian.
fn element_bits(bytes: &[u8]) -> u64 {
    let mut raw = [0u8; 8];
    raw[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(raw)
}

/// A float type's exponent and mantissa masks.
fn float_fields(dtype: DataType) -> Option<(u64, u64)> {
    match dtype {
        DataType::F16 => Some((0x7C00, 0x03FF)),
        DataType::Bf16 => Some((0x7F80, 0x007F)),
        DataType::F32 => Some((0x7F80_0000, 0x007F_FFFF)),
        DataType::F64 => Some((0x7FF0_0000_0000_0000, 0x000F_FFFF_FFFF_FFFF)),
        _ => None,
    }
}

fn is_nan(dtype: DataType, bits: u64) -> bool {
    float_fields(dtype).is_some_and(|(exponent, mantissa)| bits & exponent == exponent && bits & mantissa != 0)
}

/// Whether the host's element is right, given the operands and the reference's element.
///
/// A float sum or product of two NaNs is the one place not to ask the reference: LLVM leaves
/// open which NaN `a + b` returns, and the reference returns `a`'s at opt-level 0 but `b`'s in
/// some optimised loops. The host promises `a`'s, quieted, on x86, and any NaN elsewhere.
fn host_element_is_right(dtype: DataType, op: ReduceOp, a: u64, b: u64, host: u64, reference: u64) -> bool {
    let sum_like = matches!(op, ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Avg);
    match float_fields(dtype) {
        Some((_, mantissa)) if sum_like && is_nan(dtype, a) && is_nan(dtype, b) => {
            if cfg!(any(target_arch = "x86", target_arch = "x86_64")) {
                host == a | (mantissa + 1) >> 1
            } else {
                is_nan(dtype, host)
            }
        }
        _ => host == reference,
    }
}

fn assert_host_is_right(
    dtype: DataType,
    op: ReduceOp,
    operands: [&[u8]; 2],
    host: &[u8],
    reference: &[u8],
    case: &str,
) {
    let size = dtype.size_bytes();
    let elements = |bytes: &[u8]| bytes.chunks_exact(size).map(element_bits).collect::<Vec<_>>();
    let (a, b, host, reference) = (elements(operands[0]), elements(operands[1]), elements(host), elements(reference));
    for index in 0..a.len() {
        let (a, b, host, reference) = (a[index], b[index], host[index], reference[index]);
        assert!(
            host_element_is_right(dtype, op, a, b, host, reference),
            "{case}: element {index}: a={a:#x} b={b:#x} host={host:#x} reference={reference:#x}"
        );
    }
}

/// Every operator x length x offset x placement x instruction set for one data type.
fn check_matches_reference(dtype: DataType) {
    let mut rng = Rng(0xC011C ^ u64::from(dtype.nccl_code()));
    let isas = isas_to_test();
    for &op in ReduceOp::ALL {
        for &n_elems in LENGTHS {
            let a = random_buffer(dtype, n_elems, &mut rng);
            let b = random_buffer(dtype, n_elems, &mut rng);
            let expected = reference_result(dtype, op, &a, &b);
            let expected_shared = reference_result(dtype, op, &a, &a);
            for offset in 0..=3 {
                for &placement in PLACEMENTS {
                    let (operands, expected) = match placement {
                        Placement::AllThreeShared => ([&a[..], &a[..]], &expected_shared),
                        _ => ([&a[..], &b[..]], &expected),
                    };
                    for &isa in &isas {
                        let host = host_result(isa, dtype, op, placement, offset, &a, &b);
                        let case = format!("{isa} {dtype} {op} n={n_elems} offset={offset} {placement:?}");
                        assert_host_is_right(dtype, op, operands, &host, expected, &case);
                    }
                }
            }
            // The public entry point, which runs short pieces inline and dispatches long ones.
            let mut dst = vec![0u8; a.len()];
            reduce_into(dtype, op, &mut dst, &a, &b).unwrap();
            let case = format!("reduce_into {dtype} {op} n={n_elems}");
            assert_host_is_right(dtype, op, [&a, &b], &dst, &expected, &case);
        }
    }
}

macro_rules! matches_reference {
    ($($test:ident => $dtype:ident),* $(,)?) => {$(
        #[test]
        fn $test() {
            check_matches_reference(DataType::$dtype);
        }
    )*};
}

matches_reference!(
    i8_matches_reference => I8,
    u8_matches_reference => U8,
    i32_matches_reference => I32,
    u32_matches_reference => U32,
    i64_matches_reference => I64,
    u64_matches_reference => U64,
    f16_matches_reference => F16,
    f32_matches_reference => F32,
    f64_matches_reference => F64,
    bf16_matches_reference => Bf16,
);

/// The one rule the host kernels add to the reference's arithmetic, checked by value rather
/// than against the reference: of two NaNs, a float sum or product keeps the first, quieted.
#[test]
#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
fn sum_of_two_nans_keeps_the_first() {
    let (first, second) = (f32::from_bits(0x7F80_0001), f32::from_bits(0xFFC1_2345));
    let mut dst = vec![0u8; 4 * 40];
    let a: Vec<u8> = std::iter::repeat_n(first.to_le_bytes(), 40).flatten().collect();
    let b: Vec<u8> = std::iter::repeat_n(second.to_le_bytes(), 40).flatten().collect();
    for op in [ReduceOp::Sum, ReduceOp::Prod] {
        reduce_into(DataType::F32, op, &mut dst, &a, &b).unwrap();
        for element in dst.chunks_exact(4) {
            assert_eq!(element, 0x7FC0_0001u32.to_le_bytes(), "{op}");
        }
    }
}

#[test]
fn f16_widening_matches_half_for_every_value() {
    for bits in 0..=u16::MAX {
        let expected = f16::from_bits(bits).to_f32().to_bits();
        assert_eq!(f16_to_f32(bits).to_bits(), expected, "f16 {bits:#06x}");
    }
}

#[test]
fn bf16_widening_matches_half_for_every_value() {
    for bits in 0..=u16::MAX {
        let expected = bf16::from_bits(bits).to_f32().to_bits();
        assert_eq!(bf16_to_f32(bits).to_bits(), expected, "bf16 {bits:#06x}");
    }
}

/// Every `f32` sign, exponent and top mantissa bits that narrowing keeps, with the dropped
/// bits set to each pattern that decides a rounding: zero, just below half, half (a tie),
/// just above half, all ones and a random one.
#[test]
fn narrowing_matches_half_around_every_rounding_boundary() {
    let mut rng = Rng(7);
    for high in 0..=u32::from(u16::MAX) {
        let random = rng.next() as u32;
        for dropped in [0, 0x7FFF, 0x8000, 0x8001, 0xFFFF, random & 0xFFFF] {
            let value = f32::from_bits((high << 16) | dropped);
            assert_eq!(f32_to_bf16(value), bf16::from_f32(value).to_bits(), "bf16 from {:#010x}", value.to_bits());
        }
    }
    for high in 0..(1u32 << 19) {
        let random = rng.next() as u32;
        for dropped in [0, 0x0FFF, 0x1000, 0x1001, 0x1FFF, random & 0x1FFF] {
            let value = f32::from_bits((high << 13) | dropped);
            assert_eq!(f32_to_f16(value), f16::from_f32(value).to_bits(), "f16 from {:#010x}", value.to_bits());
        }
    }
}

#[test]
fn copy_copies_exactly_len_bytes_at_any_alignment() {
    let mut rng = Rng(11);
    for &len in LENGTHS {
        let src = random_buffer(DataType::U8, len, &mut rng);
        for offset in 0..=3 {
            let mut dst = placed(&vec![GUARD; len], offset);
            // SAFETY: `dst` has `offset + len` bytes and more; `src` has `len`; they are distinct.
            unsafe { copy(as_bytes_mut(&mut dst)[offset..].as_mut_ptr(), src.as_ptr(), len) };
            let dst = as_bytes_mut(&mut dst);
            assert_eq!(&dst[offset..offset + len], &src[..], "len={len} offset={offset}");
            assert!(dst[..offset].iter().chain(&dst[offset + len..]).all(|&byte| byte == GUARD));
        }
    }
}

#[test]
fn reduce_slices_accumulates_in_place() {
    let mut dst = [1u8, 0, 0, 0, 2, 0, 0, 0];
    reduce_slices(DataType::I32, ReduceOp::Sum, &mut dst, &[5, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF]).unwrap();
    assert_eq!(dst, [6, 0, 0, 0, 1, 0, 0, 0]);
}

#[test]
fn checked_wrappers_refuse_mismatched_buffers_and_leave_dst_unchanged() {
    let mut dst = [7u8; 8];
    let error = reduce_slices(DataType::F32, ReduceOp::Sum, &mut dst, &[0; 4]).unwrap_err();
    assert_eq!(error, KernelError::LengthMismatch { dst_bytes: 8, src_bytes: 4 });
    let error = reduce_into(DataType::F32, ReduceOp::Sum, &mut dst, &[0; 8], &[0; 12]).unwrap_err();
    assert_eq!(error, KernelError::LengthMismatch { dst_bytes: 8, src_bytes: 12 });
    let error = reduce_into(DataType::F64, ReduceOp::Max, &mut dst[..6], &[0; 6], &[0; 6]).unwrap_err();
    assert_eq!(error, KernelError::PartialElement { dtype: DataType::F64, bytes: 6 });
    let error = reduce_slices(DataType::Bf16, ReduceOp::Min, &mut dst[..3], &[0; 3]).unwrap_err();
    assert_eq!(error, KernelError::PartialElement { dtype: DataType::Bf16, bytes: 3 });
    assert_eq!(dst, [7; 8]);
}

#[test]
fn detection_is_stable_and_matches_the_cpu() {
    let isa = VectorIsa::detected();
    assert_eq!(VectorIsa::detected(), isa);
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    assert_eq!(isa >= VectorIsa::Avx2, is_x86_feature_detected!("avx2"));
    #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
    assert_eq!(isa, VectorIsa::Baseline);
    assert_eq!(VectorIsa::Avx512.to_string(), "avx512");
}

/// Streaming copies equal plain ones at every length around the threshold and every alignment, and touch nothing
/// outside the destination.
#[test]
fn streaming_copy_copies_exactly_the_range() {
    let src: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + 3) as u8).collect();
    for len in [0, 1, 63, 4095, 4096, 4097, 5000, 12_345] {
        for offset in 0..4 {
            let mut dst = vec![0xA5u8; len + 64];
            // SAFETY: both ranges hold `len` bytes from their offsets and do not overlap.
            unsafe { super::copy_streaming(dst.as_mut_ptr().add(offset), src.as_ptr().add(3), len) };
            assert_eq!(&dst[offset..offset + len], &src[3..3 + len], "len {len} offset {offset}");
            assert!(dst[..offset].iter().chain(&dst[offset + len..]).all(|&b| b == 0xA5), "len {len} offset {offset}");
        }
    }
}

/// A range copied onto itself (a `Copy` whose source is its destination, or in place where `in` is `out`) is left
/// as it is, by both copies and on every path (short, vector, streaming), with no overlapping `memcpy` underneath.
#[test]
fn a_range_copied_onto_itself_is_unchanged() {
    let original: Vec<u8> = (0..20_000u32).map(|i| (i * 13 + 5) as u8).collect();
    for len in [0, 1, 255, 256, 4096, 12_345] {
        let mut buf = original.clone();
        let at = buf.as_mut_ptr();
        // SAFETY: the ranges are the same `len` bytes of `buf`.
        unsafe { copy(at, at, len) };
        // SAFETY: as above.
        unsafe { super::copy_streaming(at.wrapping_add(7), at.wrapping_add(7), len) };
        assert_eq!(buf, original, "len {len}");
    }
}

/// PreMulSum's kernels against the reference's `premultiply` then `reduce`: every type, a random and a special factor,
/// the factor on either operand or both, lengths across the block size, in place on the first operand.
#[test]
fn premul_sum_matches_the_reference() {
    use super::{premul_sum, Factor};
    let mut rng = Rng(0x9E1_5C41E);
    for &dtype in DataType::ALL {
        let size = dtype.size_bytes();
        for n_elems in [0, 1, 17, 255, 1023, 1024, 1025, 2049, 4099] {
            let a = random_buffer(dtype, n_elems, &mut rng);
            let b = random_buffer(dtype, n_elems, &mut rng);
            let specials = special_values(dtype);
            for factor_bits in [random_element(dtype, &mut rng), specials[rng.below(specials.len())]] {
                let mut element = [0u8; 8];
                element[..size].copy_from_slice(&factor_bits.to_le_bytes()[..size]);
                let factor = Factor::new(dtype, element);
                let scaled = |bytes: &[u8], on: bool| {
                    let mut bytes = bytes.to_vec();
                    if on {
                        reference::premultiply(dtype, &element, &mut bytes).unwrap();
                    }
                    bytes
                };
                for (on_a, on_b) in [(true, false), (false, true), (true, true)] {
                    let (a_read, b_read) = (scaled(&a, on_a), scaled(&b, on_b));
                    let expected = reference_result(dtype, ReduceOp::Sum, &a_read, &b_read);
                    let (fa, fb) = (on_a.then_some(&factor), on_b.then_some(&factor));
                    let mut dst = vec![0u8; a.len()];
                    // SAFETY: three buffers of `n_elems` elements; `dst` overlaps neither operand.
                    unsafe { premul_sum(dtype, dst.as_mut_ptr(), (a.as_ptr(), fa), (b.as_ptr(), fb), n_elems) };
                    let case = format!("{dtype} n={n_elems} factor={factor_bits:#x} on a {on_a} on b {on_b}");
                    assert_host_is_right(dtype, ReduceOp::Sum, [&a_read, &b_read], &dst, &expected, &case);
                    let mut in_place = a.clone();
                    let acc = in_place.as_mut_ptr();
                    // SAFETY: `acc` is exactly the first operand, which the kernel allows.
                    unsafe { premul_sum(dtype, acc, (acc, fa), (b.as_ptr(), fb), n_elems) };
                    assert_host_is_right(dtype, ReduceOp::Sum, [&a_read, &b_read], &in_place, &expected, &case);
                }
                let mut copied = vec![0u8; a.len()];
                // SAFETY: two buffers of `n_elems` elements that do not overlap.
                unsafe { factor.apply(copied.as_mut_ptr(), a.as_ptr(), n_elems) };
                let expected = scaled(&a, true);
                let same = copied.chunks_exact(size).zip(expected.chunks_exact(size)).all(|(h, r)| {
                    let (h, r) = (element_bits(h), element_bits(r));
                    h == r || (is_nan(dtype, h) && is_nan(dtype, r))
                });
                assert!(same, "{dtype} n={n_elems} factor={factor_bits:#x}: apply differs from premultiply");
            }
        }
    }
}
