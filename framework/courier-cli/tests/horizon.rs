//! `courier status` names what holds the xmin horizon back: a session with a pinned snapshot
//! by its pid (with a WARNING and what to do past `--horizon-warn-secs`), until it commits.

use crate::support;

use courier_testkit::{wait_until, TestDb};
use serde_json::Value;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

async fn courier_status(db: &TestDb, args: &[&str]) -> (bool, String, String) {
    let args: Vec<&str> = ["status"].iter().chain(args).copied().collect();
    support::courier(None, Some(db), &args).await
}

async fn status_json(db: &TestDb) -> Value {
    let (ok, stdout, stderr) = courier_status(db, &["--json"]).await;
    assert!(ok, "courier status --json: {stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("courier status --json: {e}: {stdout}"))
}

#[tokio::test]
async fn status_names_the_session_holding_the_xmin_horizon_until_it_commits() -> anyhow::Result<()>
{
    courier_testkit::init_logging();
    let db = TestDb::new().await?;
    let pinned = db.client().await?;
    let pid: i32 = pinned
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get(0);
    pinned
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;")
        .await?;

    wait_until(WAIT, "status --json naming the pinned session", || async {
        let horizon = &status_json(&db).await["horizon"];
        horizon["oldest_session"]["pid"] == pid
            && horizon["oldest_session"]["age_secs"]
                .as_f64()
                .is_some_and(|s| s >= 0.0)
    })
    .await?;
    let status = status_json(&db).await;
    let horizon = &status["horizon"];
    assert_eq!(
        horizon["oldest_session"]["state"], "idle in transaction",
        "{status}"
    );
    assert!(
        horizon["held_secs"].as_f64().is_some_and(|s| s >= 0.0),
        "{status}"
    );
    assert_eq!(horizon["warn_after_secs"], 300, "{status}");
    assert_eq!(horizon["warning"], false, "{status}");
    assert!(horizon["outbox"]["dead"].is_i64(), "{status}");

    // Past the threshold (0 s here) the line is a warning saying how to end the session.
    let (ok, text, stderr) = courier_status(&db, &["--horizon-warn-secs", "0"]).await;
    assert!(ok, "{stderr}");
    let line = text
        .lines()
        .find(|l| l.contains("xmin horizon:"))
        .unwrap_or_else(|| panic!("no horizon line:\n{text}"));
    assert!(
        line.trim_start().starts_with("WARNING xmin horizon: held ")
            && line.contains(&format!("by pid {pid} (idle in transaction"))
            && line.contains("outbox dead tuples ")
            && line.contains(&format!("SELECT pg_terminate_backend({pid})")),
        "{line}"
    );

    pinned.batch_execute("COMMIT").await?;
    wait_until(WAIT, "status --json no longer naming it", || async {
        status_json(&db).await["horizon"]["oldest_session"]["pid"] != pid
    })
    .await?;
    let (ok, text, stderr) = courier_status(&db, &["--horizon-warn-secs", "0"]).await;
    assert!(ok, "{stderr}");
    assert!(!text.contains(&format!("pid {pid}")), "{text}");
    Ok(())
}
