//! Syntax errors as miette diagnostics, and the limits that keep parsing bounded.

use crate::ast::Span;
use miette::Diagnostic;
use thiserror::Error;

/// Bounds on what the front end accepts, so hostile input cannot exhaust time or stack.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest accepted source file.
    pub max_source_bytes: usize,
    /// Deepest bracket nesting `( [ {`.
    pub max_nesting: usize,
    /// Most `if` keywords in a file (else-if chains recurse in the parser).
    pub max_ifs: usize,
    /// Deepest operator tree in one expression.
    pub max_expr_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_source_bytes: 1 << 20, max_nesting: 64, max_ifs: 512, max_expr_depth: 128 }
    }
}

/// A source text that is not a well-formed `.coll` file.
#[derive(Clone, Debug, Error, Diagnostic)]
#[error("{message}")]
#[diagnostic(code(collc::syntax))]
pub struct SyntaxError {
    pub message: String,
    #[label("here")]
    pub span: Span,
    #[help]
    pub help: String,
}

impl SyntaxError {
    pub fn new(message: impl Into<String>, span: Span, help: impl Into<String>) -> Self {
        SyntaxError { message: message.into(), span, help: help.into() }
    }
}
