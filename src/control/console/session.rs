//! Browser login: `/console/login` takes a token and starts a console
//! session — a random id in the `lg_console` cookie (HttpOnly,
//! SameSite=Strict, Path=/console, Secure unless the request's Host is
//! loopback) that stands for the token in this process's memory for at
//! most [`SESSION_TTL`]. The token itself never goes to the browser's
//! cookie jar; logout ends the session here, so a copied cookie is dead
//! after it. The token is not checked at login: `control::auth` checks it
//! on every request (a revoked token is refused at once), and sends a
//! browser without a valid one back to the login page ([`login_redirect`]),
//! which ends the session.
//!
//! Login and logout are forms like the others: the login form's token is
//! bound to a nonce in the `lg_login` cookie set with the form, the logout
//! form's to the session, both keyed by the per-process form key — a page
//! of another origin can neither log a browser in under its own token nor
//! out.
//!
//! Sessions live in the memory of the process that started them: after a
//! restart, or on another process behind a load balancer without sticky
//! sessions, the browser is asked to log in again.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Form, FromRequest, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::pages;
use super::state::{
    COOKIE, Problem, Shared, add_security_headers, bound_form_token, cookie_value, html, session_id,
};
use crate::auth::Scope;

/// How long a console session lasts after login.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// At most this many console sessions at once (per process); the oldest
/// ends first.
const MAX_SESSIONS: usize = 10_000;

/// The cookie of the login form's nonce.
const LOGIN_COOKIE: &str = "lg_login";

struct Session {
    token: String,
    started: Instant,
}

/// SHA-256 of a session id → its session.
static SESSIONS: LazyLock<Mutex<HashMap<[u8; 32], Session>>> = LazyLock::new(Default::default);

fn session_key(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

/// A fresh random value, hex (session ids, nonces).
fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    // Without the OS random source no session can be safe: none is made.
    getrandom::fill(&mut bytes).expect("the OS random source");
    hex::encode(bytes)
}

/// The token a console request's session stands for, as an
/// `Authorization` value; `None` without a live session.
pub fn cookie_bearer(headers: &HeaderMap) -> Option<String> {
    let id = session_id(headers)?;
    let sessions = SESSIONS.lock().unwrap_or_else(|e| e.into_inner());
    sessions
        .get(&session_key(id))
        .filter(|session| session.started.elapsed() < SESSION_TTL)
        .map(|session| format!("Bearer {}", session.token))
}

fn start_session(token: &str) -> String {
    let id = random_hex();
    let mut sessions = SESSIONS.lock().unwrap_or_else(|e| e.into_inner());
    sessions.retain(|_, session| session.started.elapsed() < SESSION_TTL);
    while sessions.len() >= MAX_SESSIONS {
        let oldest = sessions
            .iter()
            .min_by_key(|(_, session)| session.started)
            .map(|(key, _)| *key);
        match oldest {
            Some(key) => sessions.remove(&key),
            None => break,
        };
    }
    sessions.insert(
        session_key(&id),
        Session {
            token: token.to_owned(),
            started: Instant::now(),
        },
    );
    id
}

fn end_session(headers: &HeaderMap) {
    if let Some(id) = session_id(headers) {
        SESSIONS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&session_key(id));
    }
}

#[derive(Debug, Deserialize, Default)]
pub(crate) struct LoginQuery {
    failed: Option<String>,
}

pub(super) async fn login_page(
    State(state): Shared,
    headers: HeaderMap,
    Query(query): Query<LoginQuery>,
) -> Response {
    let nonce = random_hex();
    let mut response = html(pages::login(
        state.sources.auth_required,
        query.failed.as_deref(),
        &bound_form_token(&state.form_key, "login", &nonce),
    ));
    response.headers_mut().append(
        header::SET_COOKIE,
        cookie(
            LOGIN_COOKIE,
            &nonce,
            "/console/login",
            &host(&headers),
            None,
        ),
    );
    response
}

