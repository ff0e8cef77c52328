//! Tracing setup: text or JSON lines on stderr, filtered by `RUST_LOG` when
//! set, else by the config's level.

use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("log level {level:?} is not a valid filter: {reason}")]
    BadFilter { level: String, reason: String },
}

/// Installs the global subscriber. Calling it twice keeps the first one.
pub fn init(level: &str, format: Format) -> Result<(), TelemetryError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(env) if !env.is_empty() => EnvFilter::try_new(&env),
        _ => EnvFilter::try_new(level),
    }
    .map_err(|e| TelemetryError::BadFilter {
        level: level.to_string(),
        reason: e.to_string(),
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, never in journald
        // or a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = match format {
        Format::Text => builder.try_init(),
        Format::Json => builder.json().flatten_event(true).try_init(),
    };
    Ok(())
}
