//! Hand-checked results for the reference kernels: every data type under every operator,
//! wrapping, half-precision rounding, NaN and signed zero, the `Avg` epilogue and bad buffers.

use half::{bf16, f16};

use super::{copy, finish_avg, reduce};
use crate::element::{with_element_type, Element};
use crate::{DataType, KernelError, ReduceOp};

/// Test values are written as `f64` so one table serves every data type; every value used
/// here is exact in all of them.
trait TestScalar: Element {
    fn from_f64(value: f64) -> Self;
    fn to_f64(self) -> f64;
}

macro_rules! cast_test_scalar {
    ($($scalar:ty),*) => {$(
        impl TestScalar for $scalar {
            fn from_f64(value: f64) -> Self {
                value as $scalar
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    )*};
}

cast_test_scalar!(i8, u8, i32, u32, i64, u64, f32, f64);

macro_rules! half_test_scalar {
    ($($half:ty),*) => {$(
        impl TestScalar for $half {
            fn from_f64(value: f64) -> Self {
                <$half>::from_f64(value)
            }
            fn to_f64(self) -> f64 {
                <$half>::to_f64(self)
            }
        }
    )*};
}

half_test_scalar!(f16, bf16);

fn encode(dtype: DataType, values: &[f64]) -> Vec<u8> {
    with_element_type!(dtype, Scalar => encode_as::<Scalar>(values))
}

fn encode_as<T: TestScalar>(values: &[f64]) -> Vec<u8> {
    let mut bytes = vec![0u8; values.len() * T::SIZE];
    for (element, &value) in bytes.chunks_exact_mut(T::SIZE).zip(values) {
        T::from_f64(value).store(element);
    }
    bytes
}

fn decode(dtype: DataType, bytes: &[u8]) -> Vec<f64> {
    with_element_type!(dtype, Scalar => bytes
        .chunks_exact(Scalar::SIZE)
        .map(|element| Scalar::load(element).to_f64())
        .collect())
}

/// Runs `dst (op) src` and returns the result as `f64`s.
fn reduced(dtype: DataType, op: ReduceOp, dst: &[f64], src: &[f64]) -> Vec<f64> {
    let mut dst_bytes = encode(dtype, dst);
    reduce(dtype, op, &mut dst_bytes, &encode(dtype, src)).unwrap();
    decode(dtype, &dst_bytes)
}

#[test]
fn every_type_and_op_on_small_unsigned_values() {
    let (dst, src) = ([6.0, 2.0, 5.0, 0.0], [3.0, 4.0, 5.0, 7.0]);
    let expected = [
        (ReduceOp::Sum, [9.0, 6.0, 10.0, 7.0]),
        (ReduceOp::Prod, [18.0, 8.0, 25.0, 0.0]),
        (ReduceOp::Max, [6.0, 4.0, 5.0, 7.0]),
        (ReduceOp::Min, [3.0, 2.0, 5.0, 0.0]),
        (ReduceOp::Avg, [9.0, 6.0, 10.0, 7.0]),
    ];
    for &dtype in DataType::ALL {
        for (op, result) in expected {
            assert_eq!(reduced(dtype, op, &dst, &src), result, "{dtype} {op}");
        }
    }
}

#[test]
fn every_signed_type_and_op_on_negative_values() {
    let signed =
        [DataType::I8, DataType::I32, DataType::I64, DataType::F16, DataType::F32, DataType::F64, DataType::Bf16];
    let (dst, src) = ([-3.0, 7.0, -1.0], [2.0, -8.0, -1.0]);
    let expected = [
        (ReduceOp::Sum, [-1.0, -1.0, -2.0]),
        (ReduceOp::Prod, [-6.0, -56.0, 1.0]),
        (ReduceOp::Max, [2.0, 7.0, -1.0]),
        (ReduceOp::Min, [-3.0, -8.0, -1.0]),
        (ReduceOp::Avg, [-1.0, -1.0, -2.0]),
    ];
    for dtype in signed {
        for (op, result) in expected {
            assert_eq!(reduced(dtype, op, &dst, &src), result, "{dtype} {op}");
        }
    }
}

#[test]
fn elements_are_little_endian_ieee_bits() {
    assert_eq!(encode(DataType::I32, &[1.0]), [1, 0, 0, 0]);
    assert_eq!(encode(DataType::I32, &[-2.0]), [0xfe, 0xff, 0xff, 0xff]);
    assert_eq!(encode(DataType::F32, &[1.0]), [0, 0, 0x80, 0x3f]);
    assert_eq!(encode(DataType::F16, &[1.0]), [0x00, 0x3c]);
    assert_eq!(encode(DataType::Bf16, &[1.0]), [0x80, 0x3f]);
}

/// Reduces one pair of values given as raw little-endian bytes.
fn reduce_bytes<const N: usize>(dtype: DataType, op: ReduceOp, dst: [u8; N], src: [u8; N]) -> [u8; N] {
    let mut dst = dst;
    reduce(dtype, op, &mut dst, &src).unwrap();
    dst
}

#[test]
fn integer_sum_and_prod_wrap() {
    let sum = ReduceOp::Sum;
    let prod = ReduceOp::Prod;
    let i8_sum = reduce_bytes(DataType::I8, sum, 127i8.to_le_bytes(), 1i8.to_le_bytes());
    assert_eq!(i8::from_le_bytes(i8_sum), -128);
    let u8_sum = reduce_bytes(DataType::U8, sum, [255], [1]);
    assert_eq!(u8_sum, [0]);
    let u8_prod = reduce_bytes(DataType::U8, prod, [16], [16]);
    assert_eq!(u8_prod, [0]);
    let i32_sum = reduce_bytes(DataType::I32, sum, i32::MAX.to_le_bytes(), 1i32.to_le_bytes());
    assert_eq!(i32::from_le_bytes(i32_sum), i32::MIN);
    let u32_sum = reduce_bytes(DataType::U32, sum, u32::MAX.to_le_bytes(), 3u32.to_le_bytes());
    assert_eq!(u32::from_le_bytes(u32_sum), 2);
    let i64_prod = reduce_bytes(DataType::I64, prod, i64::MIN.to_le_bytes(), (-1i64).to_le_bytes());
    assert_eq!(i64::from_le_bytes(i64_prod), i64::MIN);
    let u64_prod = reduce_bytes(DataType::U64, prod, u64::MAX.to_le_bytes(), u64::MAX.to_le_bytes());
    assert_eq!(u64::from_le_bytes(u64_prod), 1);
}

#[test]
fn integer_max_min_compare_signedness_correctly() {
    let i8_max = reduce_bytes(DataType::I8, ReduceOp::Max, (-1i8).to_le_bytes(), [1]);
    assert_eq!(i8_max, [1]);
    let u8_max = reduce_bytes(DataType::U8, ReduceOp::Max, [0xff], [1]);
    assert_eq!(u8_max, [0xff]);
    let u64_min = reduce_bytes(DataType::U64, ReduceOp::Min, u64::MAX.to_le_bytes(), [7, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(u64::from_le_bytes(u64_min), 7);
}

#[test]
fn f16_rounds_to_nearest_even() {
    let sum = ReduceOp::Sum;
    // Above 2048 an f16 step is 2, so odd sums are ties and go to the even mantissa.
    assert_eq!(reduced(DataType::F16, sum, &[2048.0], &[1.0]), [2048.0]);
    assert_eq!(reduced(DataType::F16, sum, &[2048.0], &[3.0]), [2052.0]);
    assert_eq!(reduced(DataType::F16, sum, &[2048.0], &[5.0]), [2052.0]);
    // 65504 is the largest f16; 65520 is the tie with the next step and rounds to infinity.
    assert_eq!(reduced(DataType::F16, sum, &[65504.0], &[8.0]), [65504.0]);
    assert_eq!(reduced(DataType::F16, sum, &[65504.0], &[16.0]), [f64::INFINITY]);
}

#[test]
fn bf16_rounds_to_nearest_even() {
    let sum = ReduceOp::Sum;
    // Between 256 and 512 a bf16 step is 2.
    assert_eq!(reduced(DataType::Bf16, sum, &[256.0], &[1.0]), [256.0]);
    assert_eq!(reduced(DataType::Bf16, sum, &[256.0], &[3.0]), [260.0]);
    // (1 + 2^-7)^2 = 1 + 2^-6 + 2^-14, and the 2^-14 is below half a step.
    let one_plus_ulp = 1.0 + 2f64.powi(-7);
    let square = reduced(DataType::Bf16, ReduceOp::Prod, &[one_plus_ulp], &[one_plus_ulp]);
    assert_eq!(square, [1.0 + 2f64.powi(-6)]);
}

const FLOAT_TYPES: [DataType; 4] = [DataType::F16, DataType::F32, DataType::F64, DataType::Bf16];

#[test]
fn max_min_prefer_the_number_over_nan() {
    let nan = f64::NAN;
    for dtype in FLOAT_TYPES {
        for op in [ReduceOp::Max, ReduceOp::Min] {
            assert_eq!(reduced(dtype, op, &[nan, 1.5], &[1.5, nan]), [1.5, 1.5], "{dtype} {op}");
            assert!(reduced(dtype, op, &[nan], &[nan])[0].is_nan(), "{dtype} {op}");
        }
        assert!(reduced(dtype, ReduceOp::Sum, &[nan], &[1.0])[0].is_nan(), "{dtype}");
        assert!(reduced(dtype, ReduceOp::Prod, &[2.0], &[nan])[0].is_nan(), "{dtype}");
    }
}

#[test]
fn max_min_order_negative_zero_below_positive_zero() {
    for dtype in FLOAT_TYPES {
        for (dst, src) in [(-0.0, 0.0), (0.0, -0.0)] {
            let max = reduced(dtype, ReduceOp::Max, &[dst], &[src])[0];
            let min = reduced(dtype, ReduceOp::Min, &[dst], &[src])[0];
            assert!(max == 0.0 && max.is_sign_positive(), "{dtype} max({dst}, {src})");
            assert!(min == 0.0 && min.is_sign_negative(), "{dtype} min({dst}, {src})");
        }
    }
}

#[test]
fn finish_avg_truncates_integers_toward_zero() {
    let mut values = encode(DataType::I32, &[7.0, -7.0, 9.0, 0.0]);
    finish_avg(DataType::I32, &mut values, 2).unwrap();
    assert_eq!(decode(DataType::I32, &values), [3.0, -3.0, 4.0, 0.0]);

    let mut bytes = [255u8, 254];
    finish_avg(DataType::U8, &mut bytes, 3).unwrap();
    assert_eq!(bytes, [85, 84]);

    // The rank count can exceed the element type's range.
    let mut bytes = (-128i8).to_le_bytes();
    finish_avg(DataType::I8, &mut bytes, 128).unwrap();
    assert_eq!(i8::from_le_bytes(bytes), -1);
    finish_avg(DataType::I8, &mut bytes, 1000).unwrap();
    assert_eq!(bytes, [0]);

    let mut bytes = u64::MAX.to_le_bytes();
    finish_avg(DataType::U64, &mut bytes, 1).unwrap();
    assert_eq!(u64::from_le_bytes(bytes), u64::MAX);
}

#[test]
fn finish_avg_divides_floats_and_rounds_halves() {
    let mut values = encode(DataType::F64, &[3.0, -1.0]);
    finish_avg(DataType::F64, &mut values, 2).unwrap();
    assert_eq!(decode(DataType::F64, &values), [1.5, -0.5]);

    // 1/3 rounds to 0x3555 in f16 and 0x3eab in bf16.
    let mut half = encode(DataType::F16, &[1.0]);
    finish_avg(DataType::F16, &mut half, 3).unwrap();
    assert_eq!(half, 0x3555u16.to_le_bytes());
    let mut brain = encode(DataType::Bf16, &[1.0]);
    finish_avg(DataType::Bf16, &mut brain, 3).unwrap();
    assert_eq!(brain, 0x3eabu16.to_le_bytes());
}

#[test]
fn avg_is_sum_across_ranks_then_one_division() {
    let rank_inputs = [[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 41.0]];
    for &dtype in DataType::ALL {
        let mut result = encode(dtype, &rank_inputs[0]);
        for input in &rank_inputs[1..] {
            reduce(dtype, ReduceOp::Avg, &mut result, &encode(dtype, input)).unwrap();
        }
        finish_avg(dtype, &mut result, rank_inputs.len()).unwrap();
        let expected = if dtype.is_float() { [2.5, 25.25] } else { [2.0, 25.0] };
        assert_eq!(decode(dtype, &result), expected, "{dtype}");
    }
}

#[test]
fn kernels_accept_unaligned_slices() {
    let mut dst_storage = [0u8; 1 + 2 * 8];
    let mut src_storage = [0u8; 3 + 2 * 8];
    dst_storage[1..].copy_from_slice(&encode(DataType::F64, &[1.25, -2.0]));
    src_storage[3..].copy_from_slice(&encode(DataType::F64, &[0.5, 4.0]));
    let (dst, src) = (&mut dst_storage[1..], &src_storage[3..]);
    reduce(DataType::F64, ReduceOp::Sum, dst, src).unwrap();
    assert_eq!(decode(DataType::F64, dst), [1.75, 2.0]);
}

#[test]
fn copy_moves_every_byte() {
    let src: Vec<u8> = (0..=255).collect();
    let mut dst = vec![0u8; 256];
    copy(&mut dst, &src).unwrap();
    assert_eq!(dst, src);
    copy(&mut [], &[]).unwrap();
}

#[test]
fn empty_buffers_are_fine() {
    for &dtype in DataType::ALL {
        reduce(dtype, ReduceOp::Prod, &mut [], &[]).unwrap();
        finish_avg(dtype, &mut [], 4).unwrap();
    }
}

#[test]
fn mismatched_lengths_are_rejected_and_leave_dst_alone() {
    let mut dst = [1u8, 2, 3, 4, 5, 6, 7, 8];
    let error = reduce(DataType::F32, ReduceOp::Sum, &mut dst, &[0; 4]).unwrap_err();
    assert_eq!(error, KernelError::LengthMismatch { dst_bytes: 8, src_bytes: 4 });
    assert_eq!(error.to_string(), "destination has 8 bytes but source has 4");
    assert_eq!(dst, [1, 2, 3, 4, 5, 6, 7, 8]);
    let error = copy(&mut dst, &[9; 9]).unwrap_err();
    assert!(matches!(error, KernelError::LengthMismatch { .. }));
    assert_eq!(dst, [1, 2, 3, 4, 5, 6, 7, 8]);
}

#[test]
fn partial_elements_are_rejected() {
    let mut dst = [0u8; 6];
    let error = reduce(DataType::F32, ReduceOp::Max, &mut dst, &[0; 6]).unwrap_err();
    assert_eq!(error, KernelError::PartialElement { dtype: DataType::F32, bytes: 6 });
    assert_eq!(error.to_string(), "6 bytes is not a whole number of float elements (4 bytes each)");
    let error = finish_avg(DataType::Bf16, &mut [0; 3], 2).unwrap_err();
    assert!(matches!(error, KernelError::PartialElement { bytes: 3, .. }));
}

#[test]
fn averaging_over_zero_ranks_is_an_error() {
    let mut buf = [0u8; 4];
    let error = finish_avg(DataType::I32, &mut buf, 0).unwrap_err();
    assert_eq!(error, KernelError::ZeroRanks);
}
