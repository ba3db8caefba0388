//! Renders compiler diagnostics with their source, as miette reports.

use collc_compiler::{Error, Errors};
use miette::{GraphicalReportHandler, GraphicalTheme, NamedSource};

/// Renders one diagnostic against `source`; colourless when `plain` (for files, CI and snapshots).
pub fn render(error: &Error, name: &str, source: &str, plain: bool) -> String {
    let theme = if plain { GraphicalTheme::unicode_nocolor() } else { GraphicalTheme::default() };
    let handler = GraphicalReportHandler::new_themed(theme).with_width(110);
    let report = miette::Report::new(error.clone()).with_source_code(NamedSource::new(name, source.to_string()));
    let mut out = String::new();
    if handler.render_report(&mut out, report.as_ref()).is_err() {
        out = format!("error[{}]: {}\n", error.code, error.message);
    }
    out
}

/// Prints every diagnostic to stderr.
pub fn print_all(errors: &Errors, name: &str, source: &str) {
    let plain = std::env::var_os("NO_COLOR").is_some() || !std::io::IsTerminal::is_terminal(&std::io::stderr());
    for error in &errors.0 {
        eprint!("{}", render(error, name, source, plain));
    }
}
