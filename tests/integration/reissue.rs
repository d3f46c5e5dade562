//! Calls an agent sends more than once by protocol: a call re-issued under
//! a new request id after its response stream was cut (every HTTP front,
//! every protocol era, and `leasegate stdio` restarted under the same
//! lease), and a call that asked its agent something and was resumed by
//! the agent's retry (`input_required`, MCP 2026-07-28). Each is one
//! operation and one side effect, which is what the tests count.

use crate::common;

use common::TestDb;
use common::proxy::{LEASEGATE, RunningProxy, Scenario, lease_meta};
use leasegate::ledger::LeaseClaim;
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// Long enough for a re-issued call to wait out the first one.
const POLICY: &str = "in_flight_wait = \"30s\"\nclaim_ttl = \"60s\"\n";

/// The mailer's adapter with a timeout that outlasts a call that hangs
/// after sending, and `on_disconnect` as given.
fn mailer_adapter(on_disconnect: &str) -> String {
    format!(
        "upstream = \"mailer\"\ntimeout = \"20s\"\non_disconnect = \"{on_disconnect}\"\n\
         [tools.send_email]\ncapability = \"none\"\nremote_id_pointer = \"/message_id\"\n\
         [tools.mail_stats]\nread_only = true\n"
    )
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(common::DEADLINE)
        .build()
        .unwrap()
}

/// How one raw HTTP agent speaks: its protocol version and, on the
/// sessions front, its session.
struct Speaker {
    version: &'static str,
    session: Option<String>,
}

impl Speaker {
    /// A `tools/call` of `send_email` to `to`, hanging `hang_ms` after it
    /// sent, under `lease`, with JSON-RPC id `id`.
    fn send_email(&self, id: u64, to: &str, hang_ms: u64, lease: &LeaseClaim) -> Value {
        let mut meta = lease_meta(lease);
        if self.version >= "2026-07-28" {
            meta.insert(
                "io.modelcontextprotocol/protocolVersion".into(),
                json!(self.version),
            );
            meta.insert(
                "io.modelcontextprotocol/clientInfo".into(),
                json!({"name": "reissue-test", "version": "1"}),
            );
            meta.insert(
                "io.modelcontextprotocol/clientCapabilities".into(),
                json!({"sampling": {}}),
            );
        }
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "mailer__send_email",
            "arguments": {"to": to, "subject": "s", "hang_ms": hang_ms},
            "_meta": meta}})
    }

    fn post(&self, client: &reqwest::Client, url: &str, body: &Value) -> reqwest::RequestBuilder {
        let mut request = client
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", self.version)
            .body(body.to_string());
        if let Some(session) = &self.session {
            request = request.header("mcp-session-id", session);
        }
        if self.version >= "2026-07-28" {
            // 2026-07-28 names the method and its target in headers too.
            request = request.header("mcp-method", body["method"].as_str().unwrap_or_default());
            if let Some(name) = body.pointer("/params/name").and_then(Value::as_str) {
                request = request.header("mcp-name", name);
            }
        }
        request
    }
}

/// The JSON-RPC answer of a response: its first SSE `data:` line that
/// holds a response (not a notification), or the body.
async fn answer_of(response: reqwest::Response) -> Value {
    let body = response.text().await.expect("read the answer");
    body.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
        .find(|message| message.get("id").is_some())
        .unwrap_or_else(|| serde_json::from_str(body.trim()).expect("a JSON-RPC answer"))
}

