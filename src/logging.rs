//! The log filter. Logs never contain a request body (docs/PROTOCOL.md §2.6): our own events carry tenant
//! and ticket ids only, and the PostgreSQL client, which logs statement parameters (bodies
//! included) at `debug`, is capped at `info`.

use tracing_subscriber::EnvFilter;

/// The filter for `TICKETFLOW_LOG` (tracing `EnvFilter` syntax; default `warn`). When the spec
/// asks for `debug` or `trace`, `tokio_postgres` and `postgres` are capped at `info`; a quieter
/// spec is left alone (appending `=info` would raise it). An unparsable spec falls back to
/// `warn`.
pub fn filter(spec: Option<&str>) -> EnvFilter {
    let spec = spec.unwrap_or("warn");
    let capped = if spec.contains("debug") || spec.contains("trace") {
        format!("{spec},tokio_postgres=info,postgres=info")
    } else {
        spec.to_string()
    };
    EnvFilter::try_new(&capped).unwrap_or_else(|_| EnvFilter::new("warn"))
}
