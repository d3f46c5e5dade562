//! The one Prometheus text parser of the tests: samples with their labels.

use std::collections::BTreeMap;

/// One sample line: `name{label="value",…} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Every sample of a Prometheus text exposition (comments skipped).
/// Panics on a line it cannot read, so a format change fails loudly.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| sample(line).unwrap_or_else(|| panic!("not a Prometheus sample: {line:?}")))
        .collect()
}

fn sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_owned();
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices();
        let mut key = String::new();
        loop {
            let (index, c) = chars.next()?;
            match c {
                '}' => {
                    rest = &inner[index + 1..];
                    break;
                }
                ',' => {}
                '=' => {
                    if chars.next()?.1 != '"' {
                        return None;
                    }
                    let mut value = String::new();
                    loop {
                        match chars.next()?.1 {
                            '\\' => match chars.next()?.1 {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            '"' => break,
                            other => value.push(other),
                        }
                    }
                    labels.insert(std::mem::take(&mut key), value);
                }
                other => key.push(other),
            }
        }
    }
    // A value, optionally followed by a timestamp.
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        other => other.parse().ok()?,
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// The sum of the samples named `name` that carry every label in `labels`.
pub fn sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    parse(text)
        .into_iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}

/// Each counter of `series` (read into `before`, then `after`) moved by at
/// least one: the process's recorder is shared with other tests, so a test
/// judges deltas, never totals.
#[track_caller]
pub fn assert_each_grew<L: std::fmt::Debug>(series: &[L], before: &[f64], after: &[f64]) {
    for (index, labels) in series.iter().enumerate() {
        assert!(
            after[index] >= before[index] + 1.0,
            "{labels:?}: {} -> {}",
            before[index],
            after[index]
        );
    }
}

/// Whether a sample named `name` with every label in `labels` is present.
pub fn has(text: &str, name: &str, labels: &[(&str, &str)]) -> bool {
    parse(text).iter().any(|s| {
        s.name == name
            && labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
    })
}

#[test]
fn parses_names_labels_escapes_and_values() {
    let text = "# HELP x y\n# TYPE a counter\na 1\nb{k=\"v\",q=\"a\\\"b,c\"} 2.5\nc_bucket{le=\"+Inf\"} 3 1700000000\n";
    let samples = parse(text);
    assert_eq!(samples.len(), 3);
    assert_eq!((samples[0].name.as_str(), samples[0].value), ("a", 1.0));
    assert_eq!(samples[1].labels["q"], "a\"b,c");
    assert_eq!(sum(text, "b", &[("k", "v")]), 2.5);
    assert_eq!(sum(text, "b", &[("k", "w")]), 0.0);
    assert!(has(text, "c_bucket", &[("le", "+Inf")]));
}
