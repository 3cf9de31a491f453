//! The encoded size of a tool result, bounded. A legacy answer is one server-sent event holding the
//! JSON-RPC envelope with the structured result *and* its text copy (the same JSON, escaped again as a
//! string), and the Python SDK refuses an event over 1 MiB. Raw byte caps are not enough: a control
//! byte costs 13 bytes on the wire (`\u0001` once, `\\u0001` in the copy). This module measures what a
//! result costs as sent ([`encoded_size`]), what a piece of text costs ([`cost`]), and clips text to a
//! budget ([`clip`]); the tools use it to fit every answer under [`MAX_RESULT_BYTES`], cutting with
//! the truncation flags and counts they already have rather than failing.

use serde::Serialize;

/// Every official client's per-message limit (1 MiB), less 16 KiB for the envelope and SSE framing.
pub const MAX_RESULT_BYTES: usize = 1024 * 1024 - 16 * 1024;

/// Bytes one character of a string field costs in a result: JSON-escaped in `structuredContent`, and
/// escaped once more in the text copy.
pub fn char_cost(c: char) -> usize {
    match c {
        '"' | '\\' => 2 + 4,
        '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2 + 3,
        c if (c as u32) < 0x20 => 6 + 7,
        c => 2 * c.len_utf8(),
    }
}

/// What `text` costs in a result (see [`char_cost`]).
pub fn cost(text: &str) -> usize {
    text.chars().map(char_cost).sum()
}

/// The longest prefix of `text` that costs at most `budget`, and whether it is shorter than `text`.
pub fn clip(text: &str, budget: usize) -> (&str, bool) {
    let mut spent = 0;
    for (at, c) in text.char_indices() {
        spent += char_cost(c);
        if spent > budget {
            return (&text[..at], true);
        }
    }
    (text, false)
}

/// Counts the bytes of compact JSON written to it twice: as written, and escaped once more as the
/// text copy's string. serde_json's compact output holds no raw control character, so only `"` and
/// `\` grow when escaped (every other byte, UTF-8 ones included, stays one byte).
struct SizeCounter(usize);

impl std::io::Write for SizeCounter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.iter().map(|&b| if b == b'"' || b == b'\\' { 3 } else { 2 }).sum::<usize>();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What a tool result with this structured content costs as sent: the compact JSON once, plus its
/// text copy as an escaped JSON string. Counted as it is serialised: no copy of the result is made.
pub fn encoded_size<T: Serialize>(value: &T) -> usize {
    // The text copy's two quotes.
    let mut counter = SizeCounter(2);
    match serde_json::to_writer(&mut counter, value) {
        Ok(()) => counter.0,
        Err(_) => 0,
    }
}

/// Budgets for two streams sharing `budget`: each gets what it needs when both fit; otherwise the
/// smaller keeps what it needs up to half, and the other gets the rest.
pub fn split_budget(a: usize, b: usize, budget: usize) -> (usize, usize) {
    if a + b <= budget {
        return (a, b);
    }
    let half = budget / 2;
    if a <= half {
        (a, budget - a)
    } else if b <= half {
        (budget - b, b)
    } else {
        (half, budget - half)
    }
}

/// Drops entries from the end of the list `items` picks out of `value` until `value` fits the bound;
/// true when any was dropped (the list's `truncated` flag).
pub fn fit_list<T: Serialize, E>(value: &mut T, items: impl Fn(&mut T) -> &mut Vec<E>) -> bool {
    let mut cut = false;
    loop {
        let size = encoded_size(value);
        let list = items(value);
        if size <= MAX_RESULT_BYTES || list.is_empty() {
            return cut;
        }
        let drop = (list.len() as u128 * (size - MAX_RESULT_BYTES) as u128 / size as u128) as usize + 1;
        list.truncate(list.len().saturating_sub(drop));
        cut = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::CallToolResult;
    use serde_json::json;

    /// The real thing: the JSON-RPC response rmcp sends for a structured result.
    fn sent(value: &serde_json::Value) -> usize {
        let result = CallToolResult::structured(value.clone());
        let envelope = json!({"jsonrpc": "2.0", "id": 1, "result": result});
        envelope.to_string().len()
    }

    #[test]
    fn cost_matches_what_is_sent() {
        for text in ["plain", "\u{1}\u{1}\u{2}", "quote \" and \\ and\nnew\tline", "é ü ✓ 😀", "\u{7f}\u{1f}"] {
            let empty = sent(&json!({"stdout": ""}));
            assert_eq!(sent(&json!({"stdout": text})) - empty, cost(text), "{text:?}");
            let value = json!({"stdout": text, "n": 1});
            let compact = value.to_string();
            assert_eq!(encoded_size(&value), compact.len() + json!(compact).to_string().len(), "{text:?}");
            let overhead = sent(&value) - encoded_size(&value);
            assert!(overhead < 200, "{overhead}");
        }
    }

    #[test]
    fn clip_stays_within_budget_on_char_boundaries() {
        let text = "a\u{1}é😀\"".repeat(100);
        for budget in [0, 1, 12, 13, 14, 100, 999, 100_000] {
            let (kept, cut) = clip(&text, budget);
            assert!(cost(kept) <= budget);
            assert_eq!(cut, kept.len() < text.len());
            if cut {
                let next = text[kept.len()..].chars().next().unwrap();
                assert!(cost(kept) + char_cost(next) > budget);
            }
        }
    }

    #[test]
    fn fit_list_drops_from_the_end_until_it_fits() {
        let mut value = json!({"items": (0..40_000).map(|i| format!("entry \u{1} {i}")).collect::<Vec<_>>()});
        fn items(v: &mut serde_json::Value) -> &mut Vec<serde_json::Value> {
            v["items"].as_array_mut().unwrap()
        }
        assert!(encoded_size(&value) > MAX_RESULT_BYTES);
        assert!(fit_list(&mut value, items));
        assert!(encoded_size(&value) <= MAX_RESULT_BYTES);
        assert!(encoded_size(&value) > MAX_RESULT_BYTES * 9 / 10, "not cut too far");
        assert_eq!(value["items"][0], "entry \u{1} 0");
        assert!(!fit_list(&mut value, items));
    }

    #[test]
    fn split_budget_favours_the_smaller_stream() {
        assert_eq!(split_budget(10, 20, 100), (10, 20));
        assert_eq!(split_budget(10, 200, 100), (10, 90));
        assert_eq!(split_budget(200, 10, 100), (90, 10));
        assert_eq!(split_budget(200, 200, 100), (50, 50));
    }
}
