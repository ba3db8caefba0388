//! What the CLI test binaries share: files and folders in the temp dir that are removed when the test is done with
//! them.
// Each test binary uses part of this.
#![allow(dead_code)]

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

/// A folder in the temp dir, unique to this test process and `name`, removed with all it holds on drop (also when
/// the test fails).
pub struct TempDir(PathBuf);

impl TempDir {
    /// A fresh, empty folder.
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("collc-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir is writable");
        TempDir(dir)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
