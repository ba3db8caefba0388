//! The importer and exporters against the real corpus (tests/fixtures/msccl) and the library.

use super::*;

fn fixture(path: &str) -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/msccl/");
    std::fs::read_to_string(format!("{root}{path}")).expect("the fixture is there")
}
