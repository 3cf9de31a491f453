//! Parsing of the `GET /v2/sandboxes` query: metadata filter (percent-encoded
//! once or twice, as the SDK does), states, order, limit and page token.

use std::collections::HashMap;

use percent_encoding::percent_decode_str;

use crate::e2b::wire::SandboxState;
use crate::local::control::record::SandboxRecord;

/// Default and largest page size.
pub const MAX_LIMIT: usize = 100;

/// A parsed list query.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListFilter {
    /// `key=value` pairs that must all match; each value is kept in every decoding level seen.
    pub metadata: Vec<(Vec<String>, Vec<String>)>,
    /// Empty = every state.
    pub states: Vec<SandboxState>,
    pub limit: usize,
    pub next_token: Option<String>,
    pub descending: bool,
}

impl ListFilter {
    /// True if `metadata` has every requested pair.
    pub fn metadata_matches(&self, metadata: &HashMap<String, String>) -> bool {
        self.metadata.iter().all(|(keys, values)| {
            keys.iter().any(|k| metadata.get(k).is_some_and(|v| values.iter().any(|want| want == v)))
        })
    }
}

/// The page token of a record: sorts like (started_at, id).
pub fn page_key(rec: &SandboxRecord) -> String {
    format!("{:020}_{}", rec.started_at_ms.max(0), rec.id)
}

/// Every distinct decoding of `s` (as given, decoded once, decoded twice).
fn decodings(s: &str) -> Vec<String> {
    let mut out = vec![s.to_owned()];
    for _ in 0..2 {
        let Some(last) = out.last() else { break };
        let next = percent_decode_str(last).decode_utf8_lossy().into_owned();
        if next == *last {
            break;
        }
        out.push(next);
    }
    out
}

/// Why a list query was refused (the 400 answer's message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListQueryError {
    #[error("metadata filter '{0}' is not key=value")]
    Metadata(String),
    #[error("unknown state '{0}' (use running or paused)")]
    State(String),
    #[error("limit '{0}' is not a number")]
    LimitNotNumber(String),
    #[error("limit must be between 1 and {MAX_LIMIT}")]
    LimitOutOfRange,
    #[error("order '{0}' must be asc or desc")]
    Order(String),
}

/// Parses the raw query string.
pub fn parse(query: &str) -> Result<ListFilter, ListQueryError> {
    let mut filter = ListFilter { limit: MAX_LIMIT, ..Default::default() };
    for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
        match name.as_ref() {
            "metadata" => {
                // After the query decoding: `k=v&k2=v2`, each part possibly encoded once more.
                let outer = decodings(&value);
                if value.is_empty() {
                    continue;
                }
                let Some(text) = outer.iter().find(|d| d.contains('=')).cloned() else {
                    return Err(ListQueryError::Metadata(value.into_owned()));
                };
                for pair in text.split('&').filter(|p| !p.is_empty()) {
                    let Some((k, v)) = pair.split_once('=') else {
                        return Err(ListQueryError::Metadata(pair.to_owned()));
                    };
                    filter.metadata.push((decodings(k), decodings(v)));
                }
            }
            "state" => {
                for s in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    let state = match s {
                        "running" => SandboxState::Running,
                        "paused" => SandboxState::Paused,
                        other => return Err(ListQueryError::State(other.to_owned())),
                    };
                    if !filter.states.contains(&state) {
                        filter.states.push(state);
                    }
                }
            }
            "limit" => {
                let n: usize = value.parse().map_err(|_| ListQueryError::LimitNotNumber(value.to_string()))?;
                if n == 0 || n > MAX_LIMIT {
                    return Err(ListQueryError::LimitOutOfRange);
                }
                filter.limit = n;
            }
            "nextToken" => filter.next_token = Some(value.into_owned()).filter(|t| !t.is_empty()),
            "order" => {
                filter.descending = match value.as_ref() {
                    "asc" | "" => false,
                    "desc" => true,
                    other => return Err(ListQueryError::Order(other.to_owned())),
                }
            }
            _ => {}
        }
    }
    Ok(filter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn double_encoded_metadata_matches() {
        // What the SDK sends for {a: "b c"}.
        let f = parse("metadata=a%3Db%252520c&state=running,paused&limit=5").unwrap();
        let mut md = HashMap::new();
        md.insert("a".to_owned(), "b c".to_owned());
        assert!(f.metadata_matches(&md));
        md.insert("a".to_owned(), "other".to_owned());
        assert!(!f.metadata_matches(&md));
        assert_eq!(f.states, vec![SandboxState::Running, SandboxState::Paused]);
        assert_eq!(f.limit, 5);
    }

    #[test]
    fn single_encoded_and_plain_metadata() {
        let f = parse("metadata=a%3D1%26b%3D2").unwrap();
        let md: HashMap<String, String> =
            [("a", "1"), ("b", "2")].iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        assert!(f.metadata_matches(&md));
        assert_eq!(f.metadata.len(), 2);
    }

    #[test]
    fn bad_values_are_rejected() {
        assert!(parse("state=dead").is_err());
        assert!(parse("limit=0").is_err());
        assert!(parse("limit=x").is_err());
        assert!(parse("metadata=novalue").is_err());
        let message = |q: &str| parse(q).unwrap_err().to_string();
        assert_eq!(message("state=dead"), "unknown state 'dead' (use running or paused)");
        assert_eq!(message("limit=0"), "limit must be between 1 and 100");
        assert_eq!(message("limit=x"), "limit 'x' is not a number");
        assert_eq!(message("metadata=novalue"), "metadata filter 'novalue' is not key=value");
        assert_eq!(message("metadata=a%3D1%26b"), "metadata filter 'b' is not key=value");
        assert_eq!(message("order=up"), "order 'up' must be asc or desc");
    }
}
