//! The one diagnostic type of the compiler: a code, a message, labelled spans, a help line and a note.
//! Library code returns these; only the binary turns them into `miette::Report`s.

use collc_grammar::ast::Span;
use collc_grammar::SyntaxError;
use miette::{Diagnostic, LabeledSpan};
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// Stable code, e.g. `collc::verify::deadlock`.
    pub code: &'static str,
    pub message: String,
    /// The first label is the primary location.
    pub labels: Vec<(Span, String)>,
    pub help: String,
    /// Extra detail: a counterexample, a wait-for cycle.
    pub note: Option<String>,
}

impl Error {
    pub fn new(code: &'static str, message: impl Into<String>, help: impl Into<String>) -> Self {
        Error { code, message: message.into(), labels: Vec::new(), help: help.into(), note: None }
    }

    pub fn at(mut self, span: Span, label: impl Into<String>) -> Self {
        self.labels.push((span, label.into()));
        self
    }

    pub fn with_note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }

    pub fn primary_span(&self) -> Option<Span> {
        self.labels.first().map(|(s, _)| *s)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl Diagnostic for Error {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(self.code))
    }

    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        let help = match &self.note {
            Some(note) => format!("{}\n{note}", self.help),
            None => self.help.clone(),
        };
        Some(Box::new(help))
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        if self.labels.is_empty() {
            return None;
        }
        Some(Box::new(self.labels.iter().enumerate().map(|(i, (span, text))| {
            let (start, len) = (span.start as usize, span.len());
            if i == 0 {
                LabeledSpan::new_primary_with_span(Some(text.clone()), (start, len))
            } else {
                LabeledSpan::new_with_span(Some(text.clone()), (start, len))
            }
        })))
    }
}

impl From<SyntaxError> for Error {
    fn from(e: SyntaxError) -> Self {
        Error::new("collc::syntax", e.message, e.help).at(e.span, "here")
    }
}

/// All the errors of one stage; never empty.
#[derive(Clone, Debug)]
pub struct Errors(pub Vec<Error>);

impl Errors {
    /// Whether these say only that the algorithm does not admit the binding (its `where`, its node split or its
    /// root), not that it is wrong: a selection leaves such a candidate out.
    pub fn not_admitted(&self) -> bool {
        matches!(
            self.0.as_slice(),
            [Error { code: "collc::lower::where" | "collc::lower::nodes" | "collc::lower::root", .. }]
        )
    }
}

impl From<Error> for Errors {
    fn from(e: Error) -> Self {
        Errors(vec![e])
    }
}

/// The 1-based line of byte `offset` in `source` (the last line for an offset past its end).
pub fn line_at(source: &str, offset: usize) -> usize {
    source.as_bytes()[..offset.min(source.len())].iter().filter(|&&b| b == b'\n').count() + 1
}

/// Renders one diagnostic against its source as miette's graphical report; colourless when `plain` (files, CI,
/// snapshots). The compiler does no I/O: callers print the string.
pub fn render(error: &Error, name: &str, source: &str, plain: bool) -> String {
    use miette::{GraphicalReportHandler, GraphicalTheme, NamedSource};
    if source.is_empty() {
        // No source to point into (an empty file): the file, the message, the help and the note.
        let file = if name.is_empty() { String::new() } else { format!(" in {name}") };
        return format!("{}{file}\n\n  x {}\n  help: {}\n", error.code, error.message, error.help)
            + &error.note.as_ref().map(|n| format!("  {}\n", n.replace('\n', "\n  "))).unwrap_or_default();
    }
    let theme = if plain { GraphicalTheme::unicode_nocolor() } else { GraphicalTheme::default() };
    let handler = GraphicalReportHandler::new_themed(theme).with_width(110);
    let report = miette::Report::new(error.clone()).with_source_code(NamedSource::new(name, source.to_string()));
    let mut out = String::new();
    if handler.render_report(&mut out, report.as_ref()).is_err() {
        out = format!("error[{}]: {}\n", error.code, error.message);
    }
    out
}

/// The names close to `arg`: a typo's (one or two edits, `alreduce` for `allreduce`), else those one contains the
/// other of (`ring` and `allreduce/ring`), else those within a few edits (`allreduce/rign`), closest first.
pub fn did_you_mean<'n>(arg: &str, names: &[&'n str]) -> Vec<&'n str> {
    let mut typos: Vec<(usize, &str)> = names
        .iter()
        .map(|&n| (strsim::damerau_levenshtein(arg, n), n))
        .filter(|&(d, n)| d <= 2 && d < n.len().min(arg.len()))
        .collect();
    if !typos.is_empty() {
        typos.sort_unstable();
        return typos.into_iter().take(3).map(|(_, n)| n).collect();
    }
    let contained: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| n.contains(arg) || arg.contains(n.split('/').next_back().unwrap_or(n)))
        .collect();
    if !contained.is_empty() {
        return contained;
    }
    let mut scored: Vec<(usize, &str)> = names
        .iter()
        .map(|&n| (strsim::damerau_levenshtein(arg, n), n))
        .filter(|&(d, n)| d <= 2.max(n.len() / 4))
        .collect();
    scored.sort_unstable();
    scored.into_iter().take(3).map(|(_, n)| n).collect()
}

/// `message`, with `; did you mean: a, b` when names close to `arg` exist.
pub fn with_suggestion(message: String, arg: &str, names: &[&str]) -> String {
    match did_you_mean(arg, names).as_slice() {
        [] => message,
        close => format!("{message}; did you mean: {}", close.join(", ")),
    }
}
