//! `courier console`: the pipeline on one web page, with the actions an on-call engineer takes.
//!
//! One page (`/console/`) and the JSON API behind it (`/console/api/…`), over the services it
//! is given (a config each): relays, outbox backlog per topic and shard, dead rows, consumer
//! groups, parked keys, the dead-letter keepers' messages grouped by reason and event type, the
//! audit log and the xmin-horizon warning. The page polls the API; its HTML, CSS and script are
//! compiled into the binary (`assets/`), so nothing is fetched from the network.
//!
//! Actions (retry or skip a dead row, release a parked key, republish dead letters) call the
//! same functions as `courier outbox`, `courier parked` and `courier dlq`, are audited with who
//! and why, and need the bearer token of `http.auth_token` (or `http.auth_token_file`); without
//! one configured the console is read-only.
//!
//! # Layout
//! - `state.rs`: the services looked at and the snapshot the page shows.
//! - `api.rs`: the HTTP routes (page, assets, state, actions) and who may act.
//! - `dead_letters.rs`: the held dead-letter keepers.
//! - `assets/`: the page.

mod api;
mod dead_letters;
mod state;

pub use api::routes;
pub use state::Console;

use anyhow::Context as _;
use courier::pubsub::PubSub;
use courier::CourierConfig;
use std::io::Write as _;
use std::path::PathBuf;

#[derive(clap::Args)]
#[command(after_help = "Examples:
  courier --config deploy/local/catalog.toml console
  courier --config deploy/local/catalog.toml console \\
      --service deploy/local/catalog.toml --service deploy/local/engagement.toml --listen 0.0.0.0:8095

Open http://127.0.0.1:8095/console/ . Actions need the bearer token of the --config's
http.auth_token (or http.auth_token_file); without one the console is read-only.")]
pub struct ConsoleArgs {
    /// A service's config; repeat for several services [default: the global --config].
    #[arg(long = "service", value_name = "CONFIG")]
    services: Vec<PathBuf>,
    /// Address to serve the page on (port 0: any free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:8095")]
    listen: String,
    /// Warn when a transaction has held the xmin horizon back this long (seconds).
    #[arg(long, value_name = "SECS", default_value_t = crate::status::HORIZON_WARN_SECS)]
    horizon_warn_secs: u64,
}

/// Serves the console until SIGINT or SIGTERM. The global `--config` gives the token (its
/// `http.auth_token`) and Pub/Sub; `--service` configs the services shown.
pub async fn run(config: CourierConfig, args: ConsoleArgs) -> anyhow::Result<()> {
    let configs = if args.services.is_empty() {
        vec![config.clone()]
    } else {
        args.services
            .iter()
            .map(|path| crate::load_config(path).map_err(|e| anyhow::anyhow!("--service: {e:#}")))
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    let token = config.http.auth_token.is_some();
    let console = Console::new(
        configs,
        PubSub::new(config.pubsub.clone()),
        args.horizon_warn_secs,
        token,
    )?;
    let listen = args.listen.clone();
    // actix-web's server and workers run on an actix System of their own thread.
    tokio::task::spawn_blocking(move || {
        actix_web::rt::System::new().block_on(api::serve(console, config, &listen))
    })
    .await
    .context("the console's server thread")?
}

/// Prints where the console listens (the first line of output, which tests read).
fn announce(addr: std::net::SocketAddr, writable: bool) -> anyhow::Result<()> {
    let mode = if writable {
        "actions need the bearer token of http.auth_token"
    } else {
        "read-only: no http.auth_token configured"
    };
    let mut out = std::io::stdout();
    writeln!(out, "courier console on http://{addr}/console/ ({mode})")?;
    out.flush()?;
    Ok(())
}
