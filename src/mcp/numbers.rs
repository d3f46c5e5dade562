//! Numbers in `tools/call` arguments that parsing would change, found in
//! the agent's own bytes before rmcp parses them (the stdio line hook and
//! the HTTP body layer, `idempotency`).
//!
//! rmcp reads a message with serde_json, without `arbitrary_precision`
//! (rmcp's untagged message types do not support it): every number becomes
//! a `u64`, an `i64` or an IEEE double. An integer beyond the 64-bit range
//! (`18446744073709551616`, `-9223372036854775809`) or a decimal with more
//! than 17 significant digits becomes a double of another value, and from
//! then on nobody can tell: the tool would receive the rounded number, and
//! two different numbers would be one intent. Only the raw text still says
//! what the agent sent.
//!
//! A number token is *altered* when the decimal value of its text differs
//! from the decimal value of what leasegate would send on: the integer
//! serde_json read, or the shortest spelling that reads back as the double
//! it read (what serde_json writes). `0.1`, `1e3`, `1.5e300` and
//! `1.8446744073709552e19` are carried exactly (the tool reads the value
//! the agent wrote); `18446744073709551616`, `0.12345678901234567890` and
//! `1e-400` (read as 0) are not.
//!
//! # Invariants
//!
//! 1. Under `integers = "reject"`, a `tools/call` request (alone or in a
//!    batch) whose `params.arguments` holds an altered number never reaches
//!    the front as a call: it becomes a request of [`INEXACT_METHOD`] under
//!    the same id, which the front answers `-32602` naming each number's
//!    path and text ([`refusal`]). Nothing is registered or sent, whatever
//!    the tool (read-only or gated).
//! 2. Under `integers = "as_double"` nothing is rewritten: the call goes on
//!    with the doubles rmcp read (RFC 8785's double semantics).
//! 3. Every message without an altered number in a `tools/call`'s
//!    arguments passes byte for byte.
//!
//! The scanner is a recursive walk over the bytes (strings and escapes
//! skipped, keys decoded), kept here rather than taken from a crate: no
//! JSON crate already in the build exposes a number's text inside objects
//! without `arbitrary_precision`, and the walk is small and tested below.
//! Bytes it cannot read (not JSON, deeper than serde_json accepts) are left
//! alone: rmcp refuses them on its own.

use std::borrow::Cow;

use rmcp::ErrorData as McpError;
use rmcp::model::ErrorCode;
use serde_json::{Value, json};

use crate::intent::IntegerPolicy;

/// The method a refused `tools/call` is rewritten to; the front answers it
/// with [`refusal`] (`Front::on_custom_request`).
pub const INEXACT_METHOD: &str = "dev.leasegate/inexact_number";

/// JSON-RPC 2.0: invalid params.
const INVALID_PARAMS: i32 = -32602;

/// Deeper than serde_json's recursion limit (128): such a message does not
/// parse anyway, and the walk stops.
const MAX_DEPTH: usize = 256;

/// How many altered numbers a refusal lists in `data`.
const MAX_LISTED: usize = 16;

/// Longest token text quoted in a refusal.
const MAX_TOKEN_CHARS: usize = 80;

/// One number whose value parsing would change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Altered {
    /// From `$` = the call's `arguments`, as the ±2^53 rule names paths.
    pub path: String,
    /// The agent's text.
    pub token: String,
    /// What leasegate would send instead.
    pub parsed: String,
}

/// The rewritten message when `policy` refuses an altered number in a
/// `tools/call`'s arguments (invariant 1); `None`: pass `message` as it is.
pub fn refuse_altered(message: &[u8], policy: IntegerPolicy) -> Option<Vec<u8>> {
    if policy == IntegerPolicy::AsDouble {
        return None;
    }
    let found = altered_arguments(message)?;
    let mut parsed: Value = serde_json::from_slice(message).ok()?;
    let mut rewritten = false;
    match (&mut parsed, found) {
        (Value::Array(batch), Found::Batch(per_message)) => {
            for (index, altered) in per_message {
                if let Some(message) = batch.get_mut(index) {
                    rewritten |= rewrite(message, altered);
                }
            }
        }
        (message @ Value::Object(_), Found::Single(altered)) => {
            rewritten = rewrite(message, altered);
        }
        _ => {}
    }
    rewritten
        .then(|| serde_json::to_vec(&parsed).ok())
        .flatten()
}

