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

/// A fenced block of a Markdown file: its language tag (`sh`, `text`, …),
/// the line its body starts on (1-based) and the body.
pub struct FencedBlock {
    pub lang: String,
    pub line: usize,
    pub body: String,
}

/// Every fenced block of `markdown`, in order.
pub fn fenced_blocks(markdown: &str) -> Vec<FencedBlock> {
    let mut blocks = Vec::new();
    let mut open: Option<FencedBlock> = None;
    for (index, line) in markdown.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(lang)) => {
                open = Some(FencedBlock {
                    lang: lang.trim().to_owned(),
                    line: index + 2,
                    body: String::new(),
                })
            }
            (Some(_), Some("")) => blocks.push(open.take().unwrap()),
            (Some(block), _) => {
                block.body.push_str(line);
                block.body.push('\n');
            }
            (None, None) => {}
        }
    }
    blocks
}

/// The body of the first block of `markdown` tagged `lang` whose body
/// starts with `starts`, and the block that follows it (its shown output,
/// where the page gives one).
#[track_caller]
pub fn block_and_next(markdown: &str, lang: &str, starts: &str) -> (String, Option<String>) {
    let blocks = fenced_blocks(markdown);
    let at = blocks
        .iter()
        .position(|b| b.lang == lang && b.body.starts_with(starts))
        .unwrap_or_else(|| panic!("no ```{lang} block starting {starts:?}"));
    (
        blocks[at].body.clone(),
        blocks.get(at + 1).map(|b| b.body.clone()),
    )
}

/// Whether `lang` marks a block of shell commands.
pub fn is_shell(lang: &str) -> bool {
    matches!(lang, "sh" | "bash" | "shell" | "console")
}
