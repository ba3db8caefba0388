//! The reduction operators a collective applies, with their NCCL codes and nccl-tests names.
//!
//! `Display` prints the nccl-tests `-o` name and `FromStr` parses it back.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// How two elements combine; each discriminant is NCCL's `ncclRedOp_t` value.
///
/// `Avg` combines like `Sum`; the division by the rank count happens once, at the end,
/// in [`crate::reference::finish_avg`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "&'static str", try_from = "String")]
pub enum ReduceOp {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
    Avg = 4,
}

/// A name that is not one of `sum prod max min avg`.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("unknown reduce op `{name}`; expected one of: {}", accepted_reduce_op_names())]
pub struct UnknownReduceOp {
    pub name: String,
}

impl ReduceOp {
    /// Every operator, in NCCL code order.
    pub const ALL: &'static [ReduceOp] = &[ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg];

    /// The value of NCCL's `ncclRedOp_t` for this operator.
    pub const fn nccl_code(self) -> u8 {
        self as u8
    }

    /// The operator whose `ncclRedOp_t` value is `code`, if it is a built-in one.
    pub fn from_nccl_code(code: u8) -> Option<ReduceOp> {
        ReduceOp::ALL.get(usize::from(code)).copied()
    }

    /// The name nccl-tests uses for `-o`; this is what `Display` prints.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
        }
    }
}

fn accepted_reduce_op_names() -> String {
    let names: Vec<&str> = ReduceOp::ALL.iter().map(|op| op.name()).collect();
    names.join(", ")
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = UnknownReduceOp;

    /// Accepts the name in any ASCII case (`Sum`, `MAX`).
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        ReduceOp::ALL
            .iter()
            .copied()
            .find(|op| name.eq_ignore_ascii_case(op.name()))
            .ok_or_else(|| UnknownReduceOp { name: name.to_owned() })
    }
}

impl From<ReduceOp> for &'static str {
    fn from(op: ReduceOp) -> Self {
        op.name()
    }
}

impl TryFrom<String> for ReduceOp {
    type Error = UnknownReduceOp;

    fn try_from(name: String) -> Result<Self, Self::Error> {
        name.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_codes_match_nccl_h() {
        let expected = [("sum", 0), ("prod", 1), ("max", 2), ("min", 3), ("avg", 4)];
        for (name, code) in expected {
            let op: ReduceOp = name.parse().unwrap();
            assert_eq!(op.nccl_code(), code, "{name}");
            assert_eq!(ReduceOp::from_nccl_code(code), Some(op));
        }
        assert_eq!(ReduceOp::from_nccl_code(5), None);
    }

    #[test]
    fn print_parse_round_trip() {
        for &op in ReduceOp::ALL {
            let printed = op.to_string();
            assert_eq!(printed.parse::<ReduceOp>(), Ok(op));
            assert_eq!(printed.to_uppercase().parse::<ReduceOp>(), Ok(op));
        }
        assert_eq!(ReduceOp::Avg.to_string(), "avg");
    }

    #[test]
    fn unknown_name_lists_accepted_names() {
        let error = "mean".parse::<ReduceOp>().unwrap_err();
        assert_eq!(error.to_string(), "unknown reduce op `mean`; expected one of: sum, prod, max, min, avg");
    }

    #[test]
    fn serde_uses_the_printed_name() {
        let json = serde_json::to_string(&ReduceOp::Prod).unwrap();
        assert_eq!(json, "\"prod\"");
        assert_eq!(serde_json::from_str::<ReduceOp>("\"min\"").unwrap(), ReduceOp::Min);
        assert!(serde_json::from_str::<ReduceOp>("\"mean\"").is_err());
    }
}
