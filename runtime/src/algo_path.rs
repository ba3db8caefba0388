//! Users' own algorithms: the `.coll` files in the folders (searched recursively) or files that `COLLC_ALGO_PATH`
//! names, `:`-separated as `PATH` is, joined to the embedded library (`Library::with_files`) so that selection,
//! `--compare`, `--algo` and `collc tune` take them like the library's. Each is verified where it is costed, before
//! its first call. A path is read once per process (its files are not read again if they change); an entry that
//! does not exist, a file that does not parse or takes a taken name is an error naming it, never skipped.

use crate::error::RuntimeError;
use collc_compiler::library::{FileError, Library};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The variable naming users' algorithm folders.
pub const VAR: &str = "COLLC_ALGO_PATH";

/// Why a path's library could not be made.
#[derive(Debug)]
pub enum LoadError {
    /// An entry that is missing or unreadable: what and why.
    Io(String),
    /// Files that do not join the library, each with its diagnostic.
    Files(Vec<FileError>),
}

impl LoadError {
    /// One line per problem, each naming the file (and line) and what is wrong.
    pub fn describe(&self) -> String {
        match self {
            LoadError::Io(message) => message.clone(),
            LoadError::Files(errors) => errors.iter().map(FileError::one_line).collect::<Vec<_>>().join("; "),
        }
    }
}

impl From<LoadError> for RuntimeError {
    fn from(error: LoadError) -> Self {
        RuntimeError::Config(format!("{VAR}: {}", error.describe()))
    }
}

/// The library `COLLC_ALGO_PATH` makes: the embedded one alone when it is unset or empty.
pub fn library() -> Result<Arc<Library>, LoadError> {
    load(&std::env::var(VAR).unwrap_or_default())
}

/// The embedded library and the algorithms of `path` (`:`-separated folders or `.coll` files; an entry given twice,
/// however spelt, is read once).
pub fn load(path: &str) -> Result<Arc<Library>, LoadError> {
    static LOADED: Mutex<Option<HashMap<String, Arc<Library>>>> = Mutex::new(None);
    if let Some(found) = LOADED.lock().ok().and_then(|cache| cache.as_ref()?.get(path).cloned()) {
        return Ok(found);
    }
    let mut seen: Vec<PathBuf> = Vec::new();
    let mut files = Vec::new();
    for entry in path.split(':').filter(|e| !e.is_empty()) {
        let canonical = std::fs::canonicalize(entry)
            .map_err(|e| LoadError::Io(format!("`{entry}` cannot be read: {e} (a folder of .coll files, or one)")))?;
        if seen.contains(&canonical) {
            continue;
        }
        seen.push(canonical);
        collect(Path::new(entry), &mut files)?;
    }
    let library = match files.is_empty() {
        true => Library::embedded().clone(),
        false => Library::with_files(files, &collc_compiler::Limits::default()).map_err(LoadError::Files)?,
    };
    let library = Arc::new(library);
    if let Ok(mut cache) = LOADED.lock() {
        cache.get_or_insert_with(HashMap::new).insert(path.to_string(), library.clone());
    }
    Ok(library)
}

/// `entry`'s `.coll` files (itself, if it is a file), in name order, with their text.
fn collect(entry: &Path, files: &mut Vec<(String, String)>) -> Result<(), LoadError> {
    let unreadable = |e: std::io::Error| LoadError::Io(format!("`{}` cannot be read: {e}", entry.display()));
    if !entry.is_dir() {
        if entry.extension().is_none_or(|e| e != "coll") {
            return Err(LoadError::Io(format!(
                "`{}` is neither a folder nor a .coll file (the path lists folders of .coll files, or files)",
                entry.display()
            )));
        }
        files.push((entry.display().to_string(), std::fs::read_to_string(entry).map_err(unreadable)?));
        return Ok(());
    }
    let mut inside: Vec<PathBuf> = std::fs::read_dir(entry)
        .map_err(unreadable)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(unreadable)?;
    inside.sort();
    for path in inside {
        if path.is_dir() || path.extension().is_some_and(|e| e == "coll") {
            collect(&path, files)?;
        }
    }
    Ok(())
}

/// One line saying which users' algorithms a library has, for reports and for comparing ranks: `none`, or their
/// names and the digest of their sources.
pub fn summary(library: &Library) -> String {
    let names: Vec<&str> = library.user_entries().map(|e| e.name.as_str()).collect();
    match names.is_empty() {
        true => "no users' algorithms".into(),
        false => format!("{} ({:016x})", names.join(", "), library.user_digest()),
    }
}