/// The front's answer to a request of [`INEXACT_METHOD`].
pub fn refusal(params: Option<&Value>) -> McpError {
    let numbers = params
        .and_then(|params| params.get("numbers"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let total = params
        .and_then(|params| params.get("total"))
        .and_then(Value::as_u64)
        .unwrap_or(numbers.len() as u64);
    let field = |index: usize, name: &str| {
        numbers
            .get(index)
            .and_then(|number| number.get(name))
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_owned()
    };
    let more = match total {
        0 | 1 => String::new(),
        n => format!(" (and {} more)", n - 1),
    };
    McpError::new(
        ErrorCode(INVALID_PARAMS),
        format!(
            "number {} at {}{more} cannot be carried exactly: JSON-RPC parsing reads it as {}, \
             which the tool would receive and the intent's digest would see; send it as a string, \
             or set integers = \"as_double\" in the policy to accept IEEE doubles. Nothing was \
             recorded or sent",
            field(0, "token"),
            field(0, "path"),
            field(0, "parsed"),
        ),
        Some(json!({"reason": "inexact_number", "numbers": numbers})),
    )
}

/// Replaces a `tools/call` request by a request of [`INEXACT_METHOD`] under
/// its id. Whether it was one.
fn rewrite(message: &mut Value, altered: Vec<Altered>) -> bool {
    let Some(object) = message.as_object() else {
        return false;
    };
    let Some(id) = object
        .get("id")
        .filter(|id| id.is_string() || id.is_number())
    else {
        return false;
    };
    if object.get("method").and_then(Value::as_str) != Some("tools/call") || altered.is_empty() {
        return false;
    }
    for number in &altered {
        tracing::info!(path = %crate::logfield::clip(&number.path), "tools/call refused: a number parsing would change");
    }
    let numbers: Vec<Value> = altered
        .iter()
        .take(MAX_LISTED)
        .map(|number| {
            json!({
                "path": clip(&number.path),
                "token": clip(&number.token),
                "parsed": number.parsed,
            })
        })
        .collect();
    let mut params = json!({"numbers": numbers, "total": altered.len()});
    // A `V_2026_07_28` request carries its protocol version and capabilities in
    // `_meta`, which rmcp checks before any handler.
    if let Some(meta) = object.get("params").and_then(|p| p.get("_meta")) {
        params["_meta"] = meta.clone();
    }
    *message = json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": INEXACT_METHOD,
        "params": params,
    });
    true
}

fn clip(text: &str) -> String {
    if text.chars().count() <= MAX_TOKEN_CHARS {
        return text.to_owned();
    }
    let head: String = text.chars().take(MAX_TOKEN_CHARS).collect();
    format!("{head}…")
}

/// Altered numbers under `params.arguments`, of the message or of each
/// message of a batch.
#[derive(Debug, PartialEq)]
enum Found {
    Single(Vec<Altered>),
    Batch(Vec<(usize, Vec<Altered>)>),
}

/// `None`: nothing altered (or bytes the walk cannot read).
fn altered_arguments(message: &[u8]) -> Option<Found> {
    let mut scan = Scan {
        bytes: message,
        at: 0,
        path: Vec::new(),
        found: Vec::new(),
    };
    scan.value(0)?;
    scan.space();
    if scan.at != message.len() || scan.found.is_empty() {
        return None;
    }
    let batch = message.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[');
    if !batch {
        return Some(Found::Single(
            scan.found.into_iter().map(|(_, a)| a).collect(),
        ));
    }
    let mut per_message: Vec<(usize, Vec<Altered>)> = Vec::new();
    for (index, altered) in scan.found {
        let index = index.unwrap_or(0);
        match per_message.last_mut() {
            Some((last, list)) if *last == index => list.push(altered),
            _ => per_message.push((index, vec![altered])),
        }
    }
    Some(Found::Batch(per_message))
}

enum Segment<'a> {
    Key(Cow<'a, str>),
    Index(usize),
}

struct Scan<'a> {
    bytes: &'a [u8],
    at: usize,
    path: Vec<Segment<'a>>,
    /// (batch index, number), in document order.
    found: Vec<(Option<usize>, Altered)>,
}

impl<'a> Scan<'a> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn space(&mut self) {
        while self
            .peek()
            .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        {
            self.at += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        self.space();
        (self.peek()? == byte).then(|| self.at += 1)
    }

