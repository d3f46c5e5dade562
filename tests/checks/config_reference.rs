//! `docs/configuration.md` lists exactly the fields the parser accepts.
//!
//! The parser itself says which fields it accepts: every file type is
//! parsed with unknown fields refused, and serde's refusal of an unknown
//! field names all the expected ones. Each `<!-- fields: NAME -->` table of
//! the reference must list exactly those.
//!
//! Every relative link of the repository's own documentation (`README.md`,
//! `docs/`, `bench/results/`) resolves: to a file or directory that exists
//! and, for `#anchor` links into Markdown files, to one of its headings.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use leasegate::adapter::RawAdapter;
use leasegate::config::RawConfig;
use leasegate::policy::RawPolicy;

const PROBE: &str = "zz_not_a_field";

/// The fields serde expects, from its "unknown field" refusal of `text`.
fn accepted<T: serde::de::DeserializeOwned>(text: &str) -> BTreeSet<String> {
    let error = match toml::from_str::<T>(text) {
        Ok(_) => panic!("{text:?} was accepted"),
        Err(error) => error.to_string(),
    };
    assert!(
        error.contains(&format!("unknown field `{PROBE}`")),
        "{text:?}: {error}"
    );
    let expected = error
        .split("expected one of ")
        .nth(1)
        .or_else(|| error.split("expected ").nth(1))
        .unwrap_or_else(|| panic!("no expected fields in {error}"));
    // "`a`, `b`, `c`", "`a` or `b`", or "`a`": every quoted name.
    let expected = expected.lines().next().unwrap_or(expected);
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The first column of the table after `<!-- fields: name -->`.
fn documented(reference: &str, name: &str) -> BTreeSet<String> {
    let marker = format!("<!-- fields: {name} -->");
    let start = reference
        .find(&marker)
        .unwrap_or_else(|| panic!("docs/configuration.md has no {marker}"));
    reference[start + marker.len()..]
        .lines()
        .skip_while(|line| line.trim().is_empty())
        .take_while(|line| line.starts_with('|'))
        .skip(2)
        .filter_map(|line| line.split('`').nth(1))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_configuration_reference_lists_exactly_the_accepted_fields() {
    let reference = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/configuration.md"
    ))
    .unwrap();
    let with_transport = |mut fields: BTreeSet<String>| {
        // The tag is read before the variant's fields.
        fields.insert("transport".to_owned());
        fields
    };
    // The config's tables: the probe key as a key of the table.
    let in_table = |table: &str| accepted::<RawConfig>(&format!("[{table}]\n{PROBE} = 1"));
    let cases = [
        ("config", accepted::<RawConfig>(&format!("{PROBE} = 1"))),
        ("session", in_table("session")),
        ("idempotency", in_table("idempotency")),
        ("auth", in_table("auth")),
        ("jwt", in_table("auth.jwt")),
        ("limits", in_table("limits")),
        ("telemetry", in_table("telemetry")),
        (
            "stdio",
            with_transport(accepted::<RawConfig>(&format!(
                "[upstreams.a]\ntransport = \"stdio\"\ncommand = \"x\"\n{PROBE} = 1"
            ))),
        ),
        (
            "streamable_http",
            with_transport(accepted::<RawConfig>(&format!(
                "[upstreams.a]\ntransport = \"streamable_http\"\nurl = \"http://x\"\n{PROBE} = 1"
            ))),
        ),
        (
            "adapter",
            accepted::<RawAdapter>(&format!("upstream = \"a\"\n{PROBE} = 1")),
        ),
        (
            "tool",
            accepted::<RawAdapter>(&format!("upstream = \"a\"\n[tools.t]\n{PROBE} = 1")),
        ),
        (
            "not_done",
            accepted::<RawAdapter>(&format!(
                "upstream = \"a\"\n[tools.t]\nnot_done_errors = [{{ {PROBE} = 1 }}]"
            )),
        ),
        ("policy", accepted::<RawPolicy>(&format!("{PROBE} = 1"))),
    ];
    for (name, parsed) in cases {
        assert!(!parsed.is_empty(), "{name}: {parsed:?}");
        let written = documented(&reference, name);
        let missing: Vec<_> = parsed.difference(&written).collect();
        let stale: Vec<_> = written.difference(&parsed).collect();
        assert!(
            missing.is_empty() && stale.is_empty(),
            "docs/configuration.md, table {name}: not documented {missing:?}, not accepted {stale:?}"
        );
    }
}

