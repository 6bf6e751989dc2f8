//! The demo's services on a test's own database (schemas `catalog`, `engagement` and `search`,
//! each owned by a role of this test) and a Pub/Sub project of its own on the emulator.

#![allow(dead_code)]

use courier::CourierConfig;
use courier_demo::client::Api;
use courier_demo::stack::{self, Configs, Stack};
use courier_testkit::{TestDb, TestPubSub};
use serde_json::json;
use std::time::Duration;
use uuid::Uuid;

pub const TOKEN: &str = "test-token-0123456789";

pub struct TestStack {
    pub db: TestDb,
    pub pubsub: TestPubSub,
    pub catalog_config: CourierConfig,
    pub engagement_config: CourierConfig,
    pub search_config: CourierConfig,
    pub stack: Option<Stack>,
}

/// The services' run options in these tests: an escalation fails the test.
pub use courier_testkit::run_options;

fn service_config(
    db: &TestDb,
    pubsub: &TestPubSub,
    project: &courier::config::PubSubConfig,
    schema: &str,
    token: Option<&str>,
) -> CourierConfig {
    let mut config = courier_testkit::service_config(db, pubsub, project, schema);
    config.http.auth_token = token.map(str::to_owned);
    config.http.read_wait_millis = 3_000;
    config
}

impl TestStack {
    /// Prepares (migrate + provision, subscriptions with a 10 s ack deadline so a killed
    /// consumer's messages come back quickly) and starts both services.
    pub async fn start(token: Option<&str>) -> anyhow::Result<Self> {
        let mut prepared = Self::prepared(token).await?;
        prepared.stack = Some(Stack::start(&prepared.configs(), run_options()).await?);
        Ok(prepared)
    }

    /// Migrated and provisioned; nothing running yet.
    pub async fn prepared(token: Option<&str>) -> anyhow::Result<Self> {
        Self::prepared_with(token, |_| {}).await
    }

    /// As [`TestStack::prepared`], with a change to every subscription before it is created.
    pub async fn prepared_with(
        token: Option<&str>,
        tweak: impl Fn(&mut courier::pubsub::SubscriptionSpec),
    ) -> anyhow::Result<Self> {
        courier_testkit::init_logging();
        let db = TestDb::new().await?;
        let pubsub = TestPubSub::get().await?;
        let project = pubsub.isolated_config();
        let catalog_config = service_config(&db, &pubsub, &project, "catalog", token);
        let engagement_config = service_config(&db, &pubsub, &project, "engagement", token);
        let search_config = service_config(&db, &pubsub, &project, "search", None);
        let client = pubsub.client_for(&project);
        for (service, name) in [
            (courier_catalog::service(), courier_catalog::NAME),
            (courier_engagement::service(), courier_engagement::NAME),
            (courier_search::service(), courier_search::NAME),
        ] {
            for inbound in &service.inbound {
                let mut spec = inbound.subscription(name);
                spec.ack_deadline_secs = 10;
                tweak(&mut spec);
                client.provision(&spec).await?;
            }
        }
        let prepared = Self {
            db,
            pubsub,
            catalog_config,
            engagement_config,
            search_config,
            stack: None,
        };
        stack::prepare(&prepared.configs()).await?;
        Ok(prepared)
    }

    /// The services' configs, as the demo's stack takes them.
    pub fn configs(&self) -> Configs {
        Configs {
            catalog: self.catalog_config.clone(),
            engagement: self.engagement_config.clone(),
            search: Some(self.search_config.clone()),
        }
    }

    pub fn stack(&self) -> &Stack {
        self.stack.as_ref().expect("stack running")
    }

    pub fn catalog(&self) -> Api {
        self.stack().catalog_api()
    }

    pub fn engagement(&self) -> Api {
        self.stack().engagement_api()
    }

    pub fn search(&self) -> Api {
        self.stack().search_api().expect("search runs")
    }

    /// Rows of `sql` (a `SELECT count(*) …`) as the test's superuser, who sees both schemas.
    pub async fn count(&self, sql: &str) -> i64 {
        let conn = self.db.pool.get().await.expect("connection");
        conn.query_one(sql, &[]).await.expect(sql).get(0)
    }

    /// The text value of `sql`'s first column and row, as the test's superuser.
    pub async fn text(&self, sql: &str) -> String {
        let conn = self.db.pool.get().await.expect("connection");
        conn.query_one(sql, &[]).await.expect(sql).get(0)
    }

    pub async fn outbox_rows(&self) -> (i64, i64) {
        (
            self.count("SELECT count(*) FROM catalog.outbox").await,
            self.count("SELECT count(*) FROM engagement.outbox").await,
        )
    }
}

impl Drop for TestStack {
    fn drop(&mut self) {
        if let Some(stack) = self.stack.take() {
            stack.catalog.kill();
            stack.engagement.kill();
            if let Some(search) = stack.search {
                search.kill();
            }
        }
    }
}

/// How long a test waits for the other service to see an event.
pub const FLOW: Duration = Duration::from_secs(30);

/// Creates a video through catalog's API; returns its id.
pub async fn create_video(catalog: &Api, title: &str) -> anyhow::Result<Uuid> {
    let body = json!({ "uploader_id": Uuid::new_v4(), "title": title, "duration_secs": 300 });
    let reply = catalog.post("/videos", &body).await?;
    anyhow::ensure!(
        reply.status == 201,
        "create: {} {}",
        reply.status,
        reply.body
    );
    Ok(reply.text("aggregate_id").parse()?)
}

/// Runs a `courier` command line in-process against the catalog's schema.
pub async fn courier(t: &TestStack, args: &[&str]) -> anyhow::Result<()> {
    let config = &t.catalog_config;
    let toml = format!(
        "[database]\nurl = {url:?}\nschema = \"catalog\"\n[pubsub]\nproject = {project:?}\nemulator_host = {host:?}\n",
        url = config.database.url,
        project = config.pubsub.project,
        host = config.pubsub.emulator_host.clone().unwrap_or_default(),
    );
    let path = std::env::temp_dir().join(format!(
        "{}.toml",
        courier_testkit::unique_name("courier-cli")
    ));
    std::fs::write(&path, toml)?;
    let mut line = vec!["courier", "--config", path.to_str().unwrap_or_default()];
    line.extend_from_slice(args);
    let result = courier_cli::run(<courier_cli::Cli as clap::Parser>::try_parse_from(line)?).await;
    let _ = std::fs::remove_file(&path);
    result
}
