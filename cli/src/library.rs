//! The algorithms a NAME|FILE argument, `--algo`, `--compare`, `tune` and `list` know: the embedded library and
//! users' own `.coll` files from `--library DIR` and `COLLC_ALGO_PATH` (`collc_runtime::algo_path`), loaded once
//! before a subcommand runs; then a file.

use collc_compiler::library::Library;
use std::path::Path;
use std::sync::{Arc, OnceLock};

static LOADED: OnceLock<Arc<Library>> = OnceLock::new();

/// Puts `--library` folders before `COLLC_ALGO_PATH`'s (the variable is set for the ranks this process starts, and
/// for the runtime's own selections), then reads them all. A folder that is not there is a usage error (2); a file
/// that does not parse or takes a taken name is printed with its diagnostic (1). Call before any thread starts.
pub fn load(folders: &[String]) -> Result<(), u8> {
    use collc_runtime::algo_path::{self, LoadError};
    if !folders.is_empty() {
        let mut path = folders.to_vec();
        path.extend(std::env::var(algo_path::VAR).ok().filter(|p| !p.is_empty()));
        std::env::set_var(algo_path::VAR, path.join(":"));
    }
    let origin = match folders.is_empty() {
        true => algo_path::VAR.to_string(),
        false => format!("--library / {}", algo_path::VAR),
    };
    match algo_path::library() {
        Ok(library) => {
            LOADED.get_or_init(|| library);
            Ok(())
        }
        Err(LoadError::Io(message)) => {
            eprintln!("error: {origin}: {message}");
            Err(2)
        }
        Err(LoadError::Files(errors)) => {
            for error in &errors {
                let errors = collc_compiler::Errors(vec![error.error.clone()]);
                crate::report::print_all(&errors, &error.file, &error.source);
            }
            eprintln!("error: {origin}: {} file(s) cannot join the algorithm library (above)", errors.len());
            Err(1)
        }
    }
}

/// The library: the embedded one and the users' algorithms `load` read.
pub fn library() -> &'static Library {
    LOADED.get().map_or(Library::embedded(), |library| library)
}

/// A `.coll` source and the name it is shown under.
pub struct Source {
    pub name: String,
    pub text: String,
}

/// Resolves `allreduce/ring` (or a user's `allreduce/my_ring`) to the library, anything else that exists to a file.
pub fn resolve(arg: &str) -> Result<Source, String> {
    if let Some(entry) = library().get(arg) {
        return Ok(Source { name: entry.shown_as(), text: entry.source.to_string() });
    }
    let path = Path::new(arg);
    if path.exists() {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read `{arg}`: {e}"))?;
        return Ok(Source { name: arg.to_string(), text });
    }
    let names: Vec<&str> = library().entries().iter().map(|e| e.name.as_str()).collect();
    let close = collc_compiler::diag::did_you_mean(arg, &names);
    let hint = if close.is_empty() {
        format!("library algorithms: {}", names.join(", "))
    } else {
        format!("did you mean: {}", close.join(", "))
    };
    Err(format!("`{arg}` is neither a library algorithm nor a file; {hint} (see `collc list`)"))
}

/// Whether `source` is a schedule file, which runs as it stands: a `.sched` file (`collc build --emit sched`) or
/// an MSCCL XML file (`collc import`).
pub fn is_schedule(source: &Source) -> bool {
    source.name.ends_with(".sched") || source.text.starts_with("collc-schedule ") || is_msccl(source)
}

/// Whether `source` is MSCCL XML.
pub fn is_msccl(source: &Source) -> bool {
    collc_compiler::msccl::is_msccl(&source.name, &source.text)
}

/// The rank count a schedule file is for (`None` when it does not read as one).
pub fn schedule_ranks(source: &Source) -> Option<u32> {
    match is_msccl(source) {
        true => collc_compiler::msccl::import(&source.text, &collc_compiler::Limits::default())
            .ok()
            .map(|i| i.schedule.n_ranks),
        false => collc_compiler::emit::parse_sched(&source.text).ok().map(|sched| sched.n_ranks),
    }
}

/// A schedule file's schedule (`.sched` or MSCCL XML), verified as `collc check` verifies it, its diagnostics at the
/// file's own lines, and where each instruction stands in the file.
pub fn verify_schedule(
    source: &Source,
    limits: &collc_compiler::Limits,
) -> Result<(collc_compiler::VerifiedSchedule, collc_compiler::emit::SchedLines), collc_compiler::Errors> {
    if is_msccl(source) {
        let imported = collc_compiler::msccl::import(&source.text, limits)?;
        return collc_compiler::msccl::verify(imported, &source.text, limits);
    }
    let (sched, lines) =
        collc_compiler::emit::parse_sched_located(&source.text).map_err(|e| collc_compiler::Errors(vec![e]))?;
    let verified = collc_compiler::verify_sched(sched, &source.text, &lines, limits)?;
    Ok((verified, lines))
}
