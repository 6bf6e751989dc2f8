//! The catalog binary's command line: help, a rebuild that refuses to run unconfirmed, and
//! backfill flags checked at the edge.

use std::process::{Command, Stdio};

fn catalog(args: &[&str]) -> std::process::Output {
    let config = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/local/catalog.toml"
    );
    Command::new(env!("CARGO_BIN_EXE_catalog"))
        .args(["--config", config])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run catalog")
}

#[test]
fn help_lists_every_subcommand() {
    let output = catalog(&["--help"]);
    let text = String::from_utf8_lossy(&output.stdout);
    for sub in ["serve", "migrate", "provision", "rebuild", "backfill"] {
        assert!(text.contains(sub), "{sub} missing from:\n{text}");
    }
}

#[test]
fn a_rebuild_without_yes_and_without_a_terminal_changes_nothing() {
    let output = catalog(&["rebuild", "--projection", "projector"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--yes"), "{stderr}");
}

#[test]
fn a_bad_flag_value_is_named() {
    let output = catalog(&[
        "rebuild",
        "--projection",
        "projector",
        "--from",
        "yesterday",
        "--yes",
    ]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--from"), "{stderr}");
}

#[test]
fn backfill_help_names_its_options() {
    let output = catalog(&["backfill", "--help"]);
    let text = String::from_utf8_lossy(&output.stdout);
    for flag in [
        "--dry-run",
        "--batch-size",
        "--status",
        "--aggregate",
        "resume",
    ] {
        assert!(text.contains(flag), "{flag} missing from:\n{text}");
    }
    assert!(
        text.contains("catalog backfill"),
        "examples name the binary:\n{text}"
    );
}

#[test]
fn a_backfill_batch_size_out_of_range_is_refused_by_name() {
    for size in ["0", "10001", "many"] {
        let output = catalog(&["backfill", "--batch-size", size]);
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("--batch-size"), "{stderr}");
    }
}

#[test]
fn a_backfill_of_an_unknown_aggregate_names_the_known_ones() {
    let output = catalog(&["backfill", "--aggregate", "playlist", "--dry-run"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("playlist") && stderr.contains("video"),
        "{stderr}"
    );
}

/// `catalog` with its database pointed at `database` through the environment.
fn catalog_on(database: &courier::config::DatabaseConfig, args: &[&str]) -> (bool, String, String) {
    let config = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/local/catalog.toml"
    );
    let output = Command::new(env!("CARGO_BIN_EXE_catalog"))
        .args(["--config", config])
        .args(args)
        .env("COURIER_DATABASE__URL", &database.url)
        .env(
            "COURIER_DATABASE__ROLE",
            database.role.as_deref().unwrap_or_default(),
        )
        .env(
            "COURIER_DATABASE__ADMIN_URL",
            database.admin_url.as_deref().unwrap_or_default(),
        )
        .stdin(Stdio::null())
        .output()
        .expect("run catalog");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn backfill_dry_run_then_run_then_status_through_the_binary() -> anyhow::Result<()> {
    let db = courier_testkit::TestDb::new().await?;
    let database = db.service_database("catalog");
    let (ok, _, err) = catalog_on(&database, &["migrate"]);
    assert!(ok, "{err}");
    db.pool
        .get()
        .await?
        .execute(
            "INSERT INTO catalog.videos (video_id, uploader_id, title, duration_secs, status, version)
             SELECT gen_random_uuid(), gen_random_uuid(), 'v' || i, 1, 'published', 1
             FROM generate_series(1, 5) i",
            &[],
        )
        .await?;
    let (ok, out, err) = catalog_on(&database, &["backfill", "--dry-run"]);
    assert!(
        ok && out.contains("would emit 5 video snapshot(s)"),
        "{out}{err}"
    );
    let outbox = "SELECT count(*) FROM catalog.outbox";
    let count = |sql: &'static str| {
        let pool = db.pool.clone();
        async move {
            pool.get()
                .await?
                .query_one(sql, &[])
                .await
                .map(|r| r.get::<_, i64>(0))
                .map_err(anyhow::Error::from)
        }
    };
    assert_eq!(count(outbox).await?, 0, "the dry run wrote an event");

    let (ok, out, err) = catalog_on(
        &database,
        &["backfill", "--batch-size", "2", "--reason", "cli test"],
    );
    assert!(ok, "{out}{err}");
    assert!(out.contains("5 snapshot(s) in 3 batch(es)"), "{out}");
    assert_eq!(count(outbox).await?, 5);

    let (ok, out, err) = catalog_on(&database, &["backfill", "--status"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("run #1 video: 5 snapshot(s) in 3 batch(es)")
            && out.contains("cli test")
            && out.contains("finished"),
        "{out}"
    );
    Ok(())
}
