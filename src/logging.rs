//! Process-wide `tracing` set-up: human-readable lines on a terminal, JSON
//! lines otherwise (production), filtered by `RUST_LOG` (default [`DEFAULT_FILTER`]); and
//! [`escaped`], the form in which text a sandbox produced goes into a log line.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// `info`, but rmcp's own per-session INFO lines (four per session) only from `warn`: the gateway
/// logs one line per session and per tool call itself.
pub const DEFAULT_FILTER: &str = "info,rmcp=warn";

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// JSON unless stderr is a terminal.
    #[default]
    Auto,
    Json,
    Text,
}

/// Installs the global subscriber. Safe to call more than once (later calls are ignored).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    // A log line that cannot be written (stderr a pipe whose reader is gone) is dropped: by default
    // the subscriber reports it with `eprintln!`, which panics on the same broken stderr and took
    // down the task that logged (the one waiting for SIGTERM among them).
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).log_internal_errors(false);
    let _ = if json { builder.json().flatten_event(true).try_init() } else { builder.try_init() };
}

/// `value` as text fit for one log line: control characters (newlines, carriage returns, ANSI
/// escapes, C1 codes) and the Unicode line separators and bidirectional overrides written as
/// `\n`, `\r`, `\t` or `\u{..}`, so that text a sandbox produced (a template's start or ready
/// command output, an agent's set-up error, a build step's output) cannot forge log lines or
/// recolour a terminal. Everything else is kept as it is.
pub fn escaped(value: impl std::fmt::Display) -> Escaped {
    Escaped(value.to_string())
}

/// Text to be written escaped (see [`escaped`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Escaped(String);

impl std::fmt::Display for Escaped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write;
        for c in self.0.chars() {
            match c {
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                c if c.is_control()
                    || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}') =>
                {
                    write!(f, "{}", c.escape_unicode())?
                }
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::escaped;

    #[test]
    fn escaped_text_stays_on_one_line_without_terminal_controls() {
        let forged = "not ready\n2024-01-01T00:00:00Z  INFO sandbox created\r\x1b[31mred\x1b[0m\tend";
        let line = escaped(forged).to_string();
        assert_eq!(line, "not ready\\n2024-01-01T00:00:00Z  INFO sandbox created\\r\\u{1b}[31mred\\u{1b}[0m\\tend");
        assert!(!line.chars().any(char::is_control), "{line:?}");
    }

    #[test]
    fn escaped_keeps_ordinary_text_and_escapes_unicode_separators() {
        assert_eq!(escaped("exit status 1: café \"quoted\" \\n").to_string(), "exit status 1: café \"quoted\" \\n");
        assert_eq!(escaped("a\u{2028}b\u{202e}c\u{85}d").to_string(), "a\\u{2028}b\\u{202e}c\\u{85}d");
        assert_eq!(escaped(std::io::Error::other("x\ny")).to_string(), "x\\ny");
    }
}
