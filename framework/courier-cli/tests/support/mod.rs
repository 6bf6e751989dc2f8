//! Runs the `courier` binary as an operator would: against a test's database, the emulator, or
//! both; returns (success, stdout, stderr).

use courier_testkit::{TestDb, TestPubSub};
use std::process::Command;

pub async fn courier(
    pubsub: Option<&TestPubSub>,
    db: Option<&TestDb>,
    args: &[&str],
) -> (bool, String, String) {
    let emulator = pubsub.map(|p| (p.host.clone(), p.config().project));
    let url = db.map(|db| db.config.url.clone());
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let output = tokio::task::spawn_blocking(move || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_courier"));
        command
            .args(["--config", "/dev/null"])
            .args(&args)
            .env("USER", "test-operator");
        if let Some((host, project)) = emulator {
            command
                .env("PUBSUB_EMULATOR_HOST", host)
                .env("COURIER_PUBSUB__PROJECT", project);
        }
        if let Some(url) = url {
            command.env("COURIER_DATABASE__URL", url);
        }
        command.output().expect("run courier")
    })
    .await
    .expect("join");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
