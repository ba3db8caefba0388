//! The reduction operators a `.coll` file defines before its algorithm (`op NAME(a, b) = EXPR`): for each, the data
//! types it types on and whether it is commutative and associative there, which an algorithm that reorders a
//! reduction needs (docs/language.md §16).

use collc_compiler::operator::{check_op, lower_op};
use collc_compiler::{Error, Errors};
use collc_grammar::ast::OpDef;
use collc_kernels::DataType;
use serde_json::json;

/// What `collc check` says of one operator: a line, its JSON, and the error that makes it fail (it types on no data
/// type, or does not lower at all).
pub struct OpReport {
    pub line: String,
    pub json: serde_json::Value,
    pub error: Option<Error>,
}

pub fn check(def: &OpDef) -> OpReport {
    let name = &def.name.name;
    if let Err(error) = lower_op(def) {
        return OpReport {
            line: format!("op {name}: does not lower"),
            json: json!({ "op": name, "error": error.message }),
            error: Some(error),
        };
    }
    let (mut typed, mut refused) = (Vec::new(), Vec::new());
    for &dtype in DataType::ALL {
        match check_op(def, dtype) {
            Ok(op) => typed.push((dtype, op)),
            Err(error) => refused.push((dtype, error)),
        }
    }
    let names =
        |dtypes: &mut dyn Iterator<Item = DataType>| dtypes.map(|d| d.to_string()).collect::<Vec<_>>().join(", ");
    if typed.is_empty() {
        let error = refused.swap_remove(0).1;
        return OpReport {
            line: format!("op {name}: types on no data type"),
            json: json!({ "op": name, "error": error.message }),
            error: Some(error),
        };
    }
    // Reorderable on every type it takes, or the first type where it is not.
    let not = typed.iter().find_map(|(_, op)| op.reorderable().err());
    let mut line = format!("op {name}: types on {}", names(&mut typed.iter().map(|(d, _)| *d)));
    if let Some((_, first)) = refused.first() {
        line += &format!(" (not {}: {})", names(&mut refused.iter().map(|(d, _)| *d)), first.message);
    }
    line += &match &not {
        None => "; commutative and associative: any algorithm may reorder it".to_string(),
        Some(why) => format!("; {why}: only an algorithm that reduces in rank order may run it"),
    };
    let json = json!({
        "op": name,
        "dtypes": typed.iter().map(|(d, _)| d.to_string()).collect::<Vec<_>>(),
        "reorderable": not.is_none(),
        "why_not": not.map(|why| why.to_string()),
    });
    OpReport { line, json, error: None }
}

/// The errors of reports that failed, for the renderer.
pub fn errors(reports: &[OpReport]) -> Errors {
    Errors(reports.iter().filter_map(|r| r.error.clone()).collect())
}