/// The Markdown files whose links are checked.
fn documentation() -> Vec<PathBuf> {
    fn markdown_under(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                markdown_under(&path, out);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                out.push(path);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    markdown_under(&root.join("docs"), &mut files);
    markdown_under(&root.join("bench/results"), &mut files);
    files.sort();
    files
}

/// The lines of `text` outside fenced code blocks.
fn prose_lines(text: &str) -> Vec<&str> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            lines.push(line);
        }
    }
    lines
}

/// The anchors GitHub gives the headings of `text`: the heading's text in
/// lower case, spaces turned into `-`, every other character that is not
/// alphanumeric, `-` or `_` dropped; a repeated anchor gets `-1`, `-2`, ….
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for line in prose_lines(text) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let title = line[hashes..].trim().trim_end_matches('#').trim();
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                '-' | '_' => Some(c),
                c if c.is_alphanumeric() => Some(c),
                _ => None,
            })
            .collect();
        let mut anchor = slug.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{slug}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// The targets of the inline links and images of `text` (`[text](target)`,
/// `![alt](target)`), outside code blocks and code spans.
fn link_targets(text: &str) -> Vec<String> {
    let prose = prose_lines(text).join("\n");
    // Code spans may wrap lines; outside fences backticks come in pairs.
    let outside_code: String = prose.split('`').step_by(2).collect::<Vec<_>>().join(" ");
    let mut targets = Vec::new();
    let mut rest = outside_code.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find(')').unwrap_or(after.len());
        let target = after[..end].trim();
        // `(path "title")` and `(<path>)`.
        let target = target.split_whitespace().next().unwrap_or("");
        targets.push(
            target
                .trim_start_matches('<')
                .trim_end_matches('>')
                .to_owned(),
        );
        rest = &after[end..];
    }
    targets
}

/// Every relative link in the README, `docs/` and `bench/results/` names a
/// file or directory that exists, and an anchor into a Markdown file names
/// one of its headings.
#[test]
fn every_relative_link_in_the_documentation_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut checked = 0;
    let mut dangling = Vec::new();
    for file in documentation() {
        let text = std::fs::read_to_string(&file).unwrap();
        let shown = file.strip_prefix(root).unwrap().display().to_string();
        for target in link_targets(&text) {
            if target.is_empty() {
                dangling.push(format!("{shown}: an empty link"));
                continue;
            }
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            if !resolved.exists() {
                dangling.push(format!("{shown}: {target}: no such file"));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if resolved.extension().is_none_or(|ext| ext != "md") {
                continue;
            }
            let headings = anchors(&std::fs::read_to_string(&resolved).unwrap());
            if !headings.contains(anchor) {
                dangling.push(format!("{shown}: {target}: no heading with that anchor"));
            }
        }
    }
    assert!(
        checked > 0,
        "no relative link found: the link reader is broken"
    );
    assert!(
        dangling.is_empty(),
        "dangling links:\n{}",
        dangling.join("\n")
    );
}

#[test]
fn the_link_reader_reads_links_anchors_and_skips_code() {
    let text = "# Top\n\n## A `[b.c]` (d) & e\n\n## Top\n\nsee [x](a.md#top) and ![i](p.png),\n`[not](code.md)` and [`[auth]`](configuration.md#auth)\n\n```sh\n[no](fence.md)\n# not a heading\n```\n";
    assert_eq!(
        link_targets(text),
        ["a.md#top", "p.png", "configuration.md#auth"]
    );
    assert_eq!(
        anchors(text),
        ["a-bc-d--e", "top", "top-1"]
            .into_iter()
            .map(str::to_owned)
            .collect::<BTreeSet<_>>()
    );
}