    fn value(&mut self, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.space();
        match self.peek()? {
            b'{' => {
                self.at += 1;
                self.space();
                if self.peek()? == b'}' {
                    self.at += 1;
                    return Some(());
                }
                loop {
                    self.space();
                    let key = self.string()?;
                    self.eat(b':')?;
                    self.path.push(Segment::Key(key));
                    self.value(depth + 1)?;
                    self.path.pop();
                    self.space();
                    match self.peek()? {
                        b',' => self.at += 1,
                        b'}' => break,
                        _ => return None,
                    }
                }
                self.at += 1;
            }
            b'[' => {
                self.at += 1;
                self.space();
                if self.peek()? == b']' {
                    self.at += 1;
                    return Some(());
                }
                let mut index = 0;
                loop {
                    self.path.push(Segment::Index(index));
                    self.value(depth + 1)?;
                    self.path.pop();
                    index += 1;
                    self.space();
                    match self.peek()? {
                        b',' => self.at += 1,
                        b']' => break,
                        _ => return None,
                    }
                }
                self.at += 1;
            }
            b'"' => {
                self.string()?;
            }
            b't' => self.literal(b"true")?,
            b'f' => self.literal(b"false")?,
            b'n' => self.literal(b"null")?,
            b'-' | b'0'..=b'9' => {
                let start = self.at;
                while self
                    .peek()
                    .is_some_and(|b| matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                {
                    self.at += 1;
                }
                let token = std::str::from_utf8(&self.bytes[start..self.at]).ok()?;
                self.number(token)?;
            }
            _ => return None,
        }
        Some(())
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at + word.len();
        (self.bytes.get(self.at..end)? == word).then(|| self.at = end)
    }

    /// A string at `at` (which must be `"`); its text, decoded only when it
    /// has escapes.
    fn string(&mut self) -> Option<Cow<'a, str>> {
        if self.peek()? != b'"' {
            return None;
        }
        let start = self.at;
        self.at += 1;
        let mut escaped = false;
        loop {
            match self.peek()? {
                b'"' => break,
                b'\\' => {
                    escaped = true;
                    self.at += 2;
                }
                _ => self.at += 1,
            }
        }
        self.at += 1;
        let raw = self.bytes.get(start..self.at)?;
        if escaped {
            serde_json::from_slice::<String>(raw).ok().map(Cow::Owned)
        } else {
            std::str::from_utf8(&raw[1..raw.len() - 1])
                .ok()
                .map(Cow::Borrowed)
        }
    }

    /// Records `token` when it sits in a call's arguments and parsing
    /// alters it. `None`: not a number serde_json reads (rmcp refuses the
    /// message on its own).
    fn number(&mut self, token: &str) -> Option<()> {
        let (batch, rest) = match self.path.split_first() {
            Some((Segment::Index(index), rest)) => (Some(*index), rest),
            _ => (None, &self.path[..]),
        };
        let in_arguments = matches!(
            rest,
            [Segment::Key(params), Segment::Key(arguments), ..]
                if params == "params" && arguments == "arguments"
        );
        if !in_arguments {
            return Some(());
        }
        if let Some(parsed) = altered(token)? {
            let mut path = String::from("$");
            for segment in &rest[2..] {
                match segment {
                    Segment::Key(key) => {
                        path.push('.');
                        path.push_str(key);
                    }
                    Segment::Index(index) => path.push_str(&format!("[{index}]")),
                }
            }
            self.found.push((
                batch,
                Altered {
                    path,
                    token: token.to_owned(),
                    parsed,
                },
            ));
        }
        Some(())
    }
}

/// `Some(Some(sent))` when parsing changes the value of `token` (`sent`:
/// what serde_json writes of what it read), `Some(None)` when it keeps it,
/// `None` when serde_json does not read it as a number.
fn altered(token: &str) -> Option<Option<String>> {
    // Short plain integers are exact: the common case, without parsing.
    let digits = token.strip_prefix('-').unwrap_or(token);
    if digits.len() <= 18 && !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        return Some(None);
    }
    let number: serde_json::Number = serde_json::from_str(token).ok()?;
    if !number.is_f64() {
        // An integer token read as u64 or i64: exact.
        return Some(None);
    }
    let sent = number.to_string();
    Some((decimal(token) != decimal(&sent)).then_some(sent))
}

