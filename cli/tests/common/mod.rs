//! What the CLI test binaries share: files in the temp dir that are removed when the test is done with them.

use std::path::PathBuf;

/// A path in the temp dir, unique to this test process and `name`; the file is removed on drop, also when the
/// test fails.
pub struct TempFile(PathBuf);

impl TempFile {
    /// A path for the binary under test to write.
    pub fn named(name: &str) -> Self {
        TempFile(std::env::temp_dir().join(format!("collc-test-{}-{name}", std::process::id())))
    }

    /// A file holding `contents`.
    pub fn with(name: &str, contents: &str) -> Self {
        let file = TempFile::named(name);
        std::fs::write(&file.0, contents).expect("temp dir is writable");
        file
    }

    pub fn path(&self) -> &str {
        self.0.to_str().expect("utf-8 temp path")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        // Absent when the binary under test failed before writing it.
        let _ = std::fs::remove_file(&self.0);
    }
}
