//! Runs a [`Service`]: migrations and provisioning on request, then the outbox relay, one
//! consumer per inbound subscription and the HTTP server — each on its own thread and actix
//! System, so one process hosts them all and a test can crash one service like `kill -9`.

use super::context::ServiceContext;
use super::declaration::Service;
use super::error::ServiceError;
use super::http::configure_common;
use crate::config::DatabaseConfig;
use crate::db::DbError;
use crate::inbound::{ConsumerHandle, ConsumerOptions, StatsSnapshot};
use crate::migrate::{MigrationReport, COURIER};
use crate::outbox::Outbox;
use crate::pubsub::PubSub;
use crate::relay::{Relay, RelayHandle, RelayOptions};
use crate::system_thread::SystemThread;
use crate::CourierConfig;
use actix_web::{web, App, HttpServer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// How a service is started beyond its config.
#[derive(Clone, Default)]
pub struct RunOptions {
    /// Apply migrations first (see [`migrate`]).
    pub migrate: bool,
    /// Create topics and subscriptions first (see [`provision`]).
    pub provision: bool,
    pub relay: RelayOptions,
    pub consumer: ConsumerOptions,
}

/// Creates the database if missing, the service's role and schema when configured, and
/// applies the framework's and the service's migrations, connecting with
/// `database.admin_url` (else `database.url`).
pub async fn migrate(
    service: &Service,
    config: &CourierConfig,
) -> Result<MigrationReport, ServiceError> {
    let database = &config.database;
    let admin = DatabaseConfig {
        url: database
            .admin_url
            .clone()
            .unwrap_or_else(|| database.url.clone()),
        pool_size: 2,
        ..database.clone()
    };
    if crate::db::create_database_if_missing(&admin).await? {
        tracing::info!(service = service.name, "created the database");
    }
    let pool = crate::db::pool(&admin, &format!("{}-migrate", service.name))?;
    let report = crate::migrate::migrate_owned(
        &pool,
        &database.schema,
        database.role.as_deref(),
        &[COURIER, service.migrations],
    )
    .await?;
    // The shard count the SQL appends read (0020_sql_append.sql): the deployment's.
    let conn = pool
        .get()
        .await
        .map_err(crate::db::DbError::pool("record the shard count"))?;
    crate::outbox::record_shard_count(&conn, config).await?;
    Ok(report)
}

/// Creates, unless they exist, the service's outbound topics and, for each inbound
/// subscription, its topic, dead-letter topic (with a keeper subscription) and the
/// subscription. Returns what it created.
pub async fn provision(
    service: &Service,
    config: &CourierConfig,
) -> Result<Vec<String>, ServiceError> {
    let pubsub = PubSub::new(config.pubsub.clone());
    let topics = pubsub.topic_admin().await?;
    let mut created = Vec::new();
    for topic in service.outbound_topics {
        if pubsub.ensure_topic(&topics, topic).await? {
            created.push(format!("topic {topic}"));
        }
    }
    for inbound in &service.inbound {
        created.extend(
            pubsub
                .provision(&inbound.subscription(service.name))
                .await?,
        );
    }
    Ok(created)
}

/// What a rebuild did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RebuildReport {
    pub group: String,
    pub subscription: String,
    /// Rows deleted per read-model table.
    pub cleared: Vec<(String, u64)>,
    pub reset: crate::inbound::OffsetReset,
}

