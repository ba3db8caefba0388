//! What the suites share: the `.coll` files on disk and the pipeline run up to the unverified final schedule.

use collc_compiler::{
    compile_program, diag, lower, optimise, schedule, Bindings, Errors, Limits, Options, Placement, Schedule,
};
use std::path::{Path, PathBuf};

/// One `.coll` file: its name (`allreduce/ring`, `ok/tree`) and its text.
pub struct Source {
    pub name: String,
    pub text: String,
}

/// `tests/../algorithms`: the library colleagues keep adding to.
pub fn algorithms_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("algorithms")
}

/// `tests/fixtures/<kind>`.
pub fn fixtures_dir(kind: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(kind)
}

/// Every `*.coll` under `dir`, recursively, sorted by name; names are relative, without `.coll`, with `/`.
pub fn coll_files(dir: &Path) -> Vec<Source> {
    let mut paths = Vec::new();
    walk(dir, &mut paths);
    let mut sources: Vec<Source> = paths
        .into_iter()
        .map(|path| {
            let relative = path.strip_prefix(dir).expect("walk stays under dir").with_extension("");
            let name = relative.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/");
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            Source { name, text }
        })
        .collect();
    sources.sort_by(|a, b| a.name.cmp(&b.name));
    assert!(!sources.is_empty(), "no .coll files under {}", dir.display());
    sources
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("readable directory entry").path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "coll") {
            out.push(path);
        }
    }
}

/// Ranks per node for tests of an algorithm with a node split at `n_ranks`: the largest proper split
/// (p / its smallest prime factor, so 8 ranks are 2 nodes of 4 and a prime p is p nodes of 1).
pub fn test_split(n_ranks: u32) -> u32 {
    let smallest_factor = (2..=n_ranks).find(|f| n_ranks.is_multiple_of(*f)).unwrap_or(1);
    n_ranks / smallest_factor
}

/// `Bindings::ranks(n_ranks)`, with the node split of `test_split` when the algorithm declares one.
pub fn bindings(text: &str, n_ranks: u32) -> Bindings {
    let file = collc_grammar::parse(text, &Default::default()).expect("the library parses");
    Bindings::ranks(n_ranks).with_default_split(&file.algorithm, test_split(n_ranks))
}

/// The library: every `algorithms/**/*.coll`.
pub fn library() -> Vec<Source> {
    coll_files(&algorithms_dir())
}

/// Every error of a failed stage, rendered without colour against `file_name`, one after another.
pub fn render_all(errors: &Errors, file_name: &str, source: &str) -> String {
    errors.0.iter().map(|e| diag::render(e, file_name, source, true)).collect::<Vec<_>>().join("\n")
}

/// The schedule `compile` settles on, before verification: the verified one when the program verifies (so a fused
/// schedule that deadlocks is replaced as `compile_program` replaces it), else parse -> lower -> schedule -> fuse.
pub fn unverified(source: &str, bindings: &Bindings, placement: Placement) -> Result<Schedule, Errors> {
    let limits = Limits::default();
    let file =
        collc_grammar::parse(source, &limits.syntax).map_err(|e| Errors::from(collc_compiler::Error::from(e)))?;
    let program = lower(&file, bindings, &limits)?;
    if let Ok(verified) = compile_program(&program, source, Options::placed(placement), &limits) {
        return Ok(verified.into_schedule());
    }
    let mut sched = schedule(&program, placement);
    optimise::fuse(&mut sched);
    Ok(sched)
}
