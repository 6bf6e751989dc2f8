//! PostgreSQL access: the shared pool, dedicated connections (LISTEN, advisory locks), TLS
//! (`tls`), and the transient/permanent split of database errors that retry decisions rely on.

pub mod tls;

use crate::config::DatabaseConfig;
use bb8_postgres::PostgresConnectionManager;
use std::collections::HashMap;
use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;
use tls::{Tls, TlsError, TlsStream};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, GenericClient, Row, Statement};

/// The pool every framework component shares.
pub type PgPool = bb8::Pool<CachingManager>;

/// A connection checked out of a [`PgPool`].
pub type PooledClient<'a> = bb8::PooledConnection<'a, CachingManager>;

/// A pooled connection: the client (it derefs to it) and the statements prepared on it.
pub struct PgConnection {
    client: Client,
    statements: StatementCache,
}

impl PgConnection {
    /// `sql` prepared on this connection: parsed, analysed and (after a few runs) planned once
    /// per connection instead of once per execution. Use it for the hot, fixed statements.
    pub async fn prepared(&self, sql: &str) -> Result<Statement, tokio_postgres::Error> {
        self.statements.prepare(&self.client, sql).await
    }

    /// Begins a transaction that prepares through this connection's cache. Its BEGIN is
    /// queued on the connection now and goes out with the transaction's first statement: a
    /// write costs one round trip fewer (see [`PgTransaction`]).
    pub async fn transaction(&mut self) -> Result<PgTransaction<'_>, tokio_postgres::Error> {
        let client = &self.client;
        Ok(PgTransaction {
            begun: Mutex::new(Some(send_now(client, "BEGIN"))),
            client,
            statements: &self.statements,
            ended: false,
        })
    }
}

/// The answer to a request already queued on its connection.
type Answer<'a> = Pin<Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send + 'a>>;

/// Queues the simple query `sql` on `client`'s connection now; the answer can be awaited
/// later or dropped (the connection still reads it, in order). tokio-postgres queues a
/// request on its future's first poll, so this polls once; the real waker is registered by
/// whoever awaits the answer.
fn send_now<'a>(client: &'a Client, sql: &'static str) -> Answer<'a> {
    let mut answer: Answer<'a> = Box::pin(client.batch_execute(sql));
    let mut context = Context::from_waker(futures::task::noop_waker_ref());
    match answer.as_mut().poll(&mut context) {
        Poll::Ready(result) => Box::pin(std::future::ready(result)),
        Poll::Pending => answer,
    }
}

/// A transaction on a pooled connection (it derefs to the connection's `Client`) that can run
/// statements prepared once per connection. Projection handlers receive one.
///
/// Its BEGIN is not awaited before the first statement: both go out together, and BEGIN's
/// answer is read when the transaction ends. That saves a round trip per transaction: a
/// write of one statement and an append is two round trips instead of three (`courier-load
/// throughput`'s stages alone, CPU per event: write transaction 241–257 µs against 267–310,
/// one-event projection transaction 196–207 against 238–260; `append`: 1.04 × the
/// `append_and_commit`s per second). Statements behind a failed BEGIN would run outside a
/// transaction, so a failed BEGIN fails the commit; but a plain BEGIN fails only on an
/// aborted transaction (whose statements fail too) or a broken connection (likewise).
/// Dropped unfinished, it rolls back, as tokio-postgres's `Transaction` does.
pub struct PgTransaction<'a> {
    client: &'a Client,
    statements: &'a StatementCache,
    /// BEGIN's answer, until it is read. In a mutex only to keep the transaction `Sync`
    /// (handlers share it across the keys they apply together); never contended.
    begun: Mutex<Option<Answer<'a>>>,
    /// COMMIT or ROLLBACK has been queued: nothing to roll back on drop.
    ended: bool,
}

impl<'a> PgTransaction<'a> {
    /// `sql` prepared on the connection (see [`PgConnection::prepared`]). Server-side
    /// statements outlive transactions, so one prepared in a rolled-back transaction stays
    /// usable. Name result columns: a cached `SELECT *` fails once its table gains a column.
    pub async fn prepared(&self, sql: &str) -> Result<Statement, tokio_postgres::Error> {
        self.statements.prepare(self.client, sql).await
    }

    pub async fn commit(mut self) -> Result<(), tokio_postgres::Error> {
        // Dropped while this waits, the transaction still rolls back (`ended` is not set yet).
        self.begun().await?;
        self.ended = true;
        self.client.batch_execute("COMMIT").await
    }

