//! The snippets of `docs/clients.md` for the clients the suite drives
//! (fastmcp, pydantic-ai, the Vercel AI SDK) are the lines the suite runs:
//! each fenced block of those sections appears, line by line (indentation
//! aside), in `tests/sdk/agent_clients.py` or `tests/sdk/vercel.mjs`.

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The fenced code blocks (language, lines) of the section headed `heading`.
fn blocks(page: &str, heading: &str) -> Vec<(String, Vec<String>)> {
    let section = page
        .split("\n## ")
        .find(|s| s.starts_with(heading))
        .unwrap_or_else(|| panic!("docs/clients.md has a section {heading:?}"));
    let mut found = Vec::new();
    let mut open: Option<(String, Vec<String>)> = None;
    for line in section.lines() {
        match (open.take(), line.strip_prefix("```")) {
            (None, Some(language)) => open = Some((language.to_owned(), Vec::new())),
            (Some(block), Some(_)) => found.push(block),
            (Some((language, mut lines)), None) => {
                lines.push(line.to_owned());
                open = Some((language, lines));
            }
            (None, None) => {}
        }
    }
    found
}

/// Whether `script` holds `snippet`'s non-empty lines consecutively (each
/// compared without its indentation, as a snippet is dedented).
fn holds(script: &str, snippet: &[String]) -> bool {
    let wanted: Vec<&str> = snippet
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .collect();
    let have: Vec<&str> = script
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    have.windows(wanted.len()).any(|window| window == wanted)
}

#[test]
fn the_client_snippets_in_the_docs_are_the_lines_the_suite_runs() {
    let page = std::fs::read_to_string(format!("{ROOT}/docs/clients.md")).unwrap();
    let agents = std::fs::read_to_string(format!("{ROOT}/tests/sdk/agent_clients.py")).unwrap();
    let vercel = std::fs::read_to_string(format!("{ROOT}/tests/sdk/vercel.mjs")).unwrap();
    for heading in ["fastmcp", "pydantic-ai", "Vercel AI SDK"] {
        let found = blocks(&page, heading);
        assert!(!found.is_empty(), "{heading}: no snippet");
        for (language, lines) in found {
            let script = match language.as_str() {
                "python" => &agents,
                "js" => &vercel,
                other => panic!("{heading}: a {other:?} snippet no script runs"),
            };
            assert!(
                holds(script, &lines),
                "{heading}: this snippet is not what the suite runs:\n{}",
                lines.join("\n")
            );
        }
    }
}
