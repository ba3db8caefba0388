//! PreMulSum's factor: the scalar each rank multiplies its own input by before the sum, as NCCL's
//! `ncclRedOpCreatePreMulSum` takes it. Users write it untyped (`premulsum:0.5`, `premulsum:3`); a call converts it
//! to its data type once, when it is prepared, and refuses a factor that type cannot hold.

use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};
use thiserror::Error;

use crate::DataType;

/// A factor as written: an integer, or a float (kept as its bits, so the type has `Eq`, `Hash` and `Ord`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scalar {
    Int(i128),
    Float(u64),
}

/// A factor the call's data type cannot hold: a fraction for an integer type, a value out of its range.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("premulsum's factor {factor} {why}")]
pub struct ScalarError {
    pub factor: Scalar,
    pub dtype: DataType,
    pub why: String,
}

/// Text that is not a number.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("`{0}` is not a number: premulsum's factor is an integer (3, -2) or a float (0.5, 1e-3)")]
pub struct NotAScalar(pub String);

impl Scalar {
    /// One element of `dtype` holding this factor, little-endian, in the first `dtype.size_bytes()` bytes. Floats
    /// round to nearest even; integers must be whole and in range.
    pub fn element(self, dtype: DataType) -> Result<[u8; 8], ScalarError> {
        let fail = |why: String| ScalarError { factor: self, dtype, why };
        let mut out = [0u8; 8];
        if dtype.is_float() {
            let value = match self {
                Scalar::Int(v) => v as f64,
                Scalar::Float(bits) => f64::from_bits(bits),
            };
            let (bytes, finite): (Vec<u8>, bool) = match dtype {
                DataType::F16 => (f16::from_f64(value).to_le_bytes().to_vec(), f16::from_f64(value).is_finite()),
                DataType::Bf16 => (bf16::from_f64(value).to_le_bytes().to_vec(), bf16::from_f64(value).is_finite()),
                DataType::F32 => ((value as f32).to_le_bytes().to_vec(), (value as f32).is_finite()),
                _ => (value.to_le_bytes().to_vec(), value.is_finite()),
            };
            if value.is_finite() && !finite {
                return Err(fail(format!("is beyond the largest finite {dtype}")));
            }
            out[..bytes.len()].copy_from_slice(&bytes);
            return Ok(out);
        }
        let whole = match self {
            Scalar::Int(v) => v,
            Scalar::Float(bits) => {
                let value = f64::from_bits(bits);
                if !value.is_finite() || value.fract() != 0.0 || value.abs() >= 2f64.powi(100) {
                    return Err(fail(format!("is not a whole number: {dtype} multiplies by integers")));
                }
                value as i128
            }
        };
        let out_of_range = || fail(format!("is outside {dtype}'s range"));
        let bytes = match dtype {
            DataType::I8 => i8::try_from(whole).map_err(|_| out_of_range())?.to_le_bytes().to_vec(),
            DataType::U8 => u8::try_from(whole).map_err(|_| out_of_range())?.to_le_bytes().to_vec(),
            DataType::I32 => i32::try_from(whole).map_err(|_| out_of_range())?.to_le_bytes().to_vec(),
            DataType::U32 => u32::try_from(whole).map_err(|_| out_of_range())?.to_le_bytes().to_vec(),
            DataType::I64 => i64::try_from(whole).map_err(|_| out_of_range())?.to_le_bytes().to_vec(),
            _ => u64::try_from(whole).map_err(|_| out_of_range())?.to_le_bytes().to_vec(),
        };
        out[..bytes.len()].copy_from_slice(&bytes);
        Ok(out)
    }

    /// The factor as a float, for tolerances.
    pub fn as_f64(self) -> f64 {
        match self {
            Scalar::Int(v) => v as f64,
            Scalar::Float(bits) => f64::from_bits(bits),
        }
    }
}

impl From<f64> for Scalar {
    fn from(value: f64) -> Self {
        Scalar::Float(value.to_bits())
    }
}

impl From<i64> for Scalar {
    fn from(value: i64) -> Self {
        Scalar::Int(value.into())
    }
}

/// Integers print as written; floats as Rust's shortest round-trip form with a point or exponent (`2.0`, `1e-7`), so
/// what prints parses back to the same factor.
impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Int(v) => write!(f, "{v}"),
            Scalar::Float(bits) => write!(f, "{:?}", f64::from_bits(*bits)),
        }
    }
}

impl FromStr for Scalar {
    type Err = NotAScalar;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if let Ok(v) = text.parse::<i128>() {
            return Ok(Scalar::Int(v));
        }
        text.parse::<f64>().map(Scalar::from).map_err(|_| NotAScalar(text.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn element(text: &str, dtype: DataType) -> Result<Vec<u8>, String> {
        let scalar: Scalar = text.parse().map_err(|e: NotAScalar| e.to_string())?;
        scalar.element(dtype).map(|b| b[..dtype.size_bytes()].to_vec()).map_err(|e| e.to_string())
    }

    #[test]
    fn factors_convert_to_each_type_or_say_why_not() {
        assert_eq!(element("3", DataType::I8), Ok(vec![3]));
        assert_eq!(element("-2", DataType::I32), Ok((-2i32).to_le_bytes().to_vec()));
        assert_eq!(element("4.0", DataType::U64), Ok(4u64.to_le_bytes().to_vec()));
        assert_eq!(element("0.5", DataType::F32), Ok(0.5f32.to_le_bytes().to_vec()));
        assert_eq!(element("0.1", DataType::F16), Ok(f16::from_f64(0.1).to_le_bytes().to_vec()));
        assert_eq!(element("3", DataType::Bf16), Ok(bf16::from_f32(3.0).to_le_bytes().to_vec()));
        assert_eq!(element("18446744073709551615", DataType::U64), Ok(u64::MAX.to_le_bytes().to_vec()));
        assert_eq!(
            element("0.5", DataType::I32).unwrap_err(),
            "premulsum's factor 0.5 is not a whole number: int32 multiplies by integers"
        );
        assert_eq!(element("300", DataType::U8).unwrap_err(), "premulsum's factor 300 is outside uint8's range");
        assert_eq!(element("-1", DataType::U32).unwrap_err(), "premulsum's factor -1 is outside uint32's range");
        assert_eq!(
            element("1e6", DataType::F16).unwrap_err(),
            "premulsum's factor 1000000.0 is beyond the largest finite half"
        );
        assert!(element("inf", DataType::F32).is_ok(), "an infinite factor is the user's to choose");
        assert!(element("half", DataType::F32).unwrap_err().contains("`half` is not a number"));
    }

    #[test]
    fn what_prints_parses_back() {
        for text in ["3", "-7", "0.5", "2.0", "1e-7", "-0.0", "inf"] {
            let scalar: Scalar = text.parse().unwrap();
            assert_eq!(scalar.to_string().parse::<Scalar>(), Ok(scalar), "{text}");
        }
        assert_eq!(Scalar::from(2.0).to_string(), "2.0");
        assert_eq!("2".parse::<Scalar>(), Ok(Scalar::Int(2)));
    }
}
