//! Files of the repository the checks read: every file under a folder with
//! a given extension.

use std::path::{Path, PathBuf};

/// Appends every file under `dir` (recursively) whose extension is `ext`
/// to `out`, in directory order.
pub fn with_extension(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            with_extension(&path, ext, out);
        } else if path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
}
