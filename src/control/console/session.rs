//! Browser login: `/console/login` takes a token and sets it as the
//! `lg_console` cookie (HttpOnly, SameSite=Strict, Path=/console, Secure
//! unless the request's Host is loopback); logout clears it. The token is
//! not checked here: `control::auth` checks it on the next request, as it
//! checks every request, and sends a browser without a valid one back to
//! the login page ([`login_redirect`]).

use axum::extract::{Form, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::pages;
use super::state::{COOKIE, Problem, Shared, html};
use crate::auth::Scope;

/// The token a console request carries in its cookie, as an
/// `Authorization` value.
pub fn cookie_bearer(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| format!("Bearer {value}"))
        .filter(|v| v.len() > "Bearer ".len())
}

#[derive(Debug, Deserialize, Default)]
pub(crate) struct LoginQuery {
    failed: Option<String>,
}

pub(super) async fn login_page(State(state): Shared, Query(query): Query<LoginQuery>) -> Response {
    html(pages::login(
        state.sources.auth_required,
        query.failed.as_deref(),
    ))
}

#[derive(Debug, Deserialize)]
pub(crate) struct LoginForm {
    token: Option<String>,
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

fn cookie(value: &str, host: &str, max_age: Option<u64>) -> HeaderValue {
    let secure = if loopback(host) { "" } else { "; Secure" };
    let age = max_age.map_or(String::new(), |age| format!("; Max-Age={age}"));
    HeaderValue::from_str(&format!(
        "{COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/console{secure}{age}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("lg_console=; Max-Age=0; Path=/console"))
}

fn host(request_headers: &HeaderMap) -> String {
    request_headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

pub(super) async fn login(headers: HeaderMap, Form(form): Form<LoginForm>) -> Response {
    let token = form.token.unwrap_or_default();
    let token = token.trim();
    // A cookie value holds no separators; anything else is not a token.
    if token.is_empty()
        || !token
            .chars()
            .all(|c| c.is_ascii_graphic() && c != ';' && c != ',' && c != '"' && c != '\\')
    {
        return Redirect::to("/console/login?failed=malformed").into_response();
    }
    // Validated by `control::auth` on the next request, as every request is:
    // an unknown or revoked token comes back here with `failed`.
    let mut response = Redirect::to("/console").into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, cookie(token, &host(&headers), None));
    response
}

pub(super) async fn logout(request: Request) -> Response {
    let mut response = Redirect::to("/console/login").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        cookie("", &host(request.headers()), Some(0)),
    );
    response
}

/// The answer to a console request whose token's scope is not `operator`
/// or `admin` (403; the refusal is counted by `control::auth`).
pub fn insufficient_scope(found: Scope) -> Response {
    Problem::new(
        StatusCode::FORBIDDEN,
        format!(
            "insufficient scope: the console needs an operator or admin token, found {found}; \
             log out and log in with another"
        ),
    )
    .into_response()
}

/// The answer to a console request that was not authenticated: back to the
/// login page (saying why), the stale cookie cleared.
pub fn login_redirect(reason: &str, headers: &HeaderMap) -> Response {
    let mut response = Redirect::to(&format!(
        "/console/login?failed={}",
        pages::path_segment(reason)
    ))
    .into_response();
    if cookie_bearer(headers).is_some() {
        response
            .headers_mut()
            .insert(header::SET_COOKIE, cookie("", &host(headers), Some(0)));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_is_secure_unless_the_host_is_loopback() {
        for host in ["127.0.0.1:8641", "localhost", "[::1]:80", "localhost:1"] {
            assert!(
                !cookie("t", host, None).to_str().unwrap().contains("Secure"),
                "{host}"
            );
        }
        for host in ["gw.example.com", "10.0.0.1:8641", "example.com:443"] {
            let value = cookie("t", host, None);
            let value = value.to_str().unwrap();
            assert!(value.contains("; Secure"), "{host}");
            assert!(value.contains("HttpOnly") && value.contains("SameSite=Strict"));
        }
    }

    #[test]
    fn only_the_console_cookie_is_taken_as_a_token() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=b; lg_console=lgt_x_y; c=d"),
        );
        assert_eq!(cookie_bearer(&headers).as_deref(), Some("Bearer lgt_x_y"));
        headers.insert(header::COOKIE, HeaderValue::from_static("lg_console="));
        assert_eq!(cookie_bearer(&headers), None);
    }
}
