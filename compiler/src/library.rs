//! The algorithm library: the `algorithms/**/*.coll` files embedded at build time, each collective's default
//! algorithm, and a `Library` that adds users' own `.coll` files to them (read by the runtime or the CLI from
//! `COLLC_ALGO_PATH` or `--library`; the compiler does no I/O).

use crate::diag::Error;
use crate::Collective;
use std::sync::{Arc, OnceLock};

include!(concat!(env!("OUT_DIR"), "/library.rs"));

/// The source of embedded library algorithm `name` (`allreduce/ring`).
pub fn get(name: &str) -> Option<&'static str> {
    LIBRARY.iter().find(|(n, _)| *n == name).map(|(_, text)| *text)
}

/// What runs when a call names no algorithm: the ring where there is one, as NCCL's default.
pub fn default_for(collective: Collective) -> &'static str {
    match collective {
        Collective::AllReduce => "allreduce/ring",
        Collective::ReduceScatter => "reducescatter/ring",
        Collective::AllGather => "allgather/ring",
        Collective::Broadcast => "broadcast/binomial",
        Collective::Reduce => "reduce/binomial",
        Collective::Gather => "gather/linear",
        Collective::Scatter => "scatter/linear",
        Collective::AllToAll => "alltoall/pairwise",
        Collective::SendRecv => "sendrecv/direct",
    }
}

/// One algorithm of a `Library`: its name (`allreduce/ring`: the collective and the name its header declares),
/// its source, and the file it was read from (`None`: embedded).
#[derive(Clone, Debug)]
pub struct Entry {
    pub name: String,
    pub source: Arc<str>,
    pub file: Option<String>,
}

impl Entry {
    /// The name without its collective (`ring`).
    pub fn short_name(&self) -> &str {
        self.name.split_once('/').map_or(self.name.as_str(), |(_, name)| name)
    }

    /// Where its diagnostics point: the file it was read from, else `allreduce/ring.coll`.
    pub fn shown_as(&self) -> String {
        self.file.clone().unwrap_or_else(|| format!("{}.coll", self.name))
    }
}

/// The algorithms `collc list`, `tune`, `--compare` and a runtime's selection know: the embedded library, then users'
/// own files. A user's algorithm is named by its header (`algorithm my_ring for allreduce` is `allreduce/my_ring`);
/// it may not take a name the library or another file has.
#[derive(Clone, Debug)]
pub struct Library {
    entries: Vec<Entry>,
}

/// A user's file that cannot join a library: the file, its text and why (a diagnostic into the text).
#[derive(Clone, Debug)]
pub struct FileError {
    pub file: String,
    pub source: String,
    pub error: Error,
}

impl FileError {
    /// `file:line: message (help)`, for logs and errors that cannot render the source.
    pub fn one_line(&self) -> String {
        let line = self.error.primary_span().map(|s| crate::diag::line_at(&self.source, s.start as usize));
        let at = line.map_or(String::new(), |l| format!(":{l}"));
        format!("{}{at}: {} ({})", self.file, self.error.message, self.error.help)
    }
}

