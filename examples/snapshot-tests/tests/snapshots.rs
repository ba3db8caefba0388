//! Every `algorithms/*.coll` built at the rank counts of its `# snapshot:` line: the verified `.sched` texts are
//! insta snapshots in `tests/snapshots/`, so a change in what an algorithm compiles to fails here until reviewed
//! (`cargo insta review`). A new algorithm is a new file.

#[test]
fn schedules_match_snapshots() {
    insta::glob!("../algorithms", "*.coll", |path| {
        let source = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        let text = collc_snapshot_tests::schedules_text(&name, &source).unwrap_or_else(|message| panic!("{message}"));
        insta::assert_snapshot!(text);
    });
}
