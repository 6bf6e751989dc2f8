//! `courier provision` against the emulator: creates what docs/design.md (Contracts) names, once.

use courier_testkit::TestPubSub;
use std::process::Command;

fn provision(host: &str, topic: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_courier"))
        .args([
            "--config",
            "/dev/null",
            "provision",
            "--topic",
            topic,
            "--consumer",
            "engagement",
        ])
        .env("PUBSUB_EMULATOR_HOST", host)
        .output()
        .expect("run courier")
}

#[tokio::test]
async fn provisioning_creates_everything_once() -> anyhow::Result<()> {
    let pubsub = TestPubSub::get().await?;
    let topic = format!("{}.events", courier_testkit::unique_name("catalog.video"));
    let (host, t) = (pubsub.host.clone(), topic.clone());
    let first = tokio::task::spawn_blocking(move || provision(&host, &t)).await?;
    let stdout = String::from_utf8_lossy(&first.stdout);
    assert!(
        first.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&first.stderr)
    );
    for expected in [
        format!("created topic {topic}\n"),
        format!("created topic {topic}.dlq\n"),
        format!("created subscription {topic}.engagement-reader.dlq\n"),
        format!("created subscription {topic}.engagement-reader\n"),
    ] {
        assert!(
            stdout.contains(&expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
    let (host, t) = (pubsub.host.clone(), topic.clone());
    let second = tokio::task::spawn_blocking(move || provision(&host, &t)).await?;
    let stdout = String::from_utf8_lossy(&second.stdout);
    assert!(second.status.success());
    assert!(stdout.starts_with("already provisioned"), "{stdout}");
    let (host, t) = (pubsub.host.clone(), topic.clone());
    let json = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_courier"))
            .args([
                "--config",
                "/dev/null",
                "provision",
                "--topic",
                &t,
                "--consumer",
                "engagement",
                "--json",
            ])
            .env("PUBSUB_EMULATOR_HOST", host)
            .output()
            .expect("run courier")
    })
    .await?;
    let report: serde_json::Value = serde_json::from_slice(&json.stdout)?;
    assert_eq!(report["subscription"], format!("{topic}.engagement-reader"));
    assert_eq!(report["created"], serde_json::json!([]));
    Ok(())
}

#[test]
fn a_bad_topic_is_named_in_the_error() {
    let output = provision("127.0.0.1:1", "Not A Topic");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--topic"));
}
