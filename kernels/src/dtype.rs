//! The element types a collective moves: their sizes, NCCL codes and the names users type.
//!
//! Names follow nccl-tests (`-d float`, `-d bfloat16`), so a command line copied from an
//! nccl-tests run works unchanged; the short Rust-style aliases (`f32`, `bf16`) are accepted
//! too. `Display` prints the nccl-tests name, and parsing what it prints gives back the same
//! value.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The element type of a buffer; each discriminant is NCCL's `ncclDataType_t` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "&'static str", try_from = "String")]
pub enum DataType {
    I8 = 0,
    U8 = 1,
    I32 = 2,
    U32 = 3,
    I64 = 4,
    U64 = 5,
    F16 = 6,
    F32 = 7,
    F64 = 8,
    Bf16 = 9,
}

/// A name that is neither an nccl-tests data type name nor a short alias.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("unknown data type `{name}`; expected one of: {}", accepted_data_type_names())]
pub struct UnknownDataType {
    pub name: String,
}

impl DataType {
    /// Every data type, in NCCL code order.
    pub const ALL: &'static [DataType] = &[
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
        DataType::F16,
        DataType::F32,
        DataType::F64,
        DataType::Bf16,
    ];

    /// Bytes per element.
    pub const fn size_bytes(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::I32 | DataType::U32 | DataType::F32 => 4,
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
        }
    }

    /// The value of NCCL's `ncclDataType_t` for this type.
    pub const fn nccl_code(self) -> u8 {
        self as u8
    }

    /// The type whose `ncclDataType_t` value is `code`, if NCCL defines one.
    pub fn from_nccl_code(code: u8) -> Option<DataType> {
        DataType::ALL.get(usize::from(code)).copied()
    }

    /// Whether the type is floating point, so results are compared with a tolerance.
    pub const fn is_float(self) -> bool {
        matches!(self, DataType::F16 | DataType::F32 | DataType::F64 | DataType::Bf16)
    }

    /// The name nccl-tests uses for `-d`; this is what `Display` prints.
    pub const fn nccl_name(self) -> &'static str {
        match self {
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
            DataType::F16 => "half",
            DataType::F32 => "float",
            DataType::F64 => "double",
            DataType::Bf16 => "bfloat16",
        }
    }

    /// The Rust-style alias, accepted by `FromStr` alongside the nccl-tests name.
    pub const fn short_name(self) -> &'static str {
        match self {
            DataType::I8 => "i8",
            DataType::U8 => "u8",
            DataType::I32 => "i32",
            DataType::U32 => "u32",
            DataType::I64 => "i64",
            DataType::U64 => "u64",
            DataType::F16 => "f16",
            DataType::F32 => "f32",
            DataType::F64 => "f64",
            DataType::Bf16 => "bf16",
        }
    }
}

/// Every accepted name, nccl-tests names first, for the unknown-name message.
fn accepted_data_type_names() -> String {
    let nccl = DataType::ALL.iter().map(|dtype| dtype.nccl_name());
    let short = DataType::ALL.iter().map(|dtype| dtype.short_name());
    nccl.chain(short).collect::<Vec<_>>().join(", ")
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.nccl_name())
    }
}

impl FromStr for DataType {
    type Err = UnknownDataType;

    /// Accepts either spelling, ignoring ASCII case (`Float`, `BF16`).
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        DataType::ALL
            .iter()
            .copied()
            .find(|dtype| name.eq_ignore_ascii_case(dtype.nccl_name()) || name.eq_ignore_ascii_case(dtype.short_name()))
            .ok_or_else(|| UnknownDataType { name: name.to_owned() })
    }
}

impl From<DataType> for &'static str {
    fn from(dtype: DataType) -> Self {
        dtype.nccl_name()
    }
}

impl TryFrom<String> for DataType {
    type Error = UnknownDataType;

    fn try_from(name: String) -> Result<Self, Self::Error> {
        name.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_codes_match_nccl_h() {
        let expected = [
            ("int8", 0),
            ("uint8", 1),
            ("int32", 2),
            ("uint32", 3),
            ("int64", 4),
            ("uint64", 5),
            ("half", 6),
            ("float", 7),
            ("double", 8),
            ("bfloat16", 9),
        ];
        for (name, code) in expected {
            let dtype: DataType = name.parse().unwrap();
            assert_eq!(dtype.nccl_code(), code, "{name}");
            assert_eq!(DataType::from_nccl_code(code), Some(dtype));
        }
        assert_eq!(DataType::from_nccl_code(10), None);
    }

    #[test]
    fn sizes() {
        let sizes: Vec<usize> = DataType::ALL.iter().map(|d| d.size_bytes()).collect();
        assert_eq!(sizes, [1, 1, 4, 4, 8, 8, 2, 4, 8, 2]);
    }

    #[test]
    fn print_parse_round_trip() {
        for &dtype in DataType::ALL {
            let printed = dtype.to_string();
            assert_eq!(printed.parse::<DataType>(), Ok(dtype));
            assert_eq!(dtype.short_name().parse::<DataType>(), Ok(dtype));
            assert_eq!(printed.to_uppercase().parse::<DataType>(), Ok(dtype));
        }
        assert_eq!("bf16".parse::<DataType>(), Ok(DataType::Bf16));
        assert_eq!(DataType::F16.to_string(), "half");
    }

    #[test]
    fn unknown_name_lists_accepted_names() {
        let error = "float128".parse::<DataType>().unwrap_err();
        assert_eq!(error.name, "float128");
        assert_eq!(
            error.to_string(),
            "unknown data type `float128`; expected one of: int8, uint8, int32, uint32, \
             int64, uint64, half, float, double, bfloat16, i8, u8, i32, u32, i64, u64, \
             f16, f32, f64, bf16"
        );
        assert!("".parse::<DataType>().is_err());
    }

    #[test]
    fn serde_uses_the_printed_name() {
        let json = serde_json::to_string(&DataType::Bf16).unwrap();
        assert_eq!(json, "\"bfloat16\"");
        let parsed: Vec<DataType> = serde_json::from_str("[\"half\", \"u64\"]").unwrap();
        assert_eq!(parsed, [DataType::F16, DataType::U64]);
        assert!(serde_json::from_str::<DataType>("\"complex\"").is_err());
    }

    #[test]
    fn float_types() {
        let floats: Vec<DataType> = DataType::ALL.iter().copied().filter(|d| d.is_float()).collect();
        assert_eq!(floats, [DataType::F16, DataType::F32, DataType::F64, DataType::Bf16]);
    }
}