/// Opens a session on the sessions front (raw HTTP, as a client would).
async fn open_session(client: &reqwest::Client, url: &str) -> String {
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {"sampling": {}},
        "clientInfo": {"name": "reissue-test", "version": "1"}}});
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(initialize.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let session = response.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let _ = response.text().await;
    let initialized = client
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .body(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(initialized.status(), 202);
    session
}

/// Sends a call that hangs after its effect, cuts its response stream once
/// the effect happened, and re-issues the same call under a new id: the
/// re-issued call's answer, and the e-mails sent.
async fn cut_then_reissue(
    scenario: &Scenario,
    url: &str,
    speaker: &Speaker,
    lease: &LeaseClaim,
    to: &str,
) -> (Value, Vec<Value>) {
    let client = client();
    let sent_before = scenario.side_effects("emails.jsonl").len();
    let first = speaker.post(&client, url, &speaker.send_email(1, to, 1_500, lease));
    let first = tokio::spawn(async move { first.send().await.map(|r| async { r.text().await }) });
    common::wait_until("the first call to send its e-mail", || async {
        (scenario.side_effects("emails.jsonl").len() > sent_before).then_some(())
    })
    .await;
    // The agent's stream breaks: its connection goes away mid-call.
    first.abort();
    let _ = first.await;
    let again = speaker
        .post(&client, url, &speaker.send_email(2, to, 1_500, lease))
        .send()
        .await
        .expect("the re-issued call is answered");
    let answer = answer_of(again).await;
    (answer, scenario.side_effects("emails.jsonl"))
}

/// A cut response stream, then the same call re-issued under a new id, on
/// the stateless front in both protocol eras and on the sessions front:
/// the re-issued call answers the first call's outcome (`replayed`, the
/// same operation) and the e-mail went out once. With `on_disconnect =
/// "cancel"`, a 2026-07-28 agent's cut stream cancels instead: the
/// re-issued call hears `unknown`.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_call_reissued_after_a_cut_stream_replays_the_first_answer_with_one_effect(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    for (sessions, version) in [
        (false, "2026-07-28"),
        (false, "2025-11-25"),
        (true, "2025-11-25"),
    ] {
        let tag = format!("sessions={sessions}, {version}: ");
        let scenario = Scenario::with_adapters(
            &db.url,
            POLICY,
            common::proxy::PAYMENTS_ADAPTER,
            &mailer_adapter("finish"),
        );
        scenario.prepend_config(&format!("http_sessions = {sessions}"));
        let proxy = RunningProxy::start(&scenario.config_path()).await;
        let session = if sessions {
            Some(open_session(&client(), &proxy.url).await)
        } else {
            None
        };
        let speaker = Speaker { version, session };
        let (lease, _) = db.running_run("reissuing-agent", 60_000).await;
        let (answer, emails) =
            cut_then_reissue(&scenario, &proxy.url, &speaker, &lease, "a@example.com").await;
        let note = &answer["result"]["_meta"]["dev.leasegate/operation"];
        assert_eq!(
            (note["status"].as_str(), note["replayed"].as_bool()),
            (Some("succeeded"), Some(true)),
            "{tag}the re-issued call replays the first call's answer: {answer}"
        );
        assert_eq!(
            answer["result"]["structuredContent"]["message_id"], "msg_1",
            "{tag}{answer}"
        );
        assert_eq!(emails.len(), 1, "{tag}one e-mail: {emails:?}");
        let operations: i64 =
            sqlx::query_scalar("SELECT count(*) FROM tool_operations WHERE run_id = $1")
                .bind(lease.run_id.as_uuid())
                .fetch_one(&db.admin)
                .await
                .unwrap();
        assert_eq!(operations, 1, "{tag}one operation");
        proxy.stop().await;
    }

    // The tool says a cut stream is a cancel.
    let scenario = Scenario::with_adapters(
        &db.url,
        POLICY,
        common::proxy::PAYMENTS_ADAPTER,
        &mailer_adapter("cancel"),
    );
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    let speaker = Speaker {
        version: "2026-07-28",
        session: None,
    };
    let (lease, _) = db.running_run("cancelling-agent", 60_000).await;
    let (answer, emails) =
        cut_then_reissue(&scenario, &proxy.url, &speaker, &lease, "b@example.com").await;
    assert_eq!(
        answer["result"]["structuredContent"]["status"], "unknown",
        "on_disconnect = cancel: the cut call was cancelled and may have acted: {answer}"
    );
    assert_eq!(emails.len(), 1, "{emails:?}");
    let calls = scenario.side_effects("calls.jsonl");
    assert!(
        calls.iter().any(|c| c["cancelled"] == true),
        "the upstream was told to cancel: {calls:?}"
    );
    proxy.stop().await;
}

