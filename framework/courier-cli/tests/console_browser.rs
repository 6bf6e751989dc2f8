//! The console in a real browser: headless Chromium (Debian's `chromium`) driven by Playwright
//! (`tests/browser/console.mjs`; `scripts/test` installs its pinned `playwright-core`) opens
//! the page on a running pipeline, finds the dead row and the parked key this test caused,
//! clicks Retry and Release, republishes a group of dead letters (confirming its count), and
//! the pipeline recovers: the dead key's rows, the parked key's events and the dead letter
//! reach the subscription, in order.
//!
//! `CONSOLE_SCREENSHOT=<path>` also saves the page as it first looks (how
//! docs/console.png is made).

use crate::pipeline;

use courier_testkit::wait_until;
use pipeline::{Pipeline, PARKED_KEY, TOKEN, WAIT};
use std::path::Path;
use std::process::Command;

#[tokio::test]
async fn an_operator_retries_a_dead_row_and_releases_a_parked_key_in_a_browser(
) -> anyhow::Result<()> {
    let browser = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    anyhow::ensure!(
        browser.join("node_modules/playwright-core").is_dir(),
        "playwright-core is not installed in {}: run the tests with scripts/test (its \
         ensure_console_browser installs it and Debian's chromium)",
        browser.display()
    );
    let p = Pipeline::start().await?;
    let console = p.console(Some(TOKEN)).await?;
    let mut args = vec![
        "console.mjs".to_string(),
        console.url.clone(),
        TOKEN.to_string(),
        p.dead_event_id.clone(),
        PARKED_KEY.to_string(),
    ];
    if let Ok(path) = std::env::var("CONSOLE_SCREENSHOT") {
        args.push(path);
    }
    let output = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .args(&args)
            .current_dir(&browser)
            .output()
    })
    .await??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "the browser run failed:\n{stdout}\n{stderr}"
    );

    // What the clicks did, seen from the pipeline.
    wait_until(WAIT, "the dead key's v1 and v2 delivered", || async {
        p.versions_of("video-dead").len() >= 2
    })
    .await?;
    assert_eq!(p.versions_of("video-dead"), ["1", "2"]);
    wait_until(WAIT, "the parked key's events delivered", || async {
        p.versions_of(PARKED_KEY).len() >= 2
    })
    .await?;
    assert_eq!(p.versions_of(PARKED_KEY), ["3", "4"]);
    p.delivered_again("e1").await?;
    assert_eq!(
        p.db.scalar(
            "SELECT count(*) FROM courier.outbox_operator_actions
             WHERE action = 'retry' AND actor LIKE 'playwright (console, %' AND reason = 'topic created'"
        )
        .await?,
        1
    );
    assert_eq!(
        p.db.scalar(
            "SELECT count(*) FROM courier.parked_key_releases
             WHERE released_by LIKE 'playwright (console, %' AND skipped_to = 3"
        )
        .await?,
        1
    );
    p.relay.kill();
    Ok(())
}
