//! A real headless Chromium driven through W3C WebDriver (`chromedriver`,
//! Debian's `chromium-driver`), over plain HTTP: the few commands the
//! console tests need. A missing browser or driver fails the test with what
//! to install; it is never skipped (`.ci/run` installs both).

use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};

/// Where Debian puts them; `LEASEGATE_CHROMEDRIVER` / `LEASEGATE_CHROMIUM`
/// override.
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

pub struct Browser {
    driver: tokio::process::Child,
    base: String,
    session: String,
    client: reqwest::Client,
}

fn program(variable: &str, default: &str) -> String {
    let path = std::env::var(variable).unwrap_or_else(|_| default.to_owned());
    assert!(
        std::path::Path::new(&path).exists(),
        "{path} is missing: the console tests need a real browser. Install Debian's \
         `chromium` and `chromium-driver` (apt-get install -y chromium chromium-driver), \
         or point {variable} at them"
    );
    path
}

impl Browser {
    /// Starts chromedriver on a free port and opens a headless session.
    pub async fn start() -> Browser {
        let driver_path = program("LEASEGATE_CHROMEDRIVER", CHROMEDRIVER);
        let chromium = program("LEASEGATE_CHROMIUM", CHROMIUM);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = tokio::process::Command::new(&driver_path)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start {driver_path}: {e}"));
        let client = reqwest::Client::builder()
            .timeout(super::DEADLINE)
            .build()
            .unwrap();
        let base = format!("http://127.0.0.1:{port}");
        super::wait_until("chromedriver to be ready", || {
            let client = client.clone();
            let url = format!("{base}/status");
            async move {
                let response = client.get(&url).send().await.ok()?;
                let status: Value = serde_json::from_str(&response.text().await.ok()?).ok()?;
                status["value"]["ready"].as_bool().filter(|ready| *ready)
            }
        })
        .await;
        let mut browser = Browser {
            driver,
            base,
            session: String::new(),
            client,
        };
        let created = browser
            .command(
                "POST",
                "/session",
                json!({"capabilities": {"alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {
                        "binary": chromium,
                        "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                                 "--disable-gpu", "--window-size=1400,1100", "--hide-scrollbars"]
                    }
                }}}),
            )
            .await;
        browser.session = created["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {created}"))
            .to_owned();
        browser
    }

    /// One WebDriver command; its `value`. Errors fail the test.
    async fn command(&self, method: &str, path: &str, body: Value) -> Value {
        let value = self.try_command(method, path, body).await;
        value.unwrap_or_else(|error| panic!("WebDriver {method} {path}: {error}"))
    }

    async fn try_command(&self, method: &str, path: &str, body: Value) -> Result<Value, Value> {
        let url = if path == "/session" {
            format!("{}{path}", self.base)
        } else {
            format!("{}/session/{}{path}", self.base, self.session)
        };
        let mut request = self.client.request(method.parse().unwrap(), &url);
        if method == "POST" {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("WebDriver {url}: {e}"));
        let ok = response.status().is_success();
        let answer: Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
        let value = answer["value"].clone();
        if ok { Ok(value) } else { Err(value) }
    }

    pub async fn goto(&self, url: &str) {
        self.command("POST", "/url", json!({ "url": url })).await;
    }

    pub async fn url(&self) -> String {
        let url = self.command("GET", "/url", Value::Null).await;
        url.as_str().unwrap().to_owned()
    }

    async fn element(&self, css: &str) -> Option<String> {
        let found = self
            .try_command(
                "POST",
                "/element",
                json!({"using": "css selector", "value": css}),
            )
            .await
            .ok()?;
        found
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .map(str::to_owned)
    }

    /// The element matching `css`, waited for up to the deadline.
    pub async fn find(&self, css: &str) -> String {
        super::wait_until(
            &format!("an element {css:?} on {}", self.url().await),
            || self.element(css),
        )
        .await
    }

    pub async fn exists(&self, css: &str) -> bool {
        self.element(css).await.is_some()
    }

    pub async fn count(&self, css: &str) -> usize {
        self.command(
            "POST",
            "/elements",
            json!({"using": "css selector", "value": css}),
        )
        .await
        .as_array()
        .map_or(0, Vec::len)
    }

    /// The visible text of the element matching `css`.
    pub async fn text(&self, css: &str) -> String {
        let text = self.on_element(css, "GET", "text", Value::Null).await;
        text.as_str().unwrap_or_default().to_owned()
    }

    /// The attribute `name` of the element matching `css` (empty if none).
    pub async fn attribute(&self, css: &str, name: &str) -> String {
        let path = format!("attribute/{name}");
        let value = self.on_element(css, "GET", &path, Value::Null).await;
        value.as_str().unwrap_or_default().to_owned()
    }

    /// `{method} /element/{id}/{what}` on the element matching `css`, found
    /// again when the page replaced it between finding and acting (a
    /// navigation still landing, a panel refreshed): WebDriver then answers
    /// "stale element reference", which is not the test's failure.
    async fn on_element(&self, css: &str, method: &str, what: &str, body: Value) -> Value {
        super::wait_until(
            &format!("{method} {what} on {css:?} at {}", self.url().await),
            || async {
                let id = self.element(css).await?;
                let path = format!("/element/{id}/{what}");
                match self.try_command(method, &path, body.clone()).await {
                    Ok(value) => Some(value),
                    Err(error) if error["error"] == "stale element reference" => None,
                    Err(error) => panic!("WebDriver {method} {path}: {error}"),
                }
            },
        )
        .await
    }

    /// Whether the element matching `css` is cut on screen: its content is
    /// wider than the box that shows it.
    pub async fn is_clipped(&self, css: &str) -> bool {
        self.find(css).await;
        self.command(
            "POST",
            "/execute/sync",
            json!({
                "script": "const e = document.querySelector(arguments[0]); return e.scrollWidth > e.clientWidth;",
                "args": [css],
            }),
        )
        .await
        .as_bool()
        .unwrap_or(false)
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        self.on_element(css, "POST", "clear", json!({})).await;
        self.on_element(css, "POST", "value", json!({ "text": text }))
            .await;
    }

    pub async fn click(&self, css: &str) {
        self.on_element(css, "POST", "click", json!({})).await;
    }

    /// Accepts the open `confirm()` dialog (the console asks before
    /// destructive actions), waiting for it up to the deadline.
    pub async fn accept_dialog(&self) {
        super::wait_until("a confirmation dialog", || async {
            self.try_command("POST", "/alert/accept", json!({}))
                .await
                .ok()
        })
        .await;
    }

    /// The page's HTML as the browser has it.
    pub async fn source(&self) -> String {
        self.command("GET", "/source", Value::Null)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Writes the viewport as a PNG to `path`.
    pub async fn screenshot(&self, path: &std::path::Path) {
        let encoded = self.command("GET", "/screenshot", Value::Null).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().unwrap())
            .unwrap();
        std::fs::write(path, png).unwrap();
    }

    /// Scrolls the element matching `css` to the top of the viewport.
    pub async fn scroll_to(&self, css: &str) {
        self.find(css).await;
        self.command(
            "POST",
            "/execute/sync",
            json!({
                "script": "document.querySelector(arguments[0]).scrollIntoView({block: 'start'}); window.scrollBy(0, -12);",
                "args": [css],
            }),
        )
        .await;
    }

    /// Ends the session and the driver.
    pub async fn quit(mut self) {
        let _ = self.try_command("DELETE", "", Value::Null).await;
        let _ = self.driver.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.driver.wait()).await;
    }
}