#[derive(Debug, Deserialize)]
pub(crate) struct LoginForm {
    token: Option<String>,
    form_token: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct LogoutForm {
    form_token: Option<String>,
}

fn loopback(host: &str) -> bool {
    let host = host.rsplit_once(':').map_or(host, |(h, port)| {
        if port.chars().all(|c| c.is_ascii_digit()) {
            h
        } else {
            host
        }
    });
    let host = host.trim_matches(['[', ']']);
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn cookie(name: &str, value: &str, path: &str, host: &str, max_age: Option<u64>) -> HeaderValue {
    let secure = if loopback(host) { "" } else { "; Secure" };
    let age = max_age.map_or(String::new(), |age| format!("; Max-Age={age}"));
    HeaderValue::from_str(&format!(
        "{name}={value}; HttpOnly; SameSite=Strict; Path={path}{secure}{age}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("lg_console=; Max-Age=0; Path=/console"))
}

/// The console session cookie with `value` (empty and `Some(0)`: cleared).
fn session_cookie(value: &str, host: &str, max_age: Option<u64>) -> HeaderValue {
    cookie(COOKIE, value, "/console", host, max_age)
}

fn host(request_headers: &HeaderMap) -> String {
    request_headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

pub(super) async fn login(
    State(state): Shared,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    // The form must be the one this process gave this browser.
    let expected = cookie_value(&headers, LOGIN_COOKIE)
        .map(|nonce| bound_form_token(&state.form_key, "login", nonce));
    if expected.is_none() || form.form_token != expected {
        return Redirect::to("/console/login?failed=the%20login%20form%20expired").into_response();
    }
    let token = form.token.unwrap_or_default();
    let token = token.trim();
    // A token holds no separators; anything else is not one.
    if token.is_empty()
        || !token
            .chars()
            .all(|c| c.is_ascii_graphic() && c != ';' && c != ',' && c != '"' && c != '\\')
    {
        return Redirect::to("/console/login?failed=malformed").into_response();
    }
    // A session that came along (fixation) is not continued.
    end_session(&headers);
    // Checked by `control::auth` on the next request, as every request is:
    // an unknown or revoked token comes back here with `failed`.
    let id = start_session(token);
    let host = host(&headers);
    let mut response = Redirect::to("/console").into_response();
    let cookies = response.headers_mut();
    cookies.append(header::SET_COOKIE, session_cookie(&id, &host, None));
    cookies.append(
        header::SET_COOKIE,
        cookie(LOGIN_COOKIE, "", "/console/login", &host, Some(0)),
    );
    response
}

pub(super) async fn logout(State(state): Shared, request: Request) -> Response {
    let headers = request.headers().clone();
    let Some(id) = session_id(&headers).map(str::to_owned) else {
        return Redirect::to("/console/login").into_response();
    };
    let form = Form::<LogoutForm>::from_request(request, &())
        .await
        .ok()
        .and_then(|Form(form)| form.form_token);
    let expected = bound_form_token(&state.form_key, "logout", &id);
    if form.as_deref() != Some(expected.as_str()) {
        return Problem::new(
            StatusCode::FORBIDDEN,
            "this logout form is not from this console (its form token does not match): \
             open the console and use its Log out button",
        )
        .into_response();
    }
    end_session(&headers);
    let mut response = Redirect::to("/console/login").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        session_cookie("", &host(&headers), Some(0)),
    );
    response
}

/// The answer to a console request whose token's scope is not `operator`
/// or `admin` (403; the refusal is counted by `control::auth`).
pub fn insufficient_scope(found: Scope) -> Response {
    let mut response = Problem::new(
        StatusCode::FORBIDDEN,
        format!(
            "insufficient scope: the console needs an operator or admin token, found {found}; \
             log out and log in with another"
        ),
    )
    .into_response();
    add_security_headers(response.headers_mut());
    response
}

/// The answer to a console request that was not authenticated: back to the
/// login page (saying why), the stale cookie cleared.
pub fn login_redirect(reason: &str, headers: &HeaderMap) -> Response {
    let mut response = Redirect::to(&format!(
        "/console/login?failed={}",
        pages::path_segment(reason)
    ))
    .into_response();
    if session_id(headers).is_some() {
        end_session(headers);
        response.headers_mut().insert(
            header::SET_COOKIE,
            session_cookie("", &host(headers), Some(0)),
        );
    }
    add_security_headers(response.headers_mut());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_is_secure_unless_the_host_is_loopback() {
        for host in ["127.0.0.1:8641", "localhost", "[::1]:80", "localhost:1"] {
            let value = session_cookie("t", host, None);
            assert!(!value.to_str().unwrap().contains("Secure"), "{host}");
        }
        for host in ["gw.example.com", "10.0.0.1:8641", "example.com:443"] {
            let value = session_cookie("t", host, None);
            let value = value.to_str().unwrap();
            assert!(value.contains("; Secure"), "{host}");
            assert!(value.contains("HttpOnly") && value.contains("SameSite=Strict"));
        }
    }

    #[test]
    fn a_session_cookie_stands_for_its_token_until_it_ends() {
        let id = start_session("lgt_0123456789abcdef_secret");
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("a=b; lg_console={id}; c=d")).unwrap(),
        );
        assert_eq!(
            cookie_bearer(&headers).as_deref(),
            Some("Bearer lgt_0123456789abcdef_secret")
        );
        // The token itself is not a session.
        let mut forged = HeaderMap::new();
        forged.insert(
            header::COOKIE,
            HeaderValue::from_static("lg_console=lgt_0123456789abcdef_secret"),
        );
        assert_eq!(cookie_bearer(&forged), None);
        end_session(&headers);
        assert_eq!(cookie_bearer(&headers), None);
        headers.insert(header::COOKIE, HeaderValue::from_static("lg_console="));
        assert_eq!(cookie_bearer(&headers), None);
    }
}
