//! Logging set-up for the binaries: `tracing` to stderr, text or JSON lines, level from
//! `RUST_LOG`.

/// Installs the global subscriber; `default_level` applies when `RUST_LOG` is unset.
pub fn init_logging(json: bool, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}
