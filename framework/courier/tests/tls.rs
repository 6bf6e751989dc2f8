//! Issue 22: TLS to PostgreSQL. Each test starts a cluster of its own that accepts TLS
//! connections only (`courier_testkit::TlsPostgres`: a certificate for `localhost` signed by a
//! CA made for the test), as Supabase or Cloud SQL with SSL enforced do.

use courier::config::DatabaseConfig;
use courier::config::SslMode;
use courier::migrate::{migrate, COURIER};
use courier::outbox::Outbox;
use courier_testkit::{
    keyed_event, spawn_relay, test_config_on, wait_until, Collector, TestPubSub, TlsPostgres,
};
use std::path::Path;
use std::time::Duration;

async fn cluster() -> anyhow::Result<TlsPostgres> {
    courier_testkit::init_logging();
    tokio::task::spawn_blocking(TlsPostgres::start).await?
}

fn database(url: String, sslmode: Option<SslMode>, root_cert: Option<&Path>) -> DatabaseConfig {
    DatabaseConfig {
        url,
        sslmode,
        ssl_root_cert: root_cert.map(Path::to_path_buf),
        pool_size: 2,
        connect_timeout_secs: 5,
        ..DatabaseConfig::default()
    }
}

/// Whether a connection made with `config` is encrypted, or why none could be made (the
/// error as the framework reports it). The pool makes its connections the same way; it
/// retries a failed one until its timeout and logs each failure's reason.
async fn encrypted(config: &DatabaseConfig) -> Result<bool, String> {
    let (client, connection) = courier::db::dedicated(config, "courier-tls-test")
        .await
        .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .map_err(|e| e.to_string())?;
    drop(client);
    let _ = driver.await;
    Ok(row.get(0))
}

/// Each `sslmode` does what libpq's does: `disable` is refused by a TLS-only server,
/// `prefer` and `require` encrypt without checking the certificate, `verify-ca` checks the
/// issuer, `verify-full` the issuer and the host name; the URL form (`sslmode=`,
/// `sslrootcert=`) means the same as the settings.
#[tokio::test]
async fn every_sslmode_does_what_libpq_does() -> anyhow::Result<()> {
    let pg = cluster().await?;
    let by_ip = pg.url("127.0.0.1", "postgres", "");
    let by_name = pg.url("localhost", "postgres", "");
    let (ca, other_ca) = (Some(pg.ca_cert.as_path()), Some(pg.other_ca_cert.as_path()));

    for mode in [None, Some(SslMode::Prefer), Some(SslMode::Require)] {
        assert_eq!(
            encrypted(&database(by_ip.clone(), mode, None)).await,
            Ok(true),
            "{mode:?}"
        );
    }
    let refused = encrypted(&database(by_ip.clone(), Some(SslMode::Disable), None)).await;
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("no encryption")),
        "disable against a TLS-only server: {refused:?}"
    );

    let full = Some(SslMode::VerifyFull);
    assert_eq!(
        encrypted(&database(by_name.clone(), full, ca)).await,
        Ok(true)
    );
    let wrong_host = encrypted(&database(by_ip.clone(), full, ca)).await;
    assert!(
        wrong_host
            .as_ref()
            .is_err_and(|e| e.contains("not valid for name") && e.contains("127.0.0.1")),
        "verify-full to a host the certificate does not name: {wrong_host:?}"
    );
    let wrong_ca = encrypted(&database(by_name.clone(), full, other_ca)).await;
    assert!(
        wrong_ca
            .as_ref()
            .is_err_and(|e| e.contains("UnknownIssuer")),
        "verify-full trusting another CA: {wrong_ca:?}"
    );

    let ca_only = Some(SslMode::VerifyCa);
    assert_eq!(
        encrypted(&database(by_ip.clone(), ca_only, ca)).await,
        Ok(true)
    );
    let wrong_ca = encrypted(&database(by_ip.clone(), ca_only, other_ca)).await;
    assert!(
        wrong_ca
            .as_ref()
            .is_err_and(|e| e.contains("UnknownIssuer")),
        "verify-ca trusting another CA: {wrong_ca:?}"
    );
    // `require` with a root certificate verifies the issuer, as libpq does.
    let upgraded = encrypted(&database(by_ip.clone(), Some(SslMode::Require), other_ca)).await;
    assert!(
        upgraded
            .as_ref()
            .is_err_and(|e| e.contains("UnknownIssuer")),
        "require with a root certificate: {upgraded:?}"
    );

    let libpq_url = |host: &str, root: &Path| {
        pg.url(
            host,
            "postgres",
            &format!("?sslmode=verify-full&sslrootcert={}", root.display()),
        )
    };
    assert_eq!(
        encrypted(&database(libpq_url("localhost", &pg.ca_cert), None, None)).await,
        Ok(true)
    );
    let wrong_host = encrypted(&database(libpq_url("127.0.0.1", &pg.ca_cert), None, None)).await;
    assert!(
        wrong_host
            .as_ref()
            .is_err_and(|e| e.contains("not valid for name")),
        "{wrong_host:?}"
    );
    Ok(())
}

/// Everything the framework connects for runs over verified TLS: creating the database,
/// migrating, the relay's pool, its LISTEN connection and its shard-lock connection.
#[tokio::test]
async fn migrations_and_the_relay_run_over_verified_tls() -> anyhow::Result<()> {
    let pg = cluster().await?;
    let pubsub = TestPubSub::get().await?;
    let topic = pubsub.topic("tls").await?;
    let subscription = pubsub.subscription(&topic).await?;
    let collector = Collector::start(&pubsub, &subscription).await?;
    let url = pg.url(
        "localhost",
        "courier_tls",
        &format!("?sslmode=verify-full&sslrootcert={}", pg.ca_cert.display()),
    );
    let config = test_config_on(database(url, None, None), &pubsub);
    let mut config = config;
    config.database.pool_size = 4;

    assert!(courier::db::create_database_if_missing(&config.database).await?);
    let pool = courier::db::pool(&config.database, "courier-tls-test")?;
    migrate(&pool, &config.database.schema, &[COURIER]).await?;

    let relay = spawn_relay(&config)?;
    let outbox = Outbox::new(&config);
    for version in 1..=3 {
        let mut conn = pool.get().await?;
        let tx = conn.transaction().await?;
        outbox
            .append(&tx, keyed_event(&topic, "video-1", version))
            .await?;
        tx.commit().await?;
    }
    wait_until(
        Duration::from_secs(30),
        "three events published",
        || async { collector.distinct_event_ids().len() >= 3 },
    )
    .await?;

    let conn = pool.get().await?;
    let rows = conn
        .query(
            "SELECT a.application_name, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
             WHERE a.datname = 'courier_tls' AND a.pid <> pg_backend_pid()",
            &[],
        )
        .await?;
    let connections: Vec<(String, bool)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    for dedicated in [
        "courier-notify-listener",
        "courier-shard-locks",
        "courier-relay",
    ] {
        assert!(
            connections.iter().any(|(name, _)| name == dedicated),
            "no {dedicated} connection among {connections:?}"
        );
    }
    assert!(
        connections.iter().all(|(_, ssl)| *ssl),
        "a connection without TLS: {connections:?}"
    );
    relay.shutdown(Duration::from_secs(5)).await;
    Ok(())
}