impl Library {
    /// The embedded library alone.
    pub fn embedded() -> &'static Library {
        static EMBEDDED: OnceLock<Library> = OnceLock::new();
        EMBEDDED.get_or_init(|| Library {
            entries: LIBRARY
                .iter()
                .map(|(name, text)| Entry { name: name.to_string(), source: Arc::from(*text), file: None })
                .collect(),
        })
    }

    /// The embedded library and `files` (path, text), in order. Every file that does not parse, declares an unknown
    /// collective or takes a name already taken is an error (all of them, in order); none is skipped.
    pub fn with_files(files: Vec<(String, String)>, limits: &crate::Limits) -> Result<Library, Vec<FileError>> {
        let mut library = Library::embedded().clone();
        let mut errors = Vec::new();
        for (file, text) in files {
            match library.entry_for(&file, &text, limits) {
                Ok(entry) => library.entries.push(entry),
                Err(error) => errors.push(FileError { file, source: text, error }),
            }
        }
        match errors.is_empty() {
            true => Ok(library),
            false => Err(errors),
        }
    }

    fn entry_for(&self, file: &str, text: &str, limits: &crate::Limits) -> Result<Entry, Error> {
        let ast = collc_grammar::parse(text, &limits.syntax).map_err(Error::from)?;
        let (name, collective) = (&ast.algorithm.name, &ast.algorithm.collective);
        let parsed: Collective = collective.name.parse().map_err(|e: String| {
            Error::new("collc::library::collective", e, "name one of the nine collectives after `for`")
                .at(collective.span, "not a collective")
        })?;
        let full = format!("{}/{}", parsed.name(), name.name);
        if let Some(taken) = self.get(&full) {
            let by = match &taken.file {
                Some(other) => format!("{other} defines it too"),
                None => "the embedded library has it".to_string(),
            };
            return Err(Error::new(
                "collc::library::duplicate",
                format!("`{full}` is taken: {by}"),
                format!("rename the algorithm in {file} (`algorithm NEW_NAME for {}`)", parsed.name()),
            )
            .at(name.span, "this name"));
        }
        Ok(Entry { name: full, source: Arc::from(text), file: Some(file.to_string()) })
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The algorithm named `name` (`allreduce/ring`; the collective part case-insensitive as everywhere).
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.name.eq_ignore_ascii_case(name))
    }

    /// The names of `collective`'s algorithms without the collective (`ring`), the embedded ones first.
    pub fn names(&self, collective: Collective) -> Vec<&str> {
        let prefix = format!("{collective}/");
        self.entries.iter().filter_map(|e| e.name.strip_prefix(prefix.as_str())).collect()
    }

    /// The users' algorithms (those read from files).
    pub fn user_entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().filter(|e| e.file.is_some())
    }

    /// A hash of the users' algorithms (names and sources; 0 for none): ranks of one job compare it.
    pub fn user_digest(&self) -> u64 {
        if self.user_entries().next().is_none() {
            return 0;
        }
        let mut hash = crate::fxhash::FxHasher::default();
        for entry in self.user_entries() {
            std::hash::Hash::hash(&entry.name, &mut hash);
            std::hash::Hash::hash(&*entry.source, &mut hash);
        }
        std::hash::Hasher::finish(&hash)
    }
}

#[cfg(test)]
mod tests {
    use super::Library;
    use crate::Collective;

    fn limits() -> crate::Limits {
        crate::Limits::default()
    }

    /// A user's file joins under the name its header declares; a file that takes a library name, repeats another
    /// file's, does not parse or names no collective is an error naming the file, every one of them.
    #[test]
    fn users_files_join_by_their_headers_name_and_clashes_are_errors() {
        let ring = super::get("allreduce/ring").expect("embedded");
        let mine = ring.replace("algorithm ring for", "algorithm my_ring for");
        let library = Library::with_files(vec![("a/mine.coll".into(), mine.clone())], &limits()).expect("joins");
        assert!(library.names(Collective::AllReduce).contains(&"my_ring"));
        assert_eq!(library.get("allreduce/my_ring").and_then(|e| e.file.as_deref()), Some("a/mine.coll"));
        assert_ne!(library.user_digest(), 0);
        assert_eq!(Library::embedded().user_digest(), 0);
        let errors = Library::with_files(
            vec![
                ("a/ring.coll".into(), ring.to_string()),
                ("a/mine.coll".into(), mine.clone()),
                ("b/mine.coll".into(), mine),
                ("b/bad.coll".into(), "algorithm x for allreduce {".into()),
                ("b/what.coll".into(), ring.replace("for allreduce", "for allreduced")),
            ],
            &limits(),
        )
        .expect_err("four bad files");
        let lines: Vec<String> = errors.iter().map(|e| e.one_line()).collect();
        assert_eq!(errors.len(), 4, "{lines:#?}");
        assert!(lines[0].starts_with("a/ring.coll:3: `allreduce/ring` is taken: the embedded library"), "{lines:#?}");
        assert!(lines[1].starts_with("b/mine.coll:3: `allreduce/my_ring` is taken: a/mine.coll defines it"));
        assert!(lines[2].starts_with("b/bad.coll:1"), "{lines:#?}");
        assert!(lines[3].contains("unknown collective `allreduced`") && lines[3].contains("allreduce"), "{lines:#?}");
    }
}
