//! Lowering: `ast::File` + bindings -> `ir::Program`. Binds parameters, checks `where` clauses, runs the loops and
//! emits chunk-level transfers with their source spans; rejects races inside a `step` and out-of-range operands.

mod bind;
mod eval;
mod exec;
mod resolve;

use crate::diag::{Error, Errors};
use crate::ir::Program;
use crate::Limits;
use collc_grammar::ast;

pub use bind::{node_split, unbindable, Bindings, MAX_SLICES};

/// Lowers a parsed algorithm for one binding of its parameters.
pub fn lower(file: &ast::File, bindings: &Bindings, limits: &Limits) -> Result<Program, Errors> {
    let algo = &file.algorithm;
    let collective = algo.collective.name.parse().map_err(|message: String| {
        Error::new(
            "collc::lower::collective",
            message,
            "write `algorithm NAME for allreduce { ... }` or another collective",
        )
        .at(algo.collective.span, "unknown collective")
    })?;
    let bound = bind::bind(algo, collective, bindings, limits)?;
    exec::run(algo, collective, bound, limits)
}