/// Rebuilds the read model of the inbound subscription with role `role`: deletes its tables'
/// rows and the group's key versions and parked keys (one transaction), resets the group's offset to `from` (audited; inbox rows since then
/// forgotten) and seeks the subscription there, so the running consumer applies every event
/// published since `from` again. Pub/Sub replays only what it retained (7 days by default).
pub async fn rebuild(
    service: &Service,
    config: &CourierConfig,
    role: &str,
    from: chrono::DateTime<chrono::Utc>,
    by: &str,
    reason: &str,
) -> Result<RebuildReport, ServiceError> {
    let inbound = service
        .inbound
        .iter()
        .find(|inbound| inbound.role == role)
        .ok_or_else(|| ServiceError::UnknownProjection {
            role: role.into(),
            known: service
                .inbound
                .iter()
                .map(|i| i.role)
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    let spec = inbound.consumer_spec(service.name);
    let pool = crate::db::pool(&config.database, &format!("{}-rebuild", service.name))?;
    let mut cleared = Vec::new();
    {
        let context = format!("clear the tables of projection {role}");
        let mut conn = pool.get().await.map_err(DbError::pool(&context))?;
        let tx = conn.transaction().await.map_err(DbError::query(&context))?;
        for table in inbound.tables {
            let deleted = tx
                .execute(
                    &format!("DELETE FROM {}.{table}", config.database.schema),
                    &[],
                )
                .await
                .map_err(DbError::query(format!("clear {table}")))?;
            cleared.push(((*table).to_owned(), deleted));
        }
        // A delta projection's key versions and parked keys describe the cleared tables.
        for table in [
            "projection_version_log",
            "projection_keys",
            "parked_events",
            "parked_keys",
        ] {
            tx.execute(
                &format!(
                    "DELETE FROM {}.{table} WHERE consumer_group = $1",
                    config.database.schema
                ),
                &[&spec.group],
            )
            .await
            .map_err(DbError::query(format!(
                "clear {table} of group {}",
                spec.group
            )))?;
        }
        tx.commit().await.map_err(DbError::query(&context))?;
    }
    let offsets =
        crate::inbound::OffsetStore::new(&config.database.schema, config.consumer.offset_lanes);
    let reset = offsets
        .reset(&pool, &spec.group, &spec.subscription, from, by, reason)
        .await?;
    let pubsub = PubSub::new(config.pubsub.clone());
    let admin = pubsub.subscription_admin().await?;
    pubsub.seek(&admin, &spec.subscription, from).await?;
    Ok(RebuildReport {
        group: spec.group,
        subscription: spec.subscription,
        cleared,
        reset,
    })
}

/// A service running in this process.
pub struct RunningService {
    pub name: &'static str,
    /// Where the HTTP server listens (the real port when `http.listen` asked for port 0).
    pub addr: SocketAddr,
    http: SystemThread,
    server: actix_web::dev::ServerHandle,
    relay: Option<RelayHandle>,
    consumers: Vec<(String, ConsumerHandle)>,
    /// The retention janitor's thread (and its address: the supervisor restarts only while
    /// someone holds one).
    janitor: SystemThread,
    _janitor_addr: Option<actix::Addr<crate::retention::Janitor>>,
}

impl RunningService {
    pub async fn start(
        service: Service,
        config: &CourierConfig,
        options: RunOptions,
    ) -> Result<Self, ServiceError> {
        // Before any actor records a metric: what is recorded before the recorder exists is lost.
        crate::metrics::prometheus_handle();
        if options.migrate {
            let report = migrate(&service, config).await?;
            tracing::info!(service = service.name, applied = ?report.applied, "migrated");
        }
        if options.provision {
            let created = provision(&service, config).await?;
            tracing::info!(service = service.name, ?created, "provisioned");
        }
        let relay = if service.outbound_topics.is_empty() {
            None
        } else {
            Some(Relay::spawn(config, options.relay.clone())?)
        };
        let mut consumers = Vec::new();
        for inbound in &service.inbound {
            let spec = inbound.consumer_spec(service.name);
            let handle = inbound.spawn(service.name, config, options.consumer.clone())?;
            consumers.push((spec.group, handle));
        }
        let context = ServiceContext {
            service: service.name,
            pool: crate::db::pool(&config.database, service.name)?,
            outbox: Outbox::new(config),
            config: Arc::new(config.clone()),
        };
        let (http, (addr, server)) = serve_http(service.name, service.routes, context)?;
        let janitor_config = config.clone();
        let escalate = options.relay.escalate.clone();
        let (janitor, janitor_addr) =
            SystemThread::spawn(&format!("{}-janitor", service.name), move || async move {
                crate::retention::start(&janitor_config, escalate).map_err(ServiceError::from)
            })?;
        tracing::info!(service = service.name, %addr, "serving HTTP");
        Ok(Self {
            name: service.name,
            addr,
            http,
            server,
            relay,
            consumers,
            janitor,
            _janitor_addr: janitor_addr,
        })
    }

    /// Counters of each consumer, by group.
    pub fn consumer_stats(&self) -> Vec<(String, StatsSnapshot)> {
        self.consumers
            .iter()
            .map(|(group, handle)| (group.clone(), handle.stats()))
            .collect()
    }

    /// Stops everything at once: no drain, no ack, no mark (what a crash does).
    pub fn kill(mut self) {
        // The stop command is sent when `stop` is called; the returned future only waits.
        drop(self.server.stop(false));
        self.http.stop();
        self.janitor.stop();
        if let Some(relay) = self.relay.take() {
            relay.kill();
        }
        for (_, consumer) in self.consumers.drain(..) {
            consumer.kill();
        }
    }

    /// Stops taking requests, lets in-flight requests finish, drains the relay's in-flight
    /// batches (up to `grace`), then stops the consumers (unacked messages are redelivered).
    pub async fn shutdown(mut self, grace: Duration) {
        let _ = tokio::time::timeout(grace, self.server.stop(true)).await;
        self.http.stop();
        self.janitor.stop();
        if let Some(relay) = self.relay.take() {
            relay.shutdown(grace).await;
        }
        for (_, consumer) in self.consumers.drain(..) {
            consumer.kill();
        }
    }
}

type ServerStarted = (SocketAddr, actix_web::dev::ServerHandle);

fn serve_http(
    name: &'static str,
    routes: fn(&mut web::ServiceConfig),
    context: ServiceContext,
) -> Result<(SystemThread, ServerStarted), ServiceError> {
    let listen = context.config.http.listen.clone();
    SystemThread::spawn(&format!("{name}-http"), move || async move {
        let failed = |reason: String| ServiceError::Http {
            listen: listen.clone(),
            reason,
        };
        let data = web::Data::new(context);
        let server = HttpServer::new(move || {
            App::new()
                .wrap(actix_web::middleware::from_fn(super::http::trace_request))
                .app_data(data.clone())
                .configure(configure_common)
                .configure(routes)
        })
        // HTTP/1.1 and HTTP/2 cleartext on one port (Cloud Run's h2c).
        .bind_auto_h2c(listen.as_str())
        .map_err(|e| failed(e.to_string()))?
        .shutdown_timeout(10);
        let addr = *server
            .addrs()
            .first()
            .ok_or_else(|| failed("no address bound".into()))?;
        let server = server.run();
        let handle = server.handle();
        actix_web::rt::spawn(server);
        Ok((addr, handle))
    })
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