    /// Runs the transaction's last statement and commits, in one round trip: the COMMIT goes
    /// out right behind the statement instead of after its answer (`courier-load append`:
    /// 1.05–1.12 × the appends per second of an append and then a commit on this project's
    /// 2-core machine; on a network, a round trip of latency is saved per write).
    ///
    /// If the statement fails, PostgreSQL ends the transaction at the COMMIT with a rollback,
    /// and the statement's error is returned; otherwise the COMMIT's result is. `statement`
    /// must be prepared already (see [`PgTransaction::prepared`]): a request goes out on its
    /// future's first poll, and one that had to prepare first would let the COMMIT overtake
    /// it (tests/write_side.rs checks that a failing last statement rolls everything back).
    /// A transaction of this one statement is a single round trip: BEGIN, it, and COMMIT.
    /// Returns the statement's rows.
    pub async fn query_and_commit(
        mut self,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let begun = self.begun();
        self.ended = true;
        // `join!` polls in order: the statement's request is queued, then the COMMIT's.
        let (begun, executed, committed) = futures::join!(
            begun,
            self.client.query(statement, params),
            self.client.batch_execute("COMMIT")
        );
        begun?;
        let rows = executed?;
        committed?;
        Ok(rows)
    }

    /// BEGIN's answer (long in by the time a transaction ends): an error if it failed.
    fn begun(&mut self) -> impl Future<Output = Result<(), tokio_postgres::Error>> + 'a {
        let answer = self
            .begun
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        async move {
            match answer {
                Some(answer) => answer.await,
                None => Ok(()),
            }
        }
    }

    pub async fn rollback(mut self) -> Result<(), tokio_postgres::Error> {
        self.ended = true;
        self.client.batch_execute("ROLLBACK").await
    }
}

impl Drop for PgTransaction<'_> {
    fn drop(&mut self) {
        if !self.ended {
            // Queued before the connection can go back to its pool; the answer is not needed.
            drop(send_now(self.client, "ROLLBACK"));
        }
    }
}

impl Deref for PgTransaction<'_> {
    type Target = Client;
    fn deref(&self) -> &Client {
        self.client
    }
}

impl Deref for PgConnection {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl DerefMut for PgConnection {
    fn deref_mut(&mut self) -> &mut Client {
        &mut self.client
    }
}

/// Prepared statements of one connection by SQL text. Server-side prepared statements live
/// as long as their session, so the cache lives with the connection. Bounded: past
/// [`StatementCache::CAPACITY`] texts, further ones are prepared for each use.
#[derive(Default)]
struct StatementCache {
    statements: Mutex<HashMap<String, Statement>>,
}

impl StatementCache {
    /// Far more than the framework's and a service's fixed statements.
    const CAPACITY: usize = 256;

