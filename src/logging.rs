//! Process-wide `tracing` set-up: human-readable lines on a terminal, JSON
//! lines otherwise (production), filtered by `RUST_LOG` (default [`DEFAULT_FILTER`]).

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
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = if json { builder.json().flatten_event(true).try_init() } else { builder.try_init() };
}