/// `leasegate stdio` whose agent goes away mid-call (stdin closed, as a
/// client process that dies does): the call runs to its end and is
/// recorded before the process exits, so the same call from the agent's
/// next `leasegate stdio` replays it with one effect.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_call_reissued_through_a_new_stdio_process_replays_the_first_answer(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::with_adapters(
        &db.url,
        POLICY,
        common::proxy::PAYMENTS_ADAPTER,
        &mailer_adapter("finish"),
    );
    let (lease, _) = db.running_run("stdio-agent", 60_000).await;
    let speaker = Speaker {
        version: "2025-11-25",
        session: None,
    };
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "reissue-test", "version": "1"}}});
    let start = || {
        let mut child = tokio::process::Command::new(LEASEGATE)
            .arg("stdio")
            .arg("--config")
            .arg(scenario.config_path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        (child, stdin, stdout)
    };
    let send = |message: &Value| format!("{message}\n");

    let (mut first, mut stdin, mut stdout) = start();
    stdin.write_all(send(&initialize).as_bytes()).await.unwrap();
    common::within("initialize over stdio", stdout.next_line())
        .await
        .unwrap()
        .expect("an initialize answer");
    stdin
        .write_all(
            format!(
                "{}{}",
                send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"})),
                send(&speaker.send_email(1, "c@example.com", 1_500, &lease))
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    common::wait_until("the call to send its e-mail", || async {
        (!scenario.side_effects("emails.jsonl").is_empty()).then_some(())
    })
    .await;
    // The agent goes away mid-call.
    drop(stdin);
    drop(stdout);
    let status = common::within("leasegate stdio to exit", first.wait())
        .await
        .unwrap();
    assert!(status.success(), "leasegate stdio ends cleanly: {status:?}");

    let (_second, mut stdin, mut stdout) = start();
    stdin
        .write_all(
            format!(
                "{}{}{}",
                send(&initialize),
                send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"})),
                send(&speaker.send_email(2, "c@example.com", 1_500, &lease))
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let answer = common::within("the re-issued call's answer", async {
        loop {
            let line = stdout.next_line().await.unwrap().expect("an answer line");
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == 2 {
                break message;
            }
        }
    })
    .await;
    let note = &answer["result"]["_meta"]["dev.leasegate/operation"];
    assert_eq!(
        (note["status"].as_str(), note["replayed"].as_bool()),
        (Some("succeeded"), Some(true)),
        "the first process recorded the answer before it exited: {answer}"
    );
    assert_eq!(scenario.side_effects("emails.jsonl").len(), 1);
}

/// A side-effecting tool that asks the agent (sampling) before it acts,
/// called by a 2026-07-28 agent: the first request ends `input_required`,
/// the agent's retry (new id, `inputResponses`, the `requestState`) resumes
/// the same call, which is one operation with its round as `input_round`
/// evidence. The `requestState` is good once, and the same call afterwards
/// replays the answer: one effect in all.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn an_input_required_round_trip_is_one_operation_with_its_round_as_evidence(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, POLICY);
    scenario.add_upstream(
        "asker",
        "asker",
        "upstream = \"asker\"\ntimeout = \"20s\"\n[tools.send_confirmed]\ncapability = \"none\"\n",
    );
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    let (lease, _) = db.running_run("asking-agent", 60_000).await;
    let speaker = Speaker {
        version: "2026-07-28",
        session: None,
    };
    let client = client();
    let request = |id: u64, resume: Option<(&str, &Value)>| {
        let mut body = speaker.send_email(id, "d@example.com", 0, &lease);
        body["params"]["name"] = json!("asker__send_confirmed");
        body["params"]["arguments"] = json!({"to": "d@example.com"});
        if let Some((state, responses)) = resume {
            body["params"]["requestState"] = json!(state);
            body["params"]["inputResponses"] = responses.clone();
        }
        body
    };
    let post = |body: Value| {
        let request = speaker.post(&client, &proxy.url, &body);
        async move { answer_of(request.send().await.expect("answered")).await }
    };

    let asked = post(request(1, None)).await;
    let result = &asked["result"];
    assert_eq!(result["resultType"], "input_required", "{asked}");
    let state = result["requestState"].as_str().expect("a requestState");
    let (key, input) = result["inputRequests"]
        .as_object()
        .and_then(|inputs| inputs.iter().next())
        .expect("one input request");
    assert_eq!(input["method"], "sampling/createMessage", "{asked}");
    assert!(scenario.side_effects("confirmed.jsonl").is_empty());

    let responses = json!({key: {"role": "assistant", "model": "test",
        "content": {"type": "text", "text": "yes"}}});
    let done = post(request(2, Some((state, &responses)))).await;
    let note = &done["result"]["_meta"]["dev.leasegate/operation"];
    assert_eq!(
        (note["status"].as_str(), note["replayed"].as_bool()),
        (Some("succeeded"), Some(false)),
        "{done}"
    );
    assert_eq!(done["result"]["structuredContent"]["message_id"], "conf_1");
    let operation_id = note["operation_id"].as_str().unwrap().to_owned();

    let again = post(request(3, Some((state, &responses)))).await;
    assert_eq!(
        again["error"]["code"], -32602,
        "a requestState is good once: {again}"
    );
    let repeated = post(request(4, None)).await;
    let note = &repeated["result"]["_meta"]["dev.leasegate/operation"];
    assert_eq!(
        (note["operation_id"].as_str(), note["replayed"].as_bool()),
        (Some(operation_id.as_str()), Some(true)),
        "{repeated}"
    );
    assert_eq!(scenario.side_effects("confirmed.jsonl").len(), 1);

    let operations: i64 =
        sqlx::query_scalar("SELECT count(*) FROM tool_operations WHERE run_id = $1")
            .bind(lease.run_id.as_uuid())
            .fetch_one(&db.admin)
            .await
            .unwrap();
    assert_eq!(operations, 1);
    let rounds: Vec<Value> = sqlx::query_scalar(
        "SELECT body FROM operation_evidence WHERE operation_id = $1 AND kind = 'input_round'",
    )
    .bind(&operation_id)
    .fetch_all(&db.admin)
    .await
    .unwrap();
    assert_eq!(rounds.len(), 1, "{rounds:?}");
    assert_eq!(
        (
            rounds[0]["method"].as_str(),
            rounds[0]["round"].as_u64(),
            rounds[0]["answered"].as_bool()
        ),
        (Some("sampling/createMessage"), Some(1), Some(true)),
        "{rounds:?}"
    );
    assert_eq!(rounds[0]["answer_sha256"].as_str().map(str::len), Some(64));
    assert!(
        !rounds[0].to_string().contains("yes"),
        "the round holds digests, not the agent's answer: {rounds:?}"
    );
    proxy.stop().await;
}
