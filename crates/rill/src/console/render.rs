//! The console API's pure parts: how record bytes are shown (text, JSON, hex), consumer
//! lag arithmetic, partition states, the query strings and names the API accepts. No
//! I/O here, so that each rule has a unit test.

use std::collections::BTreeMap;

use serde_json::{json, Value};

/// At most this many bytes of one key, value or header are shown; the rest is cut and the
/// record says so (a 1 MiB value would otherwise make a page of megabytes).
pub const SHOWN_BYTES_MAX: usize = 4096;

/// How the message browser shows bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// UTF-8, with invalid sequences replaced (U+FFFD).
    Text,
    /// Pretty-printed JSON; bytes that are not JSON fall back to text, marked so.
    Json,
    /// Lowercase hex, bytes separated by spaces.
    Hex,
}

impl std::str::FromStr for Encoding {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(Encoding::Text),
            "json" => Ok(Encoding::Json),
            "hex" => Ok(Encoding::Hex),
            other => Err(format!("encoding {other:?}: expected text, json or hex")),
        }
    }
}

/// Bytes as the page shows them: `{"text", "size", "truncated", "not_json"?}`, or JSON
/// `null` for a null key or value.
pub fn show(bytes: Option<&[u8]>, encoding: Encoding) -> Value {
    let Some(bytes) = bytes else {
        return Value::Null;
    };
    let truncated = bytes.len() > SHOWN_BYTES_MAX;
    let shown = &bytes[..bytes.len().min(SHOWN_BYTES_MAX)];
    let mut out = json!({ "size": bytes.len(), "truncated": truncated });
    let text = match encoding {
        Encoding::Text => String::from_utf8_lossy(shown).into_owned(),
        Encoding::Hex => hex(shown),
        // Only a whole value can be parsed: a cut one is shown as text.
        Encoding::Json => match serde_json::from_slice::<Value>(bytes) {
            Ok(parsed) if !truncated => {
                serde_json::to_string_pretty(&parsed).unwrap_or_else(|_| parsed.to_string())
            }
            _ => {
                out["not_json"] = Value::Bool(true);
                String::from_utf8_lossy(shown).into_owned()
            }
        },
    };
    out["text"] = Value::String(text);
    out
}

/// `de ad be ef`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 3);
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

/// Whether a record's key contains `filter` (as text; a null key matches no filter).
pub fn key_matches(key: Option<&[u8]>, filter: &str) -> bool {
    if filter.is_empty() {
        return true;
    }
    key.is_some_and(|k| String::from_utf8_lossy(k).contains(filter))
}

/// A group's lag on a partition: end offset (high watermark) minus committed offset,
/// `None` when nothing is committed there (Kafka's tools print `-`). Never negative: a
/// commit past the end (a truncated log) is no lag, not a negative one.
pub fn lag(committed: Option<i64>, end: Option<i64>) -> Option<i64> {
    match (committed, end) {
        (Some(c), Some(e)) if c >= 0 && e >= 0 => Some(e.saturating_sub(c).max(0)),
        _ => None,
    }
}

/// The sum of the lags known.
pub fn total_lag(lags: impl IntoIterator<Item = Option<i64>>) -> i64 {
    lags.into_iter().flatten().fold(0i64, i64::saturating_add)
}

/// A partition's state as the overview counts it (Kafka's offline and under-replicated
/// partition counts): no leader, fewer in-sync replicas than replicas, or online.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionState {
    Online,
    UnderReplicated,
    Offline,
}

impl PartitionState {
    pub fn of(leader: i32, replicas: usize, isr: usize) -> Self {
        if leader < 0 {
            PartitionState::Offline
        } else if isr < replicas {
            PartitionState::UnderReplicated
        } else {
            PartitionState::Online
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PartitionState::Online => "online",
            PartitionState::UnderReplicated => "under-replicated",
            PartitionState::Offline => "offline",
        }
    }
}

/// Kafka's topic name rule: 1 to 249 of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn check_topic_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 249 {
        return Err("a topic name has 1 to 249 characters".into());
    }
    if name == "." || name == ".." {
        return Err("a topic name cannot be \".\" or \"..\"".into());
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "a topic name has only letters, digits, '.', '_' and '-' (not {c:?})"
        ));
    }
    Ok(())
}

/// A group id as the API takes it in a path: not empty, at most 255 bytes, no control
/// characters (Kafka itself takes any string; these bounds keep the page sane).
pub fn check_group_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > 255 {
        return Err("a group id has 1 to 255 bytes".into());
    }
    if id.chars().any(char::is_control) {
        return Err("a group id has no control characters".into());
    }
    Ok(())
}

