//! Snapshot tests of your own `.coll` algorithms. Each file says on a `# snapshot:` line what to build it for;
//! `schedules_text` compiles it for each rank count through `collc_compiler::build` and returns the verified
//! `.sched` texts, which `tests/snapshots.rs` hands to insta.
//!
//! The line: `# snapshot: ranks=4,8`, then optionally `root=R` and any `param` as `NAME=VALUE` (what
//! `collc build --root R --set NAME=VALUE` takes): `# snapshot: ranks=8,16 root=3 k=2`.

use collc_compiler::build::render_all;
use collc_compiler::emit::write_sched;
use collc_compiler::{build, BuildOptions};

/// What a file's `# snapshot:` line asks for.
#[derive(Debug)]
pub struct Snapshot {
    pub ranks: Vec<u32>,
    pub options: BuildOptions,
}

/// Reads the first `# snapshot:` line of `source`; the error names `file_name` and the form expected.
pub fn snapshot_line(file_name: &str, source: &str) -> Result<Snapshot, String> {
    let line = source
        .lines()
        .find_map(|line| line.trim().strip_prefix("# snapshot:"))
        .ok_or_else(|| format!("{file_name} has no `# snapshot: ranks=4,8` line saying what to build it for"))?;
    let mut snapshot = Snapshot { ranks: Vec::new(), options: BuildOptions::default() };
    for token in line.split_whitespace() {
        let (key, value) = token
            .split_once('=')
            .ok_or_else(|| format!("{file_name}: `{token}` in its `# snapshot:` line is not KEY=VALUE"))?;
        let number = |text: &str| {
            text.parse::<i64>()
                .map_err(|_| format!("{file_name}: `{text}` in `{token}` of its `# snapshot:` line is not an integer"))
        };
        match key {
            "ranks" => {
                for count in value.split(',') {
                    let count =
                        u32::try_from(number(count)?).map_err(|_| format!("{file_name}: `{token}`: no rank count"))?;
                    snapshot.ranks.push(count);
                }
            }
            "root" => {
                let root = u32::try_from(number(value)?).map_err(|_| format!("{file_name}: `{token}`: no rank"))?;
                snapshot.options.root = Some(root);
            }
            param => snapshot.options.params.push((param.to_string(), number(value)?)),
        }
    }
    if snapshot.ranks.is_empty() {
        return Err(format!("{file_name}: its `# snapshot:` line names no rank counts (`ranks=4,8`)"));
    }
    Ok(snapshot)
}

/// The verified `.sched` text of `source` at each rank count of its `# snapshot:` line, each headed `## ranks N`;
/// or the rendered diagnostics of the first rank count that does not compile or verify.
pub fn schedules_text(file_name: &str, source: &str) -> Result<String, String> {
    let snapshot = snapshot_line(file_name, source)?;
    let mut text = String::new();
    for &n_ranks in &snapshot.ranks {
        let verified = build(source, n_ranks, &snapshot.options)
            .map_err(|errors| format!("{file_name} at {n_ranks} ranks:\n{}", render_all(&errors, file_name, source)))?;
        text.push_str(&format!("## ranks {n_ranks}\n{}", write_sched(&verified, source)));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_snapshot_line_gives_ranks_root_and_params() {
        let snapshot = snapshot_line("a.coll", "## doc\n# snapshot: ranks=4,8 root=3 k=2\nalgorithm ...").unwrap();
        assert_eq!(snapshot.ranks, [4, 8]);
        assert_eq!(snapshot.options.root, Some(3));
        assert_eq!(snapshot.options.params, [("k".to_string(), 2)]);
    }

    #[test]
    fn a_missing_or_malformed_line_is_an_error_naming_the_file() {
        let missing = snapshot_line("a.coll", "algorithm ...").unwrap_err();
        assert!(missing.contains("a.coll has no `# snapshot: ranks=4,8` line"), "{missing}");
        let word = snapshot_line("b.coll", "# snapshot: ranks=4,eight").unwrap_err();
        assert!(word.contains("b.coll: `eight` in `ranks=4,eight`"), "{word}");
        assert!(snapshot_line("c.coll", "# snapshot: root=1").unwrap_err().contains("names no rank counts"));
        assert!(snapshot_line("d.coll", "# snapshot: ranks=-4").unwrap_err().contains("no rank count"));
    }

    #[test]
    fn a_failing_algorithm_gives_its_diagnostics() {
        let source = "# snapshot: ranks=2\nalgorithm bad for allreduce {\n  ranks p\n  chunks 1\n}\n";
        let message = schedules_text("bad.coll", source).unwrap_err();
        assert!(message.starts_with("bad.coll at 2 ranks:\n"), "{message}");
        assert!(message.contains("collc::verify::postcondition"), "{message}");
    }
}
