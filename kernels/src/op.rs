//! The reduction operators a collective applies, with their NCCL codes and nccl-tests names.
//!
//! `Display` prints the nccl-tests `-o` name (`premulsum:S` with its factor) and `FromStr` parses it back.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::factor::Scalar;
use crate::operator::UserOp;

/// How two elements combine ([`ReduceOp::nccl_code`] gives NCCL's `ncclRedOp_t` value).
///
/// `Avg` combines like `Sum`; the division by the rank count happens once, at the end,
/// in [`crate::reference::finish_avg`]. `PreMulSum` combines like `Sum` too, after each rank has multiplied its own
/// input by its factor where the schedule first reads it (docs/language.md §13): ranks may pass different factors,
/// as NCCL's are local to a rank. `User` is an operator a `.coll` file defines (docs/language.md §16), registered in
/// this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum ReduceOp {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
    PreMulSum(Scalar),
    User(UserOp),
}

/// A name that is not one of `sum prod max min avg premulsum:S`, or a premulsum without its factor.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum UnknownReduceOp {
    #[error(
        "unknown reduce op `{name}`; expected one of: {}, premulsum:S, or an operator a .coll file defines",
        accepted_reduce_op_names()
    )]
    Name { name: String },
    #[error("`{name}`: premulsum needs its factor after a colon, e.g. premulsum:0.5 (a float) or premulsum:3")]
    NoFactor { name: String },
    #[error("`{name}`: {source}")]
    Factor { name: String, source: crate::factor::NotAScalar },
}

impl ReduceOp {
    /// The five built-in operators, in NCCL code order (`PreMulSum` takes a factor).
    pub const ALL: &'static [ReduceOp] = &[ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg];

    /// The code of every user's operator: it follows PreMulSum's. Which operator it is, the call's fingerprint says
    /// by its digest.
    pub const USER_CODE: u8 = 6;

    /// The value of NCCL's `ncclRedOp_t` for the five built-ins; `PreMulSum` is 5 (`ncclNumOps`), the code NCCL gives
    /// the first operator a communicator creates; users' operators are 6 ([`ReduceOp::USER_CODE`]). Kernel tables
    /// and the device image index by it.
    pub const fn nccl_code(self) -> u8 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
            ReduceOp::Avg => 4,
            ReduceOp::PreMulSum(_) => 5,
            ReduceOp::User(_) => Self::USER_CODE,
        }
    }

    /// The operator two partial results combine with: `Avg` and `PreMulSum` combine as `Sum`, the others as
    /// themselves.
    pub const fn combines_as(self) -> ReduceOp {
        match self {
            ReduceOp::Avg | ReduceOp::PreMulSum(_) => ReduceOp::Sum,
            op => op,
        }
    }

    /// PreMulSum's factor.
    pub const fn factor(self) -> Option<Scalar> {
        match self {
            ReduceOp::PreMulSum(factor) => Some(factor),
            _ => None,
        }
    }

    /// The operator whose `ncclRedOp_t` value is `code`, if it is a built-in one.
    pub fn from_nccl_code(code: u8) -> Option<ReduceOp> {
        ReduceOp::ALL.get(usize::from(code)).copied()
    }

    /// The name nccl-tests uses for `-o` (`premulsum` without its factor, which `Display` adds); a user's operator's
    /// own name.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
            ReduceOp::PreMulSum(_) => "premulsum",
            ReduceOp::User(op) => op.name(),
        }
    }
}

fn accepted_reduce_op_names() -> String {
    let names: Vec<&str> = ReduceOp::ALL.iter().map(|op| op.name()).collect();
    names.join(", ")
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReduceOp::PreMulSum(factor) => write!(f, "premulsum:{factor}"),
            op => f.write_str(op.name()),
        }
    }
}

impl FromStr for ReduceOp {
    type Err = UnknownReduceOp;

    /// Accepts the name in any ASCII case (`Sum`, `MAX`, `PreMulSum:0.5`, `mulsum:0.5`), or the exact name of an
    /// operator registered in this process (the last one registered under it).
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        let (head, factor) = match name.split_once(':') {
            Some((head, factor)) => (head, Some(factor)),
            None => (name, None),
        };
        // `mulsum` is what nccl-tests' tables call it.
        if head.eq_ignore_ascii_case("premulsum") || head.eq_ignore_ascii_case("mulsum") {
            let factor = factor.ok_or_else(|| UnknownReduceOp::NoFactor { name: name.to_owned() })?;
            let factor = factor.parse().map_err(|source| UnknownReduceOp::Factor { name: name.to_owned(), source })?;
            return Ok(ReduceOp::PreMulSum(factor));
        }
        ReduceOp::ALL
            .iter()
            .copied()
            .find(|op| name.eq_ignore_ascii_case(op.name()))
            .or_else(|| UserOp::named(name).map(ReduceOp::User))
            .ok_or_else(|| UnknownReduceOp::Name { name: name.to_owned() })
    }
}

impl From<ReduceOp> for String {
    fn from(op: ReduceOp) -> Self {
        op.to_string()
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
        assert_eq!(
            error.to_string(),
            "unknown reduce op `mean`; expected one of: sum, prod, max, min, avg, premulsum:S, or an operator a .coll \
             file defines"
        );
        let error = "premulsum".parse::<ReduceOp>().unwrap_err();
        assert!(error.to_string().contains("premulsum needs its factor after a colon"), "{error}");
        let error = "premulsum:x".parse::<ReduceOp>().unwrap_err();
        assert!(error.to_string().contains("`x` is not a number"), "{error}");
    }

    #[test]
    fn premulsum_carries_its_factor() {
        let op: ReduceOp = "PreMulSum:0.5".parse().unwrap();
        assert_eq!(op, ReduceOp::PreMulSum(Scalar::from(0.5)));
        assert_eq!(op.to_string(), "premulsum:0.5");
        assert_eq!(op.to_string().parse::<ReduceOp>(), Ok(op));
        assert_eq!(op.nccl_code(), 5);
        assert_eq!(op.combines_as(), ReduceOp::Sum);
        assert_eq!(ReduceOp::from_nccl_code(5), None, "a code alone does not say the factor");
        assert_eq!(serde_json::to_string(&op).unwrap(), "\"premulsum:0.5\"");
    }

    #[test]
    fn serde_uses_the_printed_name() {
        let json = serde_json::to_string(&ReduceOp::Prod).unwrap();
        assert_eq!(json, "\"prod\"");
        assert_eq!(serde_json::from_str::<ReduceOp>("\"min\"").unwrap(), ReduceOp::Min);
        assert!(serde_json::from_str::<ReduceOp>("\"mean\"").is_err());
    }
}
