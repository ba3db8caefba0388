//! collc-grammar: the `.coll` language front end. `parse` turns source text into a spanned `ast::File`.
//!
//! Architecture invariant: pest's `Rule` type never leaves `parse.rs`; everything downstream sees only `ast`.

pub mod ast;
mod error;
mod parse;

pub use error::{Limits, SyntaxError};
pub use parse::parse;
