//! Embeds the algorithm library (`../algorithms/**/*.coll`) into the binary as `(name, source)` pairs.

use std::fmt::Write;
use std::path::Path;

fn collect(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).expect("algorithms/ is readable").flatten().collect();
    entries.sort_by_key(|e| e.path());
    for entry in entries {
        let path = entry.path();
        if path.is_dir() {
            collect(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "coll") {
            let name = path.strip_prefix(root).expect("under root").with_extension("");
            let name = name.to_string_lossy().replace('\\', "/");
            out.push((name, path.canonicalize().expect("exists").to_string_lossy().into_owned()));
        }
    }
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../algorithms");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut found = Vec::new();
    collect(&root, &root, &mut found);
    let mut code =
        String::from("/// The embedded algorithm library: (name, source).\npub static LIBRARY: &[(&str, &str)] = &[\n");
    for (name, path) in &found {
        println!("cargo:rerun-if-changed={path}");
        writeln!(code, "    ({name:?}, include_str!({path:?})),").expect("write to String");
    }
    code.push_str("];\n");
    let out = Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("library.rs");
    std::fs::write(out, code).expect("OUT_DIR is writable");
}
