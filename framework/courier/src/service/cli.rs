//! The command line every service binary shares: `serve`, `migrate`, `provision`.

use super::runtime::{self, RunOptions, RunningService};
use super::Service;
use crate::CourierConfig;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(version)]
struct Cli {
    /// Deployment config (TOML) [default: deploy/local/<service>.toml]. COURIER_<SECTION>__<KEY>
    /// variables and PUBSUB_EMULATOR_HOST override its keys.
    #[arg(long, env = crate::config::CONFIG_PATH_ENV, global = true)]
    config: Option<PathBuf>,
    /// Log as JSON lines instead of text (level from RUST_LOG, default info).
    #[arg(long, global = true)]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API and run the outbox relay and the consumers until SIGINT or SIGTERM.
    #[command(after_help = "Example:\n  SERVICE serve --migrate --provision")]
    Serve {
        /// Apply migrations before serving (see `migrate`).
        #[arg(long)]
        migrate: bool,
        /// Create topics and subscriptions before serving (see `provision`).
        #[arg(long)]
        provision: bool,
        /// On shutdown, how long in-flight requests and publishes may take to finish.
        #[arg(long, default_value_t = 10, value_name = "SECONDS")]
        grace_secs: u64,
    },
    /// Create the service's database role and schema (when `database.role` is set) and apply
    /// the framework's and the service's migrations, as `database.admin_url`.
    #[command(after_help = "Example:\n  SERVICE migrate --config deploy/local/SERVICE.toml")]
    Migrate,
    /// Create the service's outbound topics and its subscriptions with their dead-letter
    /// topics (idempotent; prints what it created).
    #[command(after_help = "Example:\n  PUBSUB_EMULATOR_HOST=127.0.0.1:8085 SERVICE provision")]
    Provision,
    /// Rebuild a projection: clear its tables, reset its offset (audited) and replay from
    /// Pub/Sub (Seek) while the service runs. Asks for confirmation unless --yes.
    #[command(
        after_help = "Example:\n  SERVICE rebuild --projection reader --from 2026-11-20T00:00:00Z --reason \"bug #12\" --yes"
    )]
    Rebuild {
        /// The inbound subscription's role (its consumer group is `<service>_<role>`).
        #[arg(long)]
        projection: String,
        /// Replay what was published since this time (RFC 3339) [default: 7 days ago, the
        /// longest Pub/Sub retains acked messages by default].
        #[arg(long)]
        from: Option<String>,
        /// Why, for the audit table.
        #[arg(long, default_value = "rebuild")]
        reason: String,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
}

/// The `main` of a service binary.
pub fn main(service: fn() -> Service) -> ExitCode {
    let name = service().name;
    let help = |text: &str| text.replace("SERVICE", name);
    let mut command = Cli::command().name(name).about(format!(
        "The {name} service on Courier: HTTP API, outbox relay, consumers"
    ));
    for sub in ["serve", "migrate", "provision"] {
        command = command.mut_subcommand(sub, |c| {
            let after = c
                .get_after_help()
                .map(|t| help(&t.to_string()))
                .unwrap_or_default();
            c.after_help(after)
        });
    }
    let cli = match Cli::from_arg_matches(&command.get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    crate::telemetry::init_logging(cli.log_json, "info");
    let path = cli
        .config
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("deploy/local/{name}.toml")));
    let config = match CourierConfig::load(&path) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(service, cli.command, config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(
    service: fn() -> Service,
    command: Command,
    config: CourierConfig,
) -> anyhow::Result<()> {
    match command {
        Command::Migrate => {
            let report = runtime::migrate(&service(), &config).await?;
            println!(
                "{}: applied {} migration(s), {} already applied",
                config.database.schema,
                report.applied.len(),
                report.already_applied
            );
            for name in report.applied {
                println!("  applied {name}");
            }
        }
        Command::Provision => {
            let created = runtime::provision(&service(), &config).await?;
            if created.is_empty() {
                println!("everything already exists");
            }
            for line in created {
                println!("created {line}");
            }
        }
        Command::Rebuild {
            projection,
            from,
            reason,
            yes,
        } => {
            let from = match from {
                Some(text) => chrono::DateTime::parse_from_rfc3339(&text)
                    .map(|t| t.with_timezone(&chrono::Utc))
                    .map_err(|e| anyhow::anyhow!("--from {text:?} is not an RFC 3339 time: {e}"))?,
                None => chrono::Utc::now() - chrono::Duration::days(7),
            };
            let service = service();
            let tables = service
                .inbound
                .iter()
                .find(|i| i.role == projection)
                .map(|i| i.tables.join(", "))
                .unwrap_or_default();
            if !yes {
                confirm(&format!(
                    "This deletes every row of {tables} in schema {} and replays {} events published since {from}.",
                    config.database.schema, service.name
                ), &projection)?;
            }
            let by = audit_actor();
            let report =
                runtime::rebuild(&service, &config, &projection, from, &by, &reason).await?;
            for (table, rows) in &report.cleared {
                println!("cleared {table}: {rows} row(s)");
            }
            println!(
                "group {} reset to {} (audit #{}), {} inbox row(s) forgotten; {} sought: the running consumer rebuilds the projection",
                report.group,
                report.reset.new_publish_time.to_rfc3339(),
                report.reset.audit_id,
                report.reset.inbox_rows_forgotten,
                report.subscription
            );
        }
        Command::Serve {
            migrate,
            provision,
            grace_secs,
        } => {
            let options = RunOptions {
                migrate,
                provision,
                ..RunOptions::default()
            };
            // One service per process: its series carry `service="<name>"`.
            crate::metrics::install_for_service(service().name);
            let running = RunningService::start(service(), &config, options).await?;
            println!("{} listening on http://{}", running.name, running.addr);
            wait_for_signal().await;
            tracing::info!("shutting down");
            running.shutdown(Duration::from_secs(grace_secs)).await;
        }
    }
    Ok(())
}

/// Who is acting, for audit rows: the login name, else "unknown".
pub fn audit_actor() -> String {
    ["USER", "LOGNAME"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
        .unwrap_or_else(|| "unknown".into())
}

/// Asks on the terminal to type `word`; refuses when stdin is not a terminal (use --yes).
fn confirm(warning: &str, word: &str) -> anyhow::Result<()> {
    use std::io::{BufRead, IsTerminal, Write};
    anyhow::ensure!(
        std::io::stdin().is_terminal(),
        "refusing without --yes: stdin is not a terminal to confirm on"
    );
    print!("{warning}\nType {word:?} to go on: ");
    std::io::stdout().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    anyhow::ensure!(answer.trim() == word, "not confirmed; nothing changed");
    Ok(())
}

/// SIGINT (Ctrl-C) or SIGTERM (what Cloud Run and Kubernetes send).
pub async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
