//! `courier console`'s page and JSON API against real PostgreSQL and the emulator: the state
//! shows a relay, the backlog, a dead row, a parked key and dead letters grouped by reason;
//! actions need the token, a reason and a name, refuse a stale bulk count, act through the
//! CLI's own functions (the pipeline recovers) and land in the audit log.

use crate::pipeline;

use courier_testkit::wait_until;
use pipeline::{Pipeline, GROUP, PARKED_KEY, TOKEN, WAIT};
use serde_json::{json, Value};

struct Api {
    client: awc::Client,
    base: String,
}

impl Api {
    fn new(url: &str) -> Self {
        Self {
            client: awc::Client::default(),
            base: url.to_owned(),
        }
    }

    async fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let mut response = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("GET {path}: {e}"))?;
        let body = response.body().await?;
        Ok((
            response.status().as_u16(),
            String::from_utf8_lossy(&body).into_owned(),
        ))
    }

    async fn state(&self) -> anyhow::Result<Value> {
        let (status, body) = self.get("api/state").await?;
        anyhow::ensure!(status == 200, "state answered {status}: {body}");
        Ok(serde_json::from_str(&body)?)
    }

    /// POSTs `body` to `path` with `token` as bearer; returns the status and the JSON answer.
    async fn post(
        &self,
        path: &str,
        token: Option<&str>,
        body: Value,
    ) -> anyhow::Result<(u16, Value)> {
        let mut request = self.client.post(format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let mut response = request
            .send_json(&body)
            .await
            .map_err(|e| anyhow::anyhow!("POST {path}: {e}"))?;
        let answer = response.json::<Value>().await.unwrap_or(Value::Null);
        Ok((response.status().as_u16(), answer))
    }
}

fn service(state: &Value) -> &Value {
    &state["services"][0]
}

fn held(state: &Value) -> u64 {
    state["dead_letters"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|k| k["held"].as_u64().unwrap_or(0))
        .sum()
}

