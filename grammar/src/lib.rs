//! collc-grammar: the `.coll` language front end. `parse` turns source text into a spanned `ast::File`, `parse_ops` a
//! file of reduction operators into their `ast::OpDef`s.
//!
//! Architecture invariant: pest's `Rule` type never leaves `parse.rs`; everything downstream sees only `ast`.

pub mod ast;
mod error;
mod parse;

pub use error::{Limits, SyntaxError};
pub use parse::{parse, parse_ops};
