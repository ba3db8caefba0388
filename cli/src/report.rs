//! Prints compiler diagnostics with their source to stderr.

use collc_compiler::diag::render;
use collc_compiler::Errors;

/// Prints every diagnostic to stderr, in colour only on a terminal without NO_COLOR.
pub fn print_all(errors: &Errors, name: &str, source: &str) {
    let plain = std::env::var_os("NO_COLOR").is_some() || !std::io::IsTerminal::is_terminal(&std::io::stderr());
    for error in &errors.0 {
        eprint!("{}", render(error, name, source, plain));
    }
}