#[actix_web::test]
async fn the_state_shows_the_trouble_and_actions_fix_it_through_the_clis_code() -> anyhow::Result<()>
{
    let p = Pipeline::start().await?;
    let console = p.console(Some(TOKEN)).await?;
    let api = Api::new(&console.url);

    // The page and its assets come from the binary.
    let (status, page) = api.get("").await?;
    assert_eq!(status, 200);
    assert!(page.contains("<title>Courier console</title>"), "{page}");
    assert!(page.contains("name=\"viewport\""), "readable on a phone");
    let (status, script) = api.get("console.js").await?;
    assert!(status == 200 && script.contains("api/state"));

    // Everything the pipeline holds, read at once (once the relay's heartbeat has recorded
    // the shards it took: the row is written before its first claim).
    wait_until(WAIT, "the relay's four shards in its heartbeat", || async {
        api.state().await.is_ok_and(|s| {
            service(&s)["relays"][0]["owned_shards"]
                .as_array()
                .is_some_and(|shards| shards.len() == 4)
        })
    })
    .await?;
    let state = api.state().await?;
    let svc = service(&state);
    assert_eq!(state["writable"], true);
    assert_eq!(svc["schema"], "courier");
    assert_eq!(svc["live_relays"], 1, "{svc}");
    let relay = &svc["relays"][0];
    assert!(
        relay["owned_shards"]
            .as_array()
            .is_some_and(|s| s.len() == 4),
        "{relay}"
    );
    assert!(relay["heartbeat_age_secs"].as_f64().is_some(), "{relay}");
    assert_eq!(svc["dead_rows"][0]["event_id"], p.dead_event_id.as_str());
    assert!(svc["dead_rows"][0]["last_error"]
        .as_str()
        .is_some_and(|e| e.to_lowercase().contains("not")));
    assert_eq!(svc["backlog"][0]["topic"], p.topic.as_str());
    assert_eq!(
        svc["backlog"][0]["pending"], 1,
        "v2 waits behind the dead v1"
    );
    assert_eq!(svc["backlog"][0]["dead"], 1);
    assert_eq!(svc["parked_keys"][0]["routing_key"], PARKED_KEY);
    assert_eq!(svc["parked_keys"][0]["held_events"], 2);
    assert!(svc["horizon"]["warning"].is_boolean());
    // The keeper is held from the first look; its two dead letters arrive on its stream.
    wait_until(WAIT, "both dead letters held", || async {
        api.state().await.is_ok_and(|s| held(&s) == 2)
    })
    .await?;
    let state = api.state().await?;
    let keeper = &state["dead_letters"][0];
    assert_eq!(keeper["subscription"], p.subscription.as_str());
    let mut reasons: Vec<&str> = keeper["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g["reason"].as_str())
        .collect();
    reasons.sort_unstable();
    assert_eq!(reasons, ["handler refused it", "unknown schema version 9"]);
    assert!(keeper["groups"][0]["event_type"] == "video.changed");

    // Refusals: no token, a wrong one, no reason, no name, not a dead row, a stale bulk count.
    let retry = |reason: &str, operator: &str| json!({ "schema": "courier", "event_ids": [p.dead_event_id], "reason": reason, "operator": operator });
    let (status, _) = api
        .post("api/outbox/retry", None, retry("fixed", "alice"))
        .await?;
    assert_eq!(status, 401);
    let (status, _) = api
        .post(
            "api/outbox/retry",
            Some("wrong-token-0123456789"),
            retry("fixed", "alice"),
        )
        .await?;
    assert_eq!(status, 401);
    let (status, answer) = api
        .post("api/outbox/retry", Some(TOKEN), retry(" ", "alice"))
        .await?;
    assert!(
        status == 400
            && answer["error"]
                .as_str()
                .is_some_and(|e| e.contains("reason")),
        "{answer}"
    );
    let (status, _) = api
        .post("api/outbox/retry", Some(TOKEN), retry("fixed", ""))
        .await?;
    assert_eq!(status, 400);
    let (status, answer) = api
        .post("api/outbox/retry", Some(TOKEN), json!({ "schema": "courier", "event_ids": [p.held_event_id], "reason": "x", "operator": "alice" }))
        .await?;
    assert!(
        status == 404
            && answer["error"]
                .as_str()
                .is_some_and(|e| e.contains(&p.held_event_id)),
        "{answer}"
    );
    let (status, _) = api
        .post("api/outbox/retry", Some(TOKEN), json!({ "schema": "courier", "all": true, "expected": 5, "reason": "x", "operator": "alice" }))
        .await?;
    assert_eq!(
        status, 409,
        "a bulk retry of a count that is not the current one"
    );
    let (status, _) = api
        .post("api/outbox/retry", Some(TOKEN), json!({ "schema": "nope", "event_ids": [p.dead_event_id], "reason": "x", "operator": "alice" }))
        .await?;
    assert_eq!(status, 404);
    assert_eq!(
        p.db.scalar("SELECT count(*) FROM courier.outbox_operator_actions")
            .await?,
        0,
        "nothing refused was done"
    );

    // Retry: the relay publishes v1, then v2 that waited behind it.
    let (status, answer) = api
        .post(
            "api/outbox/retry",
            Some(TOKEN),
            retry("topic created", "alice"),
        )
        .await?;
    assert_eq!(status, 200, "{answer}");
    wait_until(WAIT, "v1 and v2 of the dead key delivered", || async {
        p.versions_of("video-dead").len() >= 2
    })
    .await?;
    assert_eq!(p.versions_of("video-dead"), ["1", "2"]);

    // Release: the parked key's held events go back to the topic in version order.
    let (status, answer) = api
        .post(
            "api/parked/release",
            Some(TOKEN),
            json!({ "schema": "courier", "group": GROUP, "key": PARKED_KEY, "skip_to": 3,
                    "reason": "v2 is lost for good", "operator": "bob" }),
        )
        .await?;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["released"]["republished"], 2);
    wait_until(WAIT, "the parked key's events republished", || async {
        p.versions_of(PARKED_KEY).len() >= 2
    })
    .await?;
    assert_eq!(p.versions_of(PARKED_KEY), ["3", "4"]);
    let (status, _) = api
        .post(
            "api/parked/release",
            Some(TOKEN),
            json!({ "schema": "courier", "group": GROUP, "key": PARKED_KEY, "reason": "again", "operator": "bob" }),
        )
        .await?;
    assert_eq!(status, 404, "no longer parked");

    // Republish one group of dead letters (confirmed count); the other stays held.
    let group = json!({ "reason": "unknown schema version 9", "event_type": "video.changed" });
    let (status, _) = api
        .post(
            "api/dlq/republish",
            Some(TOKEN),
            json!({ "subscription": p.subscription, "group": group, "expected": 2, "reason": "v9 deployed", "operator": "carol" }),
        )
        .await?;
    assert_eq!(status, 409, "the group holds one, not two");
    let (status, answer) = api
        .post(
            "api/dlq/republish",
            Some(TOKEN),
            json!({ "subscription": p.subscription, "group": group, "expected": 1, "reason": "v9 deployed", "operator": "carol" }),
        )
        .await?;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["republished"], 1);
    let again = p.delivered_again("e1").await?;
    assert_eq!(again.ordering_key, "video-1");
    assert!(again
        .attributes
        .keys()
        .all(|k| !k.starts_with("courier_dlq_")));
    let state = api.state().await?;
    assert_eq!(held(&state), 1, "the other group stays held");
    assert_eq!(
        p.db.scalar(
            "SELECT count(*) FROM courier.dead_letter_log WHERE republished_at IS NOT NULL"
        )
        .await?,
        1
    );

    // The audit log, as the page shows it: who (name and address) and why.
    let audit = service(&state)["audit"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let line = |action: &str| {
        audit
            .iter()
            .find(|a| a["action"].as_str().is_some_and(|x| x.starts_with(action)))
            .cloned()
            .unwrap_or(Value::Null)
    };
    assert_eq!(line("retry")["reason"], "topic created", "{audit:?}");
    assert!(line("retry")["by"]
        .as_str()
        .is_some_and(|by| by.starts_with("alice (console, 127.0.0.1")));
    assert_eq!(line("release, skip to v3")["reason"], "v2 is lost for good");
    // The republish is audited in a table of its own (0022), with the letter it sent back.
    let republished = line("dead letter republished");
    assert_eq!(republished["reason"], "v9 deployed", "{audit:?}");
    assert!(republished["by"]
        .as_str()
        .is_some_and(|by| by.starts_with("carol (console, 127.0.0.1")));
    assert!(republished["target"]
        .as_str()
        .is_some_and(|target| target.contains("event e1") && target.contains("video-1")));
    assert_eq!(
        p.db.scalar("SELECT count(*) FROM courier.dead_letter_republishes")
            .await?,
        1
    );
    assert!(line("release")["by"]
        .as_str()
        .is_some_and(|by| by.starts_with("bob")));
    assert_eq!(
        service(&state)["dead_rows"].as_array().map(Vec::len),
        Some(0)
    );
    assert_eq!(
        service(&state)["parked_keys"].as_array().map(Vec::len),
        Some(0)
    );
    p.relay.kill();
    Ok(())
}