/// The pairs of a query string (`a=1&b=x%20y`), percent-decoded, `+` as a space; a
/// later pair overrides an earlier one. At most 32 pairs are read.
pub fn parse_query(query: &str) -> BTreeMap<String, String> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .take(32)
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match (hex_digit(bytes[i + 1]), hex_digit(bytes[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push(h << 4 | l);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Where the message browser starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    /// From this offset.
    Offset(i64),
    /// From the first offset whose timestamp is at or after this (ms since the epoch).
    Timestamp(i64),
    /// The last `limit` records before the end.
    End,
}

/// The first offset to read for [`StartAt::End`]: `limit` before the end, not before
/// the log start.
pub fn tail_start(log_start: i64, log_end: i64, limit: usize) -> i64 {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    log_end.saturating_sub(limit).max(log_start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_json_and_hex_show_the_same_bytes() {
        let value = br#"{"a":1,"b":[true,null]}"#;
        let text = show(Some(value), Encoding::Text);
        assert_eq!(text["text"], r#"{"a":1,"b":[true,null]}"#);
        assert_eq!(text["size"], 23);
        assert_eq!(text["truncated"], false);

        let pretty = show(Some(value), Encoding::Json);
        assert_eq!(
            pretty["text"],
            "{\n  \"a\": 1,\n  \"b\": [\n    true,\n    null\n  ]\n}"
        );
        assert!(pretty.get("not_json").is_none());

        assert_eq!(show(Some(b"\x00\xffA"), Encoding::Hex)["text"], "00 ff 41");
        assert_eq!(show(None, Encoding::Text), Value::Null);
        assert_eq!(show(Some(b""), Encoding::Hex)["text"], "");
    }

    #[test]
    fn json_that_is_not_json_is_shown_as_text_and_marked() {
        let shown = show(Some(b"plain words"), Encoding::Json);
        assert_eq!(shown["text"], "plain words");
        assert_eq!(shown["not_json"], true);
    }

    #[test]
    fn invalid_utf8_is_replaced_not_refused() {
        let shown = show(Some(b"ok\xff"), Encoding::Text);
        assert_eq!(shown["text"], "ok\u{fffd}");
    }

    #[test]
    fn long_values_are_cut_and_say_so() {
        let value = vec![b'x'; SHOWN_BYTES_MAX + 10];
        let shown = show(Some(&value), Encoding::Text);
        assert_eq!(shown["truncated"], true);
        assert_eq!(shown["size"], SHOWN_BYTES_MAX + 10);
        assert_eq!(shown["text"].as_str().map(str::len), Some(SHOWN_BYTES_MAX));
        // A cut JSON document cannot be parsed: text, marked.
        let mut doc = b"[".to_vec();
        doc.extend(std::iter::repeat_n(b'1', SHOWN_BYTES_MAX));
        doc.push(b']');
        assert_eq!(show(Some(&doc), Encoding::Json)["not_json"], true);
    }

    #[test]
    fn lag_is_end_minus_committed_and_never_negative() {
        assert_eq!(lag(Some(7), Some(10)), Some(3));
        assert_eq!(lag(Some(10), Some(10)), Some(0));
        assert_eq!(lag(Some(12), Some(10)), Some(0));
        assert_eq!(lag(None, Some(10)), None);
        assert_eq!(lag(Some(-1), Some(10)), None);
        assert_eq!(lag(Some(3), None), None);
        assert_eq!(total_lag([Some(3), None, Some(4)]), 7);
        assert_eq!(total_lag([Some(i64::MAX), Some(1)]), i64::MAX);
    }

    #[test]
    fn partition_states() {
        assert_eq!(PartitionState::of(1, 3, 3), PartitionState::Online);
        assert_eq!(PartitionState::of(1, 3, 2), PartitionState::UnderReplicated);
        assert_eq!(PartitionState::of(-1, 3, 0), PartitionState::Offline);
    }

    #[test]
    fn topic_names_follow_kafka() {
        assert!(check_topic_name("orders.v1_eu-west").is_ok());
        assert!(check_topic_name("").is_err());
        assert!(check_topic_name("..").is_err());
        assert!(check_topic_name("a/b").is_err());
        assert!(check_topic_name("<script>").is_err());
        assert!(check_topic_name(&"a".repeat(250)).is_err());
        assert!(check_group_id("readers 1").is_ok());
        assert!(check_group_id("bad\nid").is_err());
        assert!(check_group_id("").is_err());
    }

    #[test]
    fn query_strings_are_decoded() {
        let q = parse_query("partition=2&key=a%20b+c&from=end&bad=%zz&trail=%4");
        assert_eq!(q["partition"], "2");
        assert_eq!(q["key"], "a b c");
        assert_eq!(q["from"], "end");
        assert_eq!(q["bad"], "%zz");
        assert_eq!(q["trail"], "%4");
        assert_eq!(parse_query("").len(), 0);
        assert_eq!(parse_query("k=%E2%82%AC")["k"], "€");
    }

    #[test]
    fn tail_start_is_limit_before_the_end_within_the_log() {
        assert_eq!(tail_start(0, 100, 10), 90);
        assert_eq!(tail_start(95, 100, 10), 95);
        assert_eq!(tail_start(0, 0, 10), 0);
    }

    #[test]
    fn key_filter() {
        assert!(key_matches(Some(b"user-42"), "42"));
        assert!(!key_matches(Some(b"user-42"), "43"));
        assert!(!key_matches(None, "x"));
        assert!(key_matches(None, ""));
    }

    #[test]
    fn encodings_parse() {
        assert_eq!("hex".parse::<Encoding>(), Ok(Encoding::Hex));
        assert!("base64".parse::<Encoding>().is_err());
    }
}
