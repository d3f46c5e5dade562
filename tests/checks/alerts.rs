//! Dashboards and alerts (`deploy/`): the Prometheus rules pass
//! `promtool check rules` and their unit tests (`promtool test rules`), and
//! every metric the rules and the Grafana dashboard name is one leasegate
//! exports — the metrics registered in `src/` (every `counter!`, `gauge!`,
//! `histogram!`), checked against what a running proxy serves on
//! `/metrics` after a gated call.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use common::proxy::{RunningProxy, Scenario, ServedChild, connect_http};
use common::{TestDb, http, wait_until};
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every metric `src/` registers, by name: the first string literal of each
/// `counter!(`, `gauge!(`, `histogram!(`. A name that is not a literal
/// fails here, so the list cannot silently miss one.
fn registered() -> BTreeMap<String, Kind> {
    let mut files = Vec::new();
    crate::common::files::with_extension(&root().join("src"), "rs", &mut files);
    let mut metrics = BTreeMap::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (macro_name, kind) in [
            ("counter!(", Kind::Counter),
            ("gauge!(", Kind::Gauge),
            ("histogram!(", Kind::Histogram),
        ] {
            for (at, _) in text.match_indices(macro_name) {
                let rest = text[at + macro_name.len()..].trim_start();
                let name = rest
                    .strip_prefix('"')
                    .and_then(|r| r.split('"').next())
                    .unwrap_or_else(|| {
                        panic!(
                            "{}: {macro_name} without a literal name: {}",
                            file.display(),
                            &rest[..rest.len().min(60)]
                        )
                    });
                if let Some(other) = metrics.insert(name.to_owned(), kind) {
                    assert_eq!(other, kind, "{name} registered as two kinds");
                }
            }
        }
    }
    assert!(metrics.len() > 20, "found the metrics: {metrics:?}");
    metrics
}

/// The series names Prometheus sees: histograms as `_bucket`, `_sum`, `_count`.
fn exported(registered: &BTreeMap<String, Kind>) -> BTreeSet<String> {
    registered
        .iter()
        .flat_map(|(name, kind)| match kind {
            Kind::Histogram => vec![
                format!("{name}_bucket"),
                format!("{name}_sum"),
                format!("{name}_count"),
            ],
            _ => vec![name.clone()],
        })
        .collect()
}

/// The PromQL modifiers that take a label list in parentheses.
const LABEL_LIST_MODIFIERS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// PromQL words that are not metric names (the label-list modifiers
/// aside).
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    // Aggregations, which may come before `by (…)` rather than `(`.
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
];

/// The metric names a PromQL expression selects: identifiers that are not
/// functions or aggregations (followed by `(`), keywords, label names in
/// `{…}` or `by (…)`, strings, durations in `[…]`, or numbers.
fn metric_names(expr: &str) -> Vec<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = Vec::new();
    let mut i = 0;
    let skip_to = |i: usize, close: char| {
        let mut j = i + 1;
        while j < chars.len() && chars[j] != close {
            if chars[j] == '"' {
                j += 1;
                while j < chars.len() && chars[j] != '"' {
                    j += 1;
                }
            }
            j += 1;
        }
        j + 1
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' {
            let mut j = i + 1;
            while j < chars.len() && chars[j] != c {
                j += 1;
            }
            i = j + 1;
        } else if c == '{' {
            i = skip_to(i, '}');
        } else if c == '[' {
            i = skip_to(i, ']');
        } else if c.is_ascii_digit() || c == '$' {
            // numbers (1e3, 0.5) and Grafana variables
            i += 1;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "._".contains(chars[i])) {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "_:".contains(chars[i])) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next] == ' ' {
                next += 1;
            }
            let before_paren = chars.get(next) == Some(&'(');
            if LABEL_LIST_MODIFIERS.contains(&word.as_str()) {
                if before_paren {
                    i = skip_to(next, ')');
                }
            } else if !before_paren
                && !KEYWORDS.contains(&word.to_lowercase().as_str())
                && !LABEL_LIST_MODIFIERS.contains(&word.to_lowercase().as_str())
            {
                names.push(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn the_expression_reader_finds_metrics_and_nothing_else() {
    assert_eq!(
        metric_names(
            r#"sum by (le, upstream) (rate(a_bucket{x=~"$i", y="b c"}[$__rate_interval])) > 3 * on(z) b and c_total offset 5m"#
        ),
        ["a_bucket", "b", "c_total"]
    );
    assert_eq!(metric_names("max(x) > 15 * 60"), ["x"]);
}

/// Every expression of the rules file: (alert, expr).
fn rule_expressions() -> Vec<(String, String)> {
    // The rules are YAML; their `expr:` values are single lines or `>-`
    // blocks, read without a YAML parser.
    let text = std::fs::read_to_string(root().join("deploy/prometheus/alerts.yml")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut exprs = Vec::new();
    let mut alert = String::new();
    for (n, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        if let Some(name) = trimmed.strip_prefix("- alert: ") {
            alert = name.trim().to_owned();
        }
        if let Some(expr) = trimmed.strip_prefix("expr: ") {
            let expr = if expr.trim() == ">-" {
                let indent = lines[n + 1].len() - lines[n + 1].trim_start().len();
                lines[n + 1..]
                    .iter()
                    .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() >= indent)
                    .map(|l| l.trim())
                    .collect::<Vec<_>>()
                    .join(" ")
            } else {
                expr.to_owned()
            };
            exprs.push((alert.clone(), expr));
        }
    }
    exprs
}

/// Every expression of the dashboard: (panel title, expr), the template
/// variables' queries included.
fn dashboard_expressions() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join("deploy/grafana/leasegate.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    let mut ids = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        assert!(
            ids.insert(panel["id"].as_u64().unwrap()),
            "panel ids are unique"
        );
        if panel["type"] == "row" {
            continue;
        }
        let title = panel["title"].as_str().unwrap().to_owned();
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title} has a query");
        for target in targets {
            exprs.push((title.clone(), target["expr"].as_str().unwrap().to_owned()));
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(query) = variable["query"]
            .as_str()
            .and_then(|q| q.strip_prefix("label_values("))
        {
            let metric = query.split(',').next().unwrap();
            exprs.push((format!("variable {}", variable["name"]), metric.to_owned()));
        }
    }
    exprs
}