/// Read-only without a token; and a service whose schema cannot be read (here: never migrated)
/// is shown with its error beside the others.
#[actix_web::test]
async fn without_a_configured_token_the_console_is_read_only() -> anyhow::Result<()> {
    let p = Pipeline::start().await?;
    let missing =
        std::env::temp_dir().join(format!("{}.toml", courier_testkit::unique_name("console")));
    std::fs::write(
        &missing,
        format!(
            "[database]\nurl = {:?}\nschema = \"not_migrated\"\n",
            p.db.config.url
        ),
    )?;
    let missing_path = missing.to_string_lossy().into_owned();
    let console = p
        .console_with(
            None,
            &["--service", "/dev/null", "--service", &missing_path],
        )
        .await?;
    let api = Api::new(&console.url);
    let state = api.state().await?;
    std::fs::remove_file(&missing)?;
    assert_eq!(state["writable"], false);
    assert_eq!(
        service(&state)["dead_rows"][0]["event_id"],
        p.dead_event_id.as_str()
    );
    let unreadable = &state["services"][1];
    assert_eq!(unreadable["schema"], "not_migrated", "{state}");
    assert!(
        unreadable["error"]
            .as_str()
            .is_some_and(|e| e.contains("not_migrated")),
        "{unreadable}"
    );
    let (status, _) = api
        .post(
            "api/outbox/skip",
            Some(TOKEN),
            json!({ "schema": "courier", "event_id": p.dead_event_id, "reason": "x", "operator": "mallory" }),
        )
        .await?;
    assert_eq!(status, 403, "read-only, whatever the token");
    assert_eq!(
        p.db.scalar(
            "SELECT count(*) FROM courier.outbox WHERE dead_at IS NOT NULL AND skipped_at IS NULL"
        )
        .await?,
        1
    );
    p.relay.kill();
    Ok(())
}

/// A service mounts the same routes on its own server: the console then reads the service's
/// schema (its config), and its actions need the service's token.
#[actix_web::test]
async fn a_service_mounts_the_console_among_its_routes() -> anyhow::Result<()> {
    use actix_web::test::{call_and_read_body_json, call_service, init_service, TestRequest};
    use actix_web::{web, App};
    use courier::service::ServiceContext;
    let p = Pipeline::start().await?;
    let mut config = p.config.clone();
    config.http.auth_token = Some(TOKEN.into());
    let context = ServiceContext {
        service: "engagement",
        pool: p.db.pool.clone(),
        outbox: courier::outbox::Outbox::new(&config),
        config: std::sync::Arc::new(config),
    };
    let app = init_service(
        App::new()
            .app_data(web::Data::new(context))
            .configure(courier::service::http::configure_common)
            .configure(courier_cli::console::routes),
    )
    .await;
    let state: Value = call_and_read_body_json(
        &app,
        TestRequest::get().uri("/console/api/state").to_request(),
    )
    .await;
    assert_eq!(state["writable"], true);
    assert_eq!(
        service(&state)["dead_rows"][0]["event_id"],
        p.dead_event_id.as_str()
    );
    let page = call_service(&app, TestRequest::get().uri("/console/").to_request()).await;
    assert_eq!(page.status().as_u16(), 200);
    let skip = json!({ "schema": "courier", "event_id": p.dead_event_id, "reason": "superseded", "operator": "dave" });
    let refused = call_service(
        &app,
        TestRequest::post()
            .uri("/console/api/outbox/skip")
            .set_json(&skip)
            .to_request(),
    )
    .await;
    assert_eq!(refused.status().as_u16(), 401);
    let skipped = call_service(
        &app,
        TestRequest::post()
            .uri("/console/api/outbox/skip")
            .insert_header(("Authorization", format!("Bearer {TOKEN}")))
            .set_json(&skip)
            .to_request(),
    )
    .await;
    assert_eq!(skipped.status().as_u16(), 200);
    // The skipped row no longer holds its key: v2 is published.
    wait_until(WAIT, "v2 of the skipped key delivered", || async {
        p.versions_of("video-dead") == ["2"]
    })
    .await?;
    p.relay.kill();
    Ok(())
}