/// The exact value of a JSON number's text: sign, significant digits
/// (no leading or trailing zeros) and the power of ten they are scaled by.
/// Zero is `(false, "", 0)` whatever its sign or spelling.
fn decimal(text: &str) -> (bool, String, i64) {
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], &text[at + 1..]),
        None => (text, ""),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    // Saturated: far beyond any exponent a number with these digits could
    // need to differ from another.
    const CAP: i64 = 1 << 40;
    let mut scale: i64 = 0;
    let (sign, exponent_digits) = match exponent.as_bytes().first() {
        Some(b'-') => (-1, &exponent[1..]),
        Some(b'+') => (1, &exponent[1..]),
        _ => (1, exponent),
    };
    for b in exponent_digits.bytes() {
        scale = (scale * 10 + i64::from(b - b'0')).min(CAP);
    }
    scale *= sign;
    let mut digits: String = whole.chars().chain(fraction.chars()).collect();
    scale -= fraction.len() as i64;
    let leading = digits.len() - digits.trim_start_matches('0').len();
    digits.drain(..leading);
    while digits.ends_with('0') {
        digits.pop();
        scale += 1;
    }
    if digits.is_empty() {
        return (false, String::new(), 0);
    }
    (negative, digits, scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(arguments: &str) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"t","arguments":{arguments}}}}}"#
        )
    }

    #[test]
    fn numbers_parsing_would_change_are_found_and_exact_ones_are_not() {
        for token in [
            "18446744073709551616",
            "18446744073709551617",
            "18446744073709551616.0",
            "-9223372036854775809",
            "123456789012345678901234567890",
            "3.1415926535897932384",
            "0.12345678901234567890",
            "1e-400",
            "9007199254740993.0",
        ] {
            assert!(
                altered(token).expect("a number").is_some(),
                "{token} is altered"
            );
        }
        for token in [
            "1",
            "-1",
            "0",
            "-0",
            "-0.0",
            "0.5",
            "0.1",
            "1e3",
            "1E+3",
            "9007199254740992",
            "9007199254740993",
            "18446744073709551615",
            "-9223372036854775808",
            "1.5e300",
            "1.8446744073709552e19",
            "0.30000000000000000000",
            "100e-2",
        ] {
            assert_eq!(altered(token), Some(None), "{token} is exact");
        }
        assert_eq!(
            altered("18446744073709551616"),
            Some(Some("1.8446744073709552e+19".to_owned()))
        );
        assert_eq!(decimal("-1.50e2"), (true, "15".to_owned(), 1));
        assert_eq!(decimal("0.000"), (false, String::new(), 0));
    }

    #[test]
    fn only_a_calls_arguments_are_judged_with_their_paths() {
        let message = call(
            r#"{"a":[1,{"b\"c":18446744073709551617}],"s":"18446744073709551617 [{\"","n":{"\u0078":-9223372036854775809}}"#,
        );
        let Some(Found::Single(found)) = altered_arguments(message.as_bytes()) else {
            panic!("found");
        };
        let paths: Vec<(&str, &str)> = found
            .iter()
            .map(|a| (a.path.as_str(), a.token.as_str()))
            .collect();
        assert_eq!(
            paths,
            vec![
                ("$.a[1].b\"c", "18446744073709551617"),
                ("$.n.x", "-9223372036854775809")
            ]
        );
        // Outside the arguments: the id, `_meta`, another method's params.
        let elsewhere = r#"{"jsonrpc":"2.0","id":18446744073709551617,"method":"tools/call","params":{"name":"t","_meta":{"n":1e-400},"arguments":{"ok":1}}}"#;
        assert_eq!(altered_arguments(elsewhere.as_bytes()), None);
        assert_eq!(altered_arguments(b"{\"params\": "), None);
        assert_eq!(altered_arguments(b"[1, 2"), None);
    }

    #[test]
    fn a_refused_call_keeps_its_id_and_everything_else_passes() {
        let message = call(r#"{"amount":18446744073709551616,"note":"x"}"#);
        let rewritten: Value = serde_json::from_slice(
            &refuse_altered(message.as_bytes(), IntegerPolicy::Reject).expect("refused"),
        )
        .unwrap();
        assert_eq!(rewritten["id"], 7);
        assert_eq!(rewritten["method"], INEXACT_METHOD);
        assert_eq!(
            rewritten["params"]["numbers"],
            json!([{"path": "$.amount", "token": "18446744073709551616", "parsed": "1.8446744073709552e+19"}])
        );
        let error = refusal(Some(&rewritten["params"]));
        assert_eq!(error.code.0, -32602);
        assert!(
            error
                .message
                .starts_with("number 18446744073709551616 at $.amount cannot be carried exactly"),
            "{}",
            error.message
        );
        assert_eq!(
            refuse_altered(message.as_bytes(), IntegerPolicy::AsDouble),
            None
        );
        let ordinary = call(r#"{"a":1,"b":-1,"c":0.5,"d":1e3,"e":9007199254740992,"f":1.5e300}"#);
        assert_eq!(
            refuse_altered(ordinary.as_bytes(), IntegerPolicy::Reject),
            None
        );
        let other = r#"{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"p","arguments":{"n":18446744073709551616}}}"#;
        assert_eq!(
            refuse_altered(other.as_bytes(), IntegerPolicy::Reject),
            None
        );

        // In a batch only the altered call is replaced.
        let batch = format!(
            "[{},{}]",
            call(r#"{"n":1}"#),
            call(r#"{"n":123456789012345678901234567890}"#).replace("\"id\":7", "\"id\":\"b\"")
        );
        let rewritten: Value = serde_json::from_slice(
            &refuse_altered(batch.as_bytes(), IntegerPolicy::Reject).expect("refused"),
        )
        .unwrap();
        assert_eq!(rewritten[0]["method"], "tools/call");
        assert_eq!(
            (rewritten[1]["id"].clone(), rewritten[1]["method"].clone()),
            (json!("b"), json!(INEXACT_METHOD))
        );
    }
}
