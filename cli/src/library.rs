//! How a NAME|FILE argument resolves to source text: the embedded library first, then a file.

use std::path::Path;

pub use collc_compiler::library::LIBRARY;

/// A `.coll` source and the name it is shown under.
pub struct Source {
    pub name: String,
    pub text: String,
}

/// Resolves `allreduce/ring` to the embedded library, anything else that exists to a file.
pub fn resolve(arg: &str) -> Result<Source, String> {
    if let Some((name, text)) = LIBRARY.iter().find(|(name, _)| *name == arg) {
        return Ok(Source { name: format!("{name}.coll"), text: text.to_string() });
    }
    let path = Path::new(arg);
    if path.exists() {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read `{arg}`: {e}"))?;
        return Ok(Source { name: arg.to_string(), text });
    }
    let names: Vec<&str> = LIBRARY.iter().map(|(n, _)| *n).collect();
    let close = collc_compiler::diag::did_you_mean(arg, &names);
    let hint = if close.is_empty() {
        format!("library algorithms: {}", names.join(", "))
    } else {
        format!("did you mean: {}", close.join(", "))
    };
    Err(format!("`{arg}` is neither a library algorithm nor a file; {hint} (see `collc list`)"))
}

/// Whether `source` is a schedule file (`collc build --emit sched`), which runs as it stands.
pub fn is_schedule(source: &Source) -> bool {
    source.name.ends_with(".sched") || source.text.starts_with("collc-schedule ")
}

/// A `.sched` file's schedule, verified as `collc check` verifies it, its diagnostics at the file's own lines, and
/// where each instruction stands in the file.
pub fn verify_schedule(
    source: &Source,
    limits: &collc_compiler::Limits,
) -> Result<(collc_compiler::VerifiedSchedule, collc_compiler::emit::SchedLines), collc_compiler::Errors> {
    let (sched, lines) =
        collc_compiler::emit::parse_sched_located(&source.text).map_err(|e| collc_compiler::Errors(vec![e]))?;
    let verified = collc_compiler::verify_sched(sched, &source.text, &lines, limits)?;
    Ok((verified, lines))
}
