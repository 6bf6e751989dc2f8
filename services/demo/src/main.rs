//! `courier-demo`: the three services on the local default stack, a scripted story through their
//! HTTP APIs, a table of what flowed where, then serving until Ctrl-C.

use anyhow::Context as _;
use clap::Parser;
use courier::service::RunOptions;
use courier::CourierConfig;
use courier_demo::{injected, scenario, stack};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// mimalloc, as in the benchmarks: the relay allocates rows on its actor thread and the Pub/Sub
/// client frees them on others; with glibc's malloc that cost a quarter of the actor thread
/// (`courier-load drain`), and fragmentation grew the process with every 25,000 new ordering
/// keys (`tests/distinct_keys.rs`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "courier-demo",
    version,
    about = "Runs the catalog, engagement and search services, drives a short story through \
             their HTTP APIs and prints what flowed where",
    after_help = "Example (PostgreSQL and the emulator must be up; scripts/demo starts them):\n  \
                  PUBSUB_EMULATOR_HOST=127.0.0.1:8085 courier-demo --exit"
)]
struct Args {
    /// The catalog's config; COURIER_* variables are NOT applied to it (they would apply to
    /// every service), PUBSUB_EMULATOR_HOST is.
    #[arg(long, default_value = "deploy/local/catalog.toml")]
    catalog_config: PathBuf,
    /// The engagement service's config.
    #[arg(long, default_value = "deploy/local/engagement.toml")]
    engagement_config: PathBuf,
    /// The search service's config.
    #[arg(long, default_value = "deploy/local/search.toml")]
    search_config: PathBuf,
    /// Exit after the table instead of serving until Ctrl-C.
    #[arg(long)]
    exit: bool,
    /// Longest wait for one service to see the other's events.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    wait_secs: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    courier::telemetry::init_logging(false, "warn");
    match actix_rt::System::new().block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A service config: the file, plus `PUBSUB_EMULATOR_HOST` only.
fn load(path: &PathBuf) -> anyhow::Result<CourierConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    let emulator = std::env::vars().filter(|(name, _)| name == "PUBSUB_EMULATOR_HOST");
    CourierConfig::from_toml_and_env(&text, emulator)
        .with_context(|| format!("config {}", path.display()))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let configs = stack::Configs {
        catalog: load(&args.catalog_config)?,
        engagement: load(&args.engagement_config)?,
        search: Some(load(&args.search_config)?),
    };
    let wait = Duration::from_secs(args.wait_secs);

    println!("== preparing: databases, roles, schemas, topics, subscriptions");
    for line in stack::prepare(&configs).await? {
        println!("   {line}");
    }
    let options = RunOptions::default();
    let running = stack::Stack::start(&configs, options).await?;
    let search = running.search_api().context("the stack runs search")?;
    println!(
        "== running: catalog on http://{}, engagement on http://{}, search on {}",
        running.catalog.addr,
        running.engagement.addr,
        search.base()
    );

    // The database may hold earlier runs' events: the table counts this run's.
    let started = chrono::Utc::now();
    println!("== the story");
    let story = scenario::run(
        &scenario::Apis {
            catalog: running.catalog_api(),
            engagement: running.engagement_api(),
            search: search.clone(),
        },
        wait,
        |line| println!("   {line}"),
    )
    .await;
    let story = match story {
        Ok(story) => story,
        Err(e) => {
            running.shutdown(Duration::from_secs(5)).await;
            return Err(e);
        }
    };

    let mut admin = admin_client(&configs.catalog).await?;
    let deadline = tokio::time::Instant::now() + wait;
    let flows = loop {
        let flows = scenario::flows(&admin, started).await?;
        let settled = flows
            .iter()
            .all(|f| f.pending == 0 && f.projected >= f.published);
        if settled || tokio::time::Instant::now() >= deadline {
            break flows;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "== what flowed where ({} videos, {} users)",
        story.videos.len(),
        story.users.len()
    );
    print!("{}", scenario::table(&flows));

    if args.exit {
        running.shutdown(Duration::from_secs(5)).await;
        return Ok(());
    }
    // Something for the console to act on (scripts/demo serves it on :8095).
    let pubsub = courier::pubsub::PubSub::new(configs.catalog.pubsub.clone());
    let injected = injected::inject(&mut admin, &pubsub, story.videos[0], "Cats at night").await?;
    println!(
        "== a dead letter: video {} v{} retitled {:?}, dead-lettered as if {} had refused it; \
         search does not find \"night\" until it is republished (the console's Republish, or \
         courier dlq republish --subscription {})",
        injected.video,
        injected.version,
        injected.title,
        injected::SUBSCRIPTION,
        injected::SUBSCRIPTION
    );
    println!(
        "== serving until Ctrl-C (try: curl http://{}/videos/{}, curl '{}/search?q=night')",
        running.catalog.addr,
        story.videos[0],
        search.base()
    );
    courier::service::wait_for_signal().await;
    println!("== stopping");
    running.shutdown(Duration::from_secs(10)).await;
    Ok(())
}

async fn admin_client(config: &CourierConfig) -> anyhow::Result<tokio_postgres::Client> {
    let admin = courier::config::DatabaseConfig {
        url: config
            .database
            .admin_url
            .clone()
            .unwrap_or_else(|| config.database.url.clone()),
        ..config.database.clone()
    };
    let (client, connection) = courier::db::dedicated(&admin, "courier-demo")
        .await
        .context("connect to the database to read the flows")?;
    actix_rt::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}
