//! The command line every service binary shares: `serve`, `migrate`, `provision`, `rebuild`,
//! `backfill`. A service's `main` is `courier_cli::service::main(my_service::service)`; the
//! framework crate itself carries no command-line dependencies.

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use courier::service::runtime::{self, RunOptions, RunningService};
use courier::service::{wait_for_signal, Service};
use courier::CourierConfig;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(version)]
struct Cli {
    /// Deployment config (TOML) [default: deploy/local/<service>.toml]. COURIER_<SECTION>__<KEY>
    /// variables and PUBSUB_EMULATOR_HOST override its keys.
    #[arg(long, env = courier::config::CONFIG_PATH_ENV, global = true)]
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
    /// Emit a full-snapshot event of every existing aggregate (every video, …) through the
    /// outbox, so a new read model can be built from it. Each batch bumps its aggregates'
    /// versions and commits their snapshots with the run's progress: a run stopped at any
    /// point resumes after its last committed batch when started again. Consumers must know
    /// the snapshot event before it runs.
    #[command(after_help = "Examples:\n  \
        SERVICE backfill --dry-run                       # count what would be emitted, write nothing\n  \
        SERVICE backfill --batch-size 500 --reason \"search index\"\n  \
        SERVICE backfill --status                        # recent runs and their progress\n\n\
        Starting again while a run is unfinished resumes it. Live writes go on meanwhile: \
        a batch holds its aggregates' row locks until it commits.")]
    Backfill {
        /// The aggregate type to snapshot [default: the service's only one].
        #[arg(long)]
        aggregate: Option<String>,
        /// Aggregates per transaction (1 to 10000).
        #[arg(long, default_value_t = courier::backfill::DEFAULT_BATCH_SIZE,
              value_parser = clap::value_parser!(u32).range(1..=i64::from(courier::backfill::MAX_BATCH_SIZE)))]
        batch_size: u32,
        /// Count what would be emitted (and which run would resume); write nothing.
        #[arg(long, conflicts_with = "status")]
        dry_run: bool,
        /// Show the latest runs instead of running one.
        #[arg(long)]
        status: bool,
        /// Why, recorded with the run.
        #[arg(long, default_value = "backfill")]
        reason: String,
    },
}

/// The `main` of a service binary.
pub fn main(service: fn() -> Service) -> ExitCode {
    let name = service().name;
    let help = |text: &str| text.replace("SERVICE", name);
    let mut command = Cli::command().name(name).about(format!(
        "The {name} service on Courier: HTTP API, outbox relay, consumers"
    ));
    for sub in ["serve", "migrate", "provision", "rebuild", "backfill"] {
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
    let spans = match courier::telemetry::init(
        cli.log_json,
        "info",
        &config.telemetry,
        name,
        &config.pubsub.project,
    ) {
        Ok(provider) => provider,
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
    let result = runtime.block_on(run(service, cli.command, config));
    // Sends the spans still batched; an unreachable collector costs them, not the exit.
    let _ = spans.shutdown();
    match result {
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
        Command::Backfill {
            aggregate,
            batch_size,
            dry_run,
            status,
            reason,
        } => {
            backfill(
                &service(),
                &config,
                aggregate.as_deref(),
                batch_size,
                dry_run,
                status,
                &reason,
            )
            .await?;
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
            courier::metrics::install_for_service(service().name);
            let running = RunningService::start(service(), &config, options).await?;
            println!("{} listening on http://{}", running.name, running.addr);
            wait_for_signal().await;
            tracing::info!("shutting down");
            running.shutdown(Duration::from_secs(grace_secs)).await;
        }
    }
    Ok(())
}

/// `SERVICE backfill`: dry run, status, or a run (started or resumed) with a progress bar on
/// a terminal and a summary line either way.
async fn backfill(
    service: &Service,
    config: &CourierConfig,
    aggregate: Option<&str>,
    batch_size: u32,
    dry_run: bool,
    status: bool,
    reason: &str,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use courier::backfill::Backfill;
    let source = service.backfill(aggregate)?;
    let pool = courier::db::pool(&config.database, &format!("{}-backfill", service.name))?;
    let backfill = Backfill::new(pool, config, source);
    let kind = backfill.aggregate_type();
    if status {
        let runs = backfill.runs(20).await?;
        if runs.is_empty() {
            println!("no backfill has run in schema {}", config.database.schema);
        }
        for run in runs {
            let state = match run.finished_at {
                Some(at) => format!("finished {}", at.to_rfc3339()),
                None => format!(
                    "UNFINISHED, last batch {} (resumes after {})",
                    run.updated_at.to_rfc3339(),
                    run.cursor.as_deref().unwrap_or("the start")
                ),
            };
            println!(
                "run #{} {}: {} snapshot(s) in {} batch(es), started {} by {} ({}); {state}",
                run.run_id,
                run.aggregate_type,
                run.emitted,
                run.batches,
                run.started_at.to_rfc3339(),
                run.started_by,
                run.reason
            );
        }
        return Ok(());
    }
    if dry_run {
        let plan = backfill.plan().await?;
        match &plan.resumes {
            Some(run) => println!(
                "dry run: would resume {kind} run #{} ({} snapshot(s) already emitted) and emit {} more, in batches of {batch_size}; nothing written",
                run.run_id, run.emitted, plan.would_emit
            ),
            None => println!(
                "dry run: would emit {} {kind} snapshot(s) in batches of {batch_size}; nothing written",
                plan.would_emit
            ),
        }
        return Ok(());
    }
    let by = audit_actor();
    let bar = indicatif::ProgressBar::new(0);
    if let Ok(style) = indicatif::ProgressStyle::with_template(&format!(
        "{{elapsed_precise}} [{{bar:40}}] {{pos}}/{{len}} {kind} snapshots ({{per_sec}}, eta {{eta}})"
    )) {
        bar.set_style(style.progress_chars("=> "));
    }
    let report = backfill
        .run(batch_size, &by, reason, |p| {
            bar.set_length(u64::try_from(p.total).unwrap_or(0));
            bar.set_position(u64::try_from(p.emitted).unwrap_or(0));
        })
        .await
        .with_context(|| {
            format!("{kind} backfill stopped; run the same command again to resume it")
        })?;
    bar.finish_and_clear();
    println!(
        "{kind} backfill run #{} finished{}: {} snapshot(s) in {} batch(es) now, {} in the whole run",
        report.run_id,
        if report.resumed { " (resumed)" } else { "" },
        report.emitted_now,
        report.batches_now,
        report.emitted_total
    );
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