#[test]
fn every_metric_the_rules_and_the_dashboard_use_is_one_leasegate_exports() {
    let exported = exported(&registered());
    let mut unknown = Vec::new();
    let mut used = BTreeSet::new();
    let rules = rule_expressions();
    assert_eq!(
        rules
            .iter()
            .map(|(a, _)| a.as_str())
            .collect::<BTreeSet<_>>()
            .len(),
        7,
        "the seven alerts: {rules:?}"
    );
    for (place, expr) in rules.into_iter().chain(dashboard_expressions()) {
        let names = metric_names(&expr);
        assert!(!names.is_empty(), "{place}: no metric in {expr}");
        for name in names {
            if !exported.contains(&name) {
                unknown.push(format!("{place}: {name}"));
            }
            used.insert(name);
        }
    }
    assert!(
        unknown.is_empty(),
        "not exported by leasegate (src/ registers {exported:?}):\n{}",
        unknown.join("\n")
    );
    // The alerts the operators asked for have their metrics.
    for needed in [
        "tool_operation_unknown_oldest_age_seconds",
        "tool_operation_needs_operator_total",
        "lease_acquire_total",
        "upstream_up",
        "leasegate_ledger_up",
        "leasegate_durability_ok",
    ] {
        assert!(used.contains(needed), "{needed} is used");
    }
}

fn promtool(args: &[&str]) -> (bool, String) {
    let output = Command::new("promtool")
        .args(args)
        .current_dir(root().join("deploy/prometheus"))
        .output()
        .unwrap_or_else(|e| {
            panic!("promtool (Debian package `prometheus`; .ci/run installs it) does not run: {e}")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[test]
fn the_alerting_rules_pass_promtool_and_their_unit_tests() {
    let (ok, text) = promtool(&["check", "rules", "alerts.yml"]);
    assert!(ok, "{text}");
    assert!(text.contains("SUCCESS: 7 rules found"), "{text}");
    let (ok, text) = promtool(&["test", "rules", "alerts_test.yml"]);
    assert!(ok, "{text}");
}

/// The registry read from `src/` is what a running proxy serves: every
/// family on `/metrics` after a gated call is in it (so a metric named in a
/// way the reader misses would fail here), and the alerts' gauges are there.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_running_proxy_serves_the_registered_metrics(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let registered = registered();
    let exported = exported(&registered);
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, "reconcile_interval = \"200ms\"\n");
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    let (lease, _) = db.running_run("agent-1", 60_000).await;
    let (agent, _) = connect_http(&proxy.url, Some(&lease)).await;
    common::proxy::charge_eur(&agent, 100, None).await.unwrap();
    let metrics_url = format!("{}/metrics", proxy.control_url);
    let text = wait_until("the reconciler's gauges on /metrics", || async {
        let text = http::get(&metrics_url).await.body;
        (text.contains("tool_operation_unknown_oldest_age_seconds")
            && text.contains("leasegate_ledger_up"))
        .then_some(text)
    })
    .await;
    let served: BTreeSet<String> = common::prometheus::parse(&text)
        .into_iter()
        .map(|sample| sample.name)
        .collect();
    let strays: Vec<_> = served.difference(&exported).collect();
    assert!(
        strays.is_empty(),
        "served but not found in src/ by the reader: {strays:?}"
    );
    for name in [
        "leasegate_ledger_up",
        "leasegate_durability_ok",
        "upstream_up",
        "tool_operation_unknown_count",
        "tool_operation_unknown_oldest_age_seconds",
        "lease_acquire_total",
        "upstream_call_duration_seconds_bucket",
    ] {
        assert!(served.contains(name), "{name} served: {served:?}");
    }
    assert_eq!(
        common::prometheus::sum(&text, "leasegate_ledger_up", &[]),
        1.0
    );
    proxy.stop().await;
}

/// `leasegate serve` builds its runtime with `worker_threads` workers (half
/// the cores when the config has none) and says so on `/metrics`.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_served_process_runs_the_configured_worker_threads(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    for (config, expected) in [
        ("", leasegate::config::default_worker_threads()),
        ("worker_threads = 3\n", 3),
    ] {
        let scenario = Scenario::new(&db.url, "");
        scenario.prepend_config(config);
        let served = ServedChild::spawn(ServedChild::command(&scenario, &[])).await;
        let metrics_url = format!("{}/metrics", served.control);
        let text = wait_until("the runtime's workers on /metrics", || async {
            let text = http::get(&metrics_url).await.body;
            text.contains("leasegate_runtime_worker_threads")
                .then_some(text)
        })
        .await;
        assert_eq!(
            common::prometheus::sum(&text, "leasegate_runtime_worker_threads", &[]),
            expected as f64,
            "config {config:?}"
        );
    }
}
