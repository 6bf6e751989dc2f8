use anyhow::Context as _;
use courier::config::DatabaseConfig;
use courier::db::PgPool;
use tokio_postgres::NoTls;

const DEFAULT_SERVER: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A database of its own for one test, migrated, dropped on drop.
pub struct TestDb {
    pub name: String,
    /// Points at the test database, schema `courier`.
    pub config: DatabaseConfig,
    pub pool: PgPool,
    server: tokio_postgres::Config,
}

fn server_config() -> anyhow::Result<tokio_postgres::Config> {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_SERVER.into());
    url.parse()
        .with_context(|| format!("DATABASE_URL {url:?} is not a PostgreSQL connection string"))
}

/// `key=value` connection string for `config` with another database name.
fn with_dbname(config: &tokio_postgres::Config, dbname: &str) -> String {
    use tokio_postgres::config::Host;
    let mut parts = Vec::new();
    if let Some(Host::Tcp(host)) = config.get_hosts().first() {
        parts.push(format!("host={host}"));
    }
    #[cfg(unix)]
    if let Some(Host::Unix(path)) = config.get_hosts().first() {
        parts.push(format!("host={}", path.display()));
    }
    if let Some(port) = config.get_ports().first() {
        parts.push(format!("port={port}"));
    }
    if let Some(user) = config.get_user() {
        parts.push(format!("user={user}"));
    }
    if let Some(password) = config.get_password() {
        parts.push(format!(
            "password='{}'",
            String::from_utf8_lossy(password).replace('\'', "\\'")
        ));
    }
    parts.push(format!("dbname={dbname}"));
    parts.join(" ")
}

async fn admin(server: &tokio_postgres::Config) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = server
        .connect(NoTls)
        .await
        .context("cannot connect to PostgreSQL (is it running? see README)")?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

impl TestDb {
    /// Creates a fresh database and applies the framework's migrations to schema `courier`.
    pub async fn new() -> anyhow::Result<Self> {
        Self::on_server(server_config()?).await
    }

    /// [`TestDb::new`] on the server `url` names (a cluster of the caller's own) instead of
    /// `DATABASE_URL`'s.
    pub async fn on_server_url(url: &str) -> anyhow::Result<Self> {
        let server = url
            .parse()
            .with_context(|| format!("{url:?} is not a PostgreSQL connection string"))?;
        Self::on_server(server).await
    }

    async fn on_server(server: tokio_postgres::Config) -> anyhow::Result<Self> {
        let name = crate::unique_name("courier_test").replace('-', "_");
        admin(&server)
            .await?
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .with_context(|| format!("create database {name}"))?;
        let config = DatabaseConfig {
            url: with_dbname(&server, &name),
            ..DatabaseConfig::default()
        };
        let pool = courier::db::pool(&config, "courier-test")?;
        courier::migrate::migrate(&pool, &config.schema, &[courier::migrate::COURIER]).await?;
        Ok(Self {
            name,
            config,
            pool,
            server,
        })
    }

    /// The database as a service sees it: schema `schema`, owned by a role of this test
    /// (`<database>_<schema>`, dropped with the database) that the service connects as;
    /// `admin_url` is the test's superuser connection, for `migrate` to create the role.
    pub fn service_database(&self, schema: &str) -> DatabaseConfig {
        let role = format!("{}_{schema}", self.name);
        let mut as_role = self.server.clone();
        as_role.user(&role);
        DatabaseConfig {
            url: with_dbname(&as_role, &self.name),
            schema: schema.into(),
            role: Some(role),
            admin_url: Some(self.config.url.clone()),
            ..self.config.clone()
        }
    }

    /// Applies to `schema` the framework's migrations that come before `migration` (a name):
    /// the database as a release before it left it, for a test of the upgrade.
    pub async fn migrate_before(&self, schema: &str, migration: &str) -> anyhow::Result<()> {
        use courier::migrate::{MigrationSet, COURIER};
        let before = COURIER
            .migrations
            .iter()
            .position(|m| m.name == migration)
            .with_context(|| format!("{migration} is not a framework migration"))?;
        let old = MigrationSet {
            set: COURIER.set,
            migrations: &COURIER.migrations[..before],
        };
        courier::migrate::migrate(&self.pool, schema, &[old]).await?;
        Ok(())
    }

    /// A session of its own holding a REPEATABLE READ snapshot, as a report, `pg_dump` or a
    /// session idle in transaction does: the xmin horizon stays pinned until it commits or is
    /// dropped.
    pub async fn pin_snapshot(&self) -> anyhow::Result<tokio_postgres::Client> {
        let client = self.client().await?;
        client
            .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
            .await
            .context("open a snapshot")?;
        Ok(client)
    }

    /// Loads `pg_stat_statements` into this database (in schema `public`); the server must
    /// preload it (scripts/stack.sh does).
    pub async fn enable_statement_stats(&self) -> anyhow::Result<()> {
        self.client()
            .await?
            .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements SCHEMA public")
            .await
            .context("create extension pg_stat_statements")
    }

    /// The value of a query returning one `bigint` (a count, an attempt number), on a pooled
    /// connection.
    pub async fn scalar(&self, sql: &str) -> anyhow::Result<i64> {
        let row = self
            .pooled()
            .await?
            .query_one(sql, &[])
            .await
            .with_context(|| sql.to_string())?;
        Ok(row.try_get(0)?)
    }

    /// A connection from the pool.
    pub(crate) async fn pooled(&self) -> anyhow::Result<courier::db::PooledClient<'_>> {
        self.pool
            .get()
            .await
            .map_err(|e| anyhow::anyhow!("a connection to {}: {e}", self.name))
    }

    /// A new connection to the test database (outside the pool).
    pub async fn client(&self) -> anyhow::Result<tokio_postgres::Client> {
        let (client, connection) = self
            .config
            .url
            .parse::<tokio_postgres::Config>()?
            .connect(NoTls)
            .await
            .with_context(|| format!("connect to {}", self.name))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Drop runs inside the test's runtime, which cannot block on itself: use a thread with
        // a runtime of its own. FORCE ends sessions still open (a relay thread, the pool).
        let server = self.server.clone();
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                if let Ok(client) = admin(&server).await {
                    let _ = client
                        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .await;
                    // Roles are per server: drop the ones `service_database` named.
                    let pattern = format!("{name}\\_%");
                    if let Ok(rows) = client
                        .query(
                            "SELECT rolname FROM pg_roles WHERE rolname LIKE $1",
                            &[&pattern],
                        )
                        .await
                    {
                        for row in rows {
                            let role: String = row.get(0);
                            let _ = client
                                .batch_execute(&format!("DROP ROLE IF EXISTS {role}"))
                                .await;
                        }
                    }
                }
            });
        })
        .join();
    }
}