    /// The statement for `sql`, prepared through `client` (the connection's client or a
    /// transaction on it) the first time.
    async fn prepare(
        &self,
        client: &impl GenericClient,
        sql: &str,
    ) -> Result<Statement, tokio_postgres::Error> {
        if let Some(statement) = self.lock().get(sql) {
            return Ok(statement.clone());
        }
        let statement = client.prepare(sql).await?;
        let mut statements = self.lock();
        if statements.len() < Self::CAPACITY {
            statements.insert(sql.to_owned(), statement.clone());
        }
        Ok(statement)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Statement>> {
        // The map is valid whatever a panicking holder was doing: entries are inserted whole.
        self.statements
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// bb8's manager for [`PgConnection`]s: tokio-postgres connections with a statement cache.
#[derive(Debug)]
pub struct CachingManager(PostgresConnectionManager<Tls>);

impl bb8::ManageConnection for CachingManager {
    type Connection = PgConnection;
    type Error = tokio_postgres::Error;

    async fn connect(&self) -> Result<PgConnection, tokio_postgres::Error> {
        Ok(PgConnection {
            client: self.0.connect().await?,
            statements: StatementCache::default(),
        })
    }

    async fn is_valid(&self, conn: &mut PgConnection) -> Result<(), tokio_postgres::Error> {
        self.0.is_valid(&mut conn.client).await
    }

    fn has_broken(&self, conn: &mut PgConnection) -> bool {
        self.0.has_broken(&mut conn.client)
    }
}

/// A database failure with what was being done. The message carries the driver's whole error
/// chain, because tokio-postgres alone says only "db error" for a server error.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("{context}: no pooled connection: {}", pool_failure(error))]
    Pool {
        context: String,
        error: bb8::RunError<tokio_postgres::Error>,
    },
    #[error("{context}: {}", chain(error))]
    Query {
        context: String,
        error: tokio_postgres::Error,
    },
    #[error("database config is invalid: {}", chain(.0))]
    Config(tokio_postgres::Error),
    #[error("database config is invalid: {0}")]
    Settings(String),
    #[error("database tls: {0}")]
    Tls(#[from] TlsError),
}

/// bb8 says only "Timed out in bb8" when no connection could be made in time.
fn pool_failure(error: &bb8::RunError<tokio_postgres::Error>) -> String {
    match error {
        bb8::RunError::TimedOut => "none within database.connect_timeout_secs (each failed \
            connection's reason is logged as \"database connection failed\")"
            .into(),
        bb8::RunError::User(e) => chain(e),
    }
}

/// `error: cause: cause…`, each level once.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    text
}

impl DbError {
    pub fn query(context: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> Self {
        let context = context.into();
        move |error| DbError::Query { context, error }
    }

    pub fn pool(
        context: impl Into<String>,
    ) -> impl FnOnce(bb8::RunError<tokio_postgres::Error>) -> Self {
        let context = context.into();
        move |error| DbError::Pool { context, error }
    }

    /// True when retrying the same work later can succeed: lost connections, pool timeouts,
    /// serialization failures, deadlocks, the server shutting down or out of resources.
    pub fn is_transient(&self) -> bool {
        match self {
            DbError::Pool { error, .. } => match error {
                bb8::RunError::TimedOut => true,
                bb8::RunError::User(e) => is_transient_pg(e),
            },
            DbError::Query { error, .. } => is_transient_pg(error),
            DbError::Config(_) | DbError::Settings(_) | DbError::Tls(_) => false,
        }
    }
}

impl DbError {
    /// True when the database could not be reached or the connection broke: an outage that
    /// says nothing about the work that failed (unlike a deadlock or a serialization failure).
    pub fn is_unavailable(&self) -> bool {
        match self {
            DbError::Pool { error, .. } => match error {
                bb8::RunError::TimedOut => true,
                bb8::RunError::User(e) => is_unavailable_pg(e),
            },
            DbError::Query { error, .. } => is_unavailable_pg(error),
            DbError::Config(_) | DbError::Settings(_) | DbError::Tls(_) => false,
        }
    }
}

/// See [`DbError::is_unavailable`]: a closed connection, an I/O failure (no SQLSTATE), a
/// connection exception (class 08), or the server shutting down or starting up (57P01–57P03).
pub fn is_unavailable_pg(error: &tokio_postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    match error.code() {
        None => true,
        Some(code) => {
            code.code().starts_with("08")
                || *code == SqlState::ADMIN_SHUTDOWN
                || *code == SqlState::CRASH_SHUTDOWN
                || *code == SqlState::CANNOT_CONNECT_NOW
        }
    }
}

/// Classifies a tokio-postgres error (see [`DbError::is_transient`]).
pub fn is_transient_pg(error: &tokio_postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    match error.code() {
        // No SQLSTATE: an I/O or protocol failure on the connection.
        None => true,
        Some(code) => {
            let class = &code.code()[..2];
            *code == SqlState::T_R_SERIALIZATION_FAILURE
                || *code == SqlState::T_R_DEADLOCK_DETECTED
                || *code == SqlState::LOCK_NOT_AVAILABLE
                || *code == SqlState::QUERY_CANCELED
                // 08: connection exception, 53: insufficient resources,
                // 57: operator intervention (admin shutdown, crash shutdown, cannot connect now).
                || matches!(class, "08" | "53" | "57")
        }
    }
}

/// Where and how to connect: tokio-postgres's settings and the TLS connector they need.
struct Target {
    pg: tokio_postgres::Config,
    tls: Tls,
}

impl Target {
    async fn connect(
        &self,
    ) -> Result<
        (
            Client,
            tokio_postgres::Connection<tokio_postgres::Socket, TlsStream>,
        ),
        tokio_postgres::Error,
    > {
        self.pg.connect(self.tls.clone()).await
    }
}

/// Every connection resolves unqualified names in the service's schema (the framework's
/// own queries name it explicitly; a service's SQL need not). `extra` adds server settings.
fn target(config: &DatabaseConfig, application: &str, extra: &str) -> Result<Target, DbError> {
    let (url, tls) = config.connection(&config.url).map_err(DbError::Settings)?;
    let mut pg: tokio_postgres::Config = url.parse().map_err(DbError::Config)?;
    pg.application_name(application);
    pg.connect_timeout(Duration::from_secs(config.connect_timeout_secs));
    pg.options(format!("-c search_path={} {extra}", config.schema).trim_end());
    pg.ssl_mode(tls::driver_mode(tls.mode));
    let tls = tls::connector(tls.mode, tls.root_cert.as_deref())?;
    Ok(Target { pg, tls })
}

/// Builds the shared pool. Connections are checked lazily, so this succeeds while the
/// database is down; the first use reports the failure.
pub fn pool(config: &DatabaseConfig, application: &str) -> Result<PgPool, DbError> {
    build_pool(config, target(config, application, "")?, application)
}

/// The relay's pool: commits do not wait for the WAL flush (`synchronous_commit = off`).
/// Everything the relay writes can be lost in a database crash without losing an event: a
/// lost claim or mark only means a row is published again (at least once), a lost idle flag
/// only delays a wake-up until the next poll. Writers' transactions keep full durability.
/// No JIT: with a large published history the claim's estimated cost (of a check it rarely
/// runs) passed `jit_above_cost`, and compiling took ~80 ms of a ~7 ms claim.
/// No seq scans: the relay reads the outbox through its partial indexes or at row addresses,
/// never by reading the published history; planned while the outbox looked small, the mark's
/// cached plan would otherwise scan it all (queries/mark_published.sql).
pub fn relay_pool(config: &DatabaseConfig, application: &str) -> Result<PgPool, DbError> {
    let target = target(
        config,
        application,
        "-c synchronous_commit=off -c jit=off -c enable_seqscan=off",
    )?;
    build_pool(config, target, application)
}

fn build_pool(
    config: &DatabaseConfig,
    target: Target,
    application: &str,
) -> Result<PgPool, DbError> {
    let manager = CachingManager(PostgresConnectionManager::new(target.pg, target.tls));
    Ok(bb8::Pool::builder()
        .max_size(config.pool_size)
        .connection_timeout(Duration::from_secs(config.connect_timeout_secs))
        // No round trip per checkout: a connection closed by a server restart is dropped when
        // returned (bb8 checks `is_closed`), and the failed call is retried as transient.
        .test_on_check_out(false)
        .error_sink(Box::new(LogConnectFailures {
            application: application.to_string(),
        }))
        .build_unchecked(manager))
}

/// bb8 retries a failed connect until `connect_timeout_secs` and then reports only that it
/// timed out; this logs each failure's reason (a refused TLS certificate, a wrong password,
/// the server down), so the operator sees why.
#[derive(Debug, Clone)]
struct LogConnectFailures {
    application: String,
}

impl bb8::ErrorSink<tokio_postgres::Error> for LogConnectFailures {
    fn sink(&self, error: tokio_postgres::Error) {
        tracing::warn!(application = %self.application, error = %chain(&error),
            "database connection failed; retrying until connect_timeout_secs");
    }

    fn boxed_clone(&self) -> Box<dyn bb8::ErrorSink<tokio_postgres::Error>> {
        Box::new(self.clone())
    }
}

/// Opens a connection outside the pool, for work that needs its session to itself (LISTEN,
/// session advisory locks). The returned future drives the connection and must be polled;
/// it completes when the connection is lost.
pub async fn dedicated(
    config: &DatabaseConfig,
    application: &str,
) -> Result<
    (
        Client,
        tokio_postgres::Connection<tokio_postgres::Socket, TlsStream>,
    ),
    DbError,
> {
    target(config, application, "")?
        .connect()
        .await
        .map_err(DbError::query(format!("connect {application} to database")))
}

/// Renders a framework query: `{schema}` becomes the configured (validated) schema name.
pub fn render(sql: &str, schema: &str) -> String {
    sql.replace("{schema}", schema)
}

/// Creates the database `config.url` names when it does not exist yet, through the server's
/// `postgres` database, so a fresh machine needs no manual `createdb`. Returns whether it
/// created it.
pub async fn create_database_if_missing(config: &DatabaseConfig) -> Result<bool, DbError> {
    let target = target(config, "courier-migrate", "")?;
    let connected = target.connect().await;
    let error = match connected {
        Ok(_) => return Ok(false),
        Err(error) if error.code() == Some(&SqlState::INVALID_CATALOG_NAME) => error,
        Err(error) => {
            return Err(DbError::Query {
                context: "connect to database".into(),
                error,
            })
        }
    };
    let Some(name) = target
        .pg
        .get_dbname()
        .filter(|name| crate::config::is_identifier(name))
    else {
        return Err(DbError::Query {
            context: "database name is not a plain identifier, create it by hand".into(),
            error,
        });
    };
    let name = name.to_owned();
    let mut server = target.pg.clone();
    server.dbname("postgres");
    let (client, connection) = server
        .connect(target.tls)
        .await
        .map_err(DbError::query("connect to the server's postgres database"))?;
    let driver = tokio::spawn(connection);
    let created = match client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
    {
        Ok(()) => Ok(true),
        // Another migrator created it meanwhile.
        Err(e) if e.code() == Some(&SqlState::DUPLICATE_DATABASE) => Ok(false),
        Err(e) => Err(DbError::Query {
            context: format!("create database {name}"),
            error: e,
        }),
    };
    drop(client);
    let _ = driver.await;
    created
}
