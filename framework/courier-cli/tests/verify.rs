//! `courier verify` (the write side alone: append, relay, read back in order) against real
//! PostgreSQL and the emulator, with the shipped local config, exits 0 having seen every event
//! in order.

use courier_testkit::{TestDb, TestPubSub};
use std::process::Command;

#[tokio::test]
async fn verify_delivers_every_event_in_order_with_the_local_config() -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let pubsub = TestPubSub::get().await?;
    let config = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/local/courier.toml"
    );
    let topic = courier_testkit::unique_name("verify.events");
    let url = db.config.url.clone();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_courier"))
            .args([
                "--config", config, "verify", "--events", "300", "--keys", "30", "--topic", &topic,
            ])
            .env("COURIER_DATABASE__URL", &url)
            .env("COURIER_METRICS__LISTEN", "127.0.0.1:0")
            .env("PUBSUB_EMULATOR_HOST", &pubsub.host)
            .output()
    })
    .await??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "verify failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("300 arrived"), "{stdout}");
    assert!(
        stdout.contains("every event arrived, each key in version order"),
        "{stdout}"
    );
    // Its migrate recorded the config's shard count, which the SQL appends read.
    let local = courier::CourierConfig::load(config)?;
    assert_eq!(
        db.scalar("SELECT shard_count::bigint FROM courier.outbox_settings")
            .await?,
        i64::from(local.relay.shard_count)
    );
    Ok(())
}

#[test]
fn a_bad_flag_is_named_in_the_error() {
    let output = Command::new(env!("CARGO_BIN_EXE_courier"))
        .args(["verify", "--events", "0"])
        .output()
        .expect("run courier");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--events"));
}

#[test]
fn a_bad_config_key_is_named_in_the_error() {
    let output = Command::new(env!("CARGO_BIN_EXE_courier"))
        .args(["--config", "/dev/null", "migrate"])
        .env("COURIER_RELAY__SHARD_COUNT", "0")
        .output()
        .expect("run courier");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("relay.shard_count"), "{stderr}");
}
