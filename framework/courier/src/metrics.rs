//! Metric names (one place) and the Prometheus exporter.
//!
//! Names follow the agreed set (`outbox_*`, `projection_*`, `dlq_*`); Courier's own additions use
//! the `courier_` prefix. Labels come from small fixed sets (actor kind, shard) — never an
//! aggregate id, ordering key or error text.

/// Unpublished, not-dead outbox rows (gauge).
pub const OUTBOX_PENDING_COUNT: &str = "outbox_pending_count";
/// Dead outbox rows waiting for an operator (gauge).
pub const OUTBOX_DEAD_COUNT: &str = "outbox_dead_count";
/// Age of the oldest pending row (gauge, seconds).
pub const OUTBOX_OLDEST_PENDING_SECONDS: &str = "outbox_oldest_pending_seconds";
/// Largest publish_attempts among pending rows (gauge).
pub const OUTBOX_MAX_DELIVERY_ATTEMPTS: &str = "outbox_max_delivery_attempts";
/// Rows published and acknowledged by Pub/Sub (counter).
pub const OUTBOX_PUBLISH_SUCCESS_TOTAL: &str = "outbox_publish_success_total";
/// Key batches that hit a publish failure (counter).
pub const OUTBOX_PUBLISH_ERROR_TOTAL: &str = "outbox_publish_error_total";
/// Hand-over to acknowledgement of a publish (histogram, seconds).
pub const OUTBOX_PUBLISH_LATENCY: &str = "outbox_publish_latency";
/// Rows that became dead (counter).
pub const OUTBOX_DEAD_TOTAL: &str = "outbox_dead_total";
/// Events appended (counter).
pub const OUTBOX_APPENDED_TOTAL: &str = "courier_outbox_appended_total";
/// Appends skipped as replays: a version appended before with the same cause (counter).
pub const OUTBOX_REPLAYED_APPENDS_TOTAL: &str = "courier_outbox_replayed_appends_total";
/// Rows per non-empty claim (histogram).
pub const OUTBOX_CLAIM_BATCH_SIZE: &str = "courier_outbox_claim_batch_size";
/// Shards this process owns (gauge).
pub const OUTBOX_OWNED_SHARDS: &str = "courier_outbox_owned_shards";
/// Live per-key publisher actors (gauge).
pub const LIVE_PUBLISHERS: &str = "courier_live_publishers";
/// The relay's adaptive limit on publishes in flight (gauge, set with each heartbeat; see
/// `relay::publish_limit`).
pub const RELAY_PUBLISH_LIMIT: &str = "courier_relay_publish_limit";
/// Rows handed to Pub/Sub and not settled yet, across the relay (gauge, set with each
/// heartbeat).
pub const RELAY_PUBLISHES_IN_FLIGHT: &str = "courier_relay_publishes_in_flight";
/// Distinct ordering keys among the rows out, i.e. publish requests asked of the connection
/// (gauge, set with each heartbeat).
pub const RELAY_KEYS_OUT: &str = "courier_relay_keys_out";
/// Times the limit shrank, by `signal` (`slow_ack`, `broker_failure`) (counter).
pub const RELAY_CONGESTION_TOTAL: &str = "courier_relay_congestion_total";
/// Publishes that failed on the broker's side (timeout, unavailable, overloaded): retried
/// without counting toward the row's attempts (counter).
pub const OUTBOX_BROKER_FAILURES_TOTAL: &str = "courier_outbox_broker_failures_total";
/// How long the oldest open transaction of the service's database (a session's snapshot or a
/// prepared transaction) has held back the xmin horizon, so vacuum cannot clean the outbox
/// (gauge, seconds, set with the backlog gauges; 0 when none is open; NaN while another
/// role's session holds it and the relay's role lacks `pg_monitor`; see `horizon`).
pub const POSTGRES_XMIN_HORIZON_AGE_SECONDS: &str = "courier_postgres_xmin_horizon_age_seconds";
/// Transactions begun since the xmin that oldest transaction holds (gauge, set with the
/// backlog gauges; visible without `pg_monitor`).
pub const POSTGRES_XMIN_HORIZON_AGE_TRANSACTIONS: &str =
    "courier_postgres_xmin_horizon_age_transactions";
/// Transactions begun since the oldest `xmin` or `catalog_xmin` a replication slot holds
/// (gauge, set with the backlog gauges; 0 without such a slot). Slots have no timestamp.
pub const POSTGRES_REPLICATION_SLOT_XMIN_AGE_TRANSACTIONS: &str =
    "courier_postgres_replication_slot_xmin_age_transactions";
/// Dead row versions in the outbox table that vacuum has not removed yet, as PostgreSQL's
/// statistics count them (gauge, set with the backlog gauges).
pub const OUTBOX_DEAD_TUPLES: &str = "courier_outbox_dead_tuples";
/// Events committed by projections, first-time or duplicate (counter).
pub const PROJECTION_PROCESS_SUCCESS_TOTAL: &str = "projection_process_success_total";
/// Events whose projection failed: rejected, handler error, statement or commit (counter).
pub const PROJECTION_PROCESS_ERROR_TOTAL: &str = "projection_process_error_total";
/// Receipt to ack of an event (histogram, seconds).
pub const PROJECTION_PROCESS_LATENCY: &str = "projection_process_latency";
/// Incoming version minus stored version at a versioned upsert (gauge; 1 is in step).
pub const PROJECTION_VERSION_LAG: &str = "projection_version_lag";
/// Events sent to a dead-letter topic (counter).
pub const PROJECTION_DEAD_LETTERED_TOTAL: &str = "courier_projection_dead_lettered_total";
/// Redelivered or duplicated events recognised by the inbox (counter).
pub const PROJECTION_DUPLICATES_TOTAL: &str = "courier_projection_duplicates_total";
/// Projection transactions retried in place after a transient failure (counter).
pub const PROJECTION_TRANSIENT_RETRIES_TOTAL: &str = "courier_projection_transient_retries_total";
/// Keys holding later events until an event they gave back to Pub/Sub returns (gauge).
pub const PROJECTION_GATED_KEYS: &str = "courier_projection_gated_keys";
/// Gates opened by `consumer.gate_timeout_secs` rather than by the awaited event (counter).
pub const PROJECTION_GATE_TIMEOUTS_TOTAL: &str = "courier_projection_gate_timeouts_total";
/// Keys of contiguous projections parked behind a gap, per consumer group (gauge).
pub const PROJECTION_PARKED_KEYS: &str = "courier_projection_parked_keys";
/// Events acked into a parked key's keeping (counter).
pub const PROJECTION_PARKED_EVENTS_TOTAL: &str = "courier_projection_parked_events_total";
/// Events (of one or many keys) per committed projection transaction (histogram).
pub const PROJECTION_TRANSACTION_EVENTS: &str = "courier_projection_transaction_events";
/// Acks and nacks on exactly-once subscriptions, by `kind` and `result` (counter).
pub const CONSUMER_CONFIRMATIONS_TOTAL: &str = "courier_consumer_confirmations_total";
/// Live per-aggregate projector actors (gauge).
pub const LIVE_PROJECTORS: &str = "courier_live_projectors";
/// Messages received and not yet acked or nacked (gauge).
pub const RECEIVER_OUTSTANDING_MESSAGES: &str = "courier_receiver_outstanding_messages";

/// The agreed per-group offset lag gauge, `<group>_offset_lag_ms`, with the group name made a
/// valid metric name (anything but `[a-zA-Z0-9_]` becomes `_`).
pub fn offset_lag_metric(group: &str) -> String {
    let name: String = group
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let name = if name.starts_with(|c: char| c.is_ascii_digit()) {
        format!("_{name}")
    } else {
        name
    };
    format!("{name}_offset_lag_ms")
}

/// Dead letters a consumer group produced that nobody republished yet (gauge, label
/// `subscription`), from `dead_letter_log`.
pub const DLQ_MESSAGE_COUNT: &str = "dlq_message_count";

/// Messages handed to per-key actors and not yet finished, summed per kind (gauge, label
/// `actor`: `projector`, `key_publisher`).
pub const MAILBOX_DEPTH: &str = "courier_mailbox_depth";

/// Rows the retention janitor deleted (counter, label `table`: `outbox`, `inbox`).
pub const RETENTION_DELETED_TOTAL: &str = "courier_retention_deleted_total";

/// Snapshot events a backfill appended to the outbox (counter).
pub const BACKFILL_SNAPSHOTS_TOTAL: &str = "courier_backfill_snapshots_total";

/// Time a stage waited because the next one was full (histogram, seconds, label `stage`:
/// `receiver_flow_control` — outstanding-message limit reached; `router_mailbox` — the
/// projectors could not take more).
pub const BACKPRESSURE_WAIT_SECONDS: &str = "courier_backpressure_wait_seconds";

/// Actor restarts by kind (counter, label `actor`).
pub const ACTOR_RESTARTS_TOTAL: &str = "courier_actor_restarts_total";

/// The exporter with the latency histograms' buckets (seconds).
fn prometheus_builder() -> Result<metrics_exporter_prometheus::PrometheusBuilder, String> {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Suffix("latency".into()),
            &[
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ],
        )
        .and_then(|builder| {
            builder.set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full(BACKPRESSURE_WAIT_SECONDS.into()),
                &[0.0001, 0.001, 0.01, 0.1, 1.0, 10.0],
            )
        })
        .map_err(|e| e.to_string())
}

/// Installs the global recorder and serves `/metrics` on `listen` (`host:port`): for a process
/// without an HTTP server of its own (the bare relay).
pub fn install_prometheus(listen: &str) -> Result<(), String> {
    let addr: std::net::SocketAddr = listen
        .parse()
        .map_err(|e| format!("metrics.listen {listen:?} is not host:port: {e}"))?;
    prometheus_builder()?
        .with_http_listener(addr)
        .install()
        .map_err(|e| format!("cannot start metrics endpoint on {listen}: {e}"))?;
    register_all();
    Ok(())
}

static HANDLE: std::sync::OnceLock<Option<metrics_exporter_prometheus::PrometheusHandle>> =
    std::sync::OnceLock::new();

/// The process-wide recorder for a service's own `/metrics` route, installed on first use;
/// `None` when another recorder was installed first. Several services in one process (tests,
/// the demo) share it.
pub fn prometheus_handle() -> Option<metrics_exporter_prometheus::PrometheusHandle> {
    HANDLE.get_or_init(|| install_recorder(None)).clone()
}

/// Installs the recorder for a process that runs exactly one service: every series carries
/// `service="<name>"`, so a dashboard can tell the services apart. Without effect once a
/// recorder is installed.
pub fn install_for_service(service: &str) {
    HANDLE.get_or_init(|| install_recorder(Some(service)));
}

fn install_recorder(
    service: Option<&str>,
) -> Option<metrics_exporter_prometheus::PrometheusHandle> {
    let installed = prometheus_builder().and_then(|builder| {
        let builder = match service {
            Some(service) => builder.add_global_label("service", service),
            None => builder,
        };
        builder.install_recorder().map_err(|e| e.to_string())
    });
    match installed {
        Ok(handle) => {
            register_all();
            spawn_upkeep(handle.clone());
            Some(handle)
        }
        Err(e) => {
            tracing::warn!(error = %e, "no metrics recorder for /metrics");
            None
        }
    }
}

/// How often the recorder's histograms are folded into their buckets.
const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The name of the thread that does it (tests look for it).
pub const UPKEEP_THREAD: &str = "courier-metrics";

/// Runs the recorder's upkeep for the life of the process. A recorder installed without the
/// exporter's own HTTP listener keeps every histogram sample until upkeep or a scrape folds
/// it into the buckets: a service nothing scrapes (a Cloud Run revision without a collector,
/// a scrape config that lost its target) grew by every claim, publish and projection it
/// timed. A thread of its own, not a task: the recorder is installed from whichever runtime,
/// or none, comes first.
fn spawn_upkeep(handle: metrics_exporter_prometheus::PrometheusHandle) {
    let spawned = std::thread::Builder::new()
        .name(UPKEEP_THREAD.into())
        .spawn(move || loop {
            std::thread::sleep(UPKEEP_EVERY);
            handle.run_upkeep();
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no metrics upkeep thread: histograms grow until scraped");
    }
}

/// Every unlabelled counter starts at 0 and every unlabelled gauge exists from the start, so
/// `rate()` and alerts see them before the first event (labelled series appear on first use).
pub fn register_all() {
    for name in [
        OUTBOX_PUBLISH_SUCCESS_TOTAL,
        OUTBOX_PUBLISH_ERROR_TOTAL,
        OUTBOX_DEAD_TOTAL,
        OUTBOX_APPENDED_TOTAL,
        OUTBOX_REPLAYED_APPENDS_TOTAL,
        OUTBOX_BROKER_FAILURES_TOTAL,
        PROJECTION_PROCESS_SUCCESS_TOTAL,
        PROJECTION_PROCESS_ERROR_TOTAL,
        PROJECTION_DEAD_LETTERED_TOTAL,
        PROJECTION_DUPLICATES_TOTAL,
        PROJECTION_TRANSIENT_RETRIES_TOTAL,
        PROJECTION_GATE_TIMEOUTS_TOTAL,
        PROJECTION_PARKED_EVENTS_TOTAL,
    ] {
        metrics::counter!(name).increment(0);
    }
    for name in [
        OUTBOX_PENDING_COUNT,
        OUTBOX_DEAD_COUNT,
        OUTBOX_OLDEST_PENDING_SECONDS,
        OUTBOX_MAX_DELIVERY_ATTEMPTS,
        OUTBOX_OWNED_SHARDS,
        LIVE_PUBLISHERS,
        RELAY_PUBLISH_LIMIT,
        RELAY_PUBLISHES_IN_FLIGHT,
        RELAY_KEYS_OUT,
        LIVE_PROJECTORS,
        PROJECTION_GATED_KEYS,
        RECEIVER_OUTSTANDING_MESSAGES,
    ] {
        metrics::gauge!(name).increment(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names of this process's threads (Linux).
    fn thread_names() -> Vec<String> {
        std::fs::read_dir("/proc/self/task")
            .map(|tasks| {
                tasks
                    .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
                    .map(|name| name.trim().to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn the_services_recorder_runs_its_upkeep() {
        prometheus_handle().expect("no other recorder in this test binary");
        // A new thread carries its parent's name until it names itself.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !thread_names().iter().any(|name| name == UPKEEP_THREAD) {
            assert!(
                std::time::Instant::now() < deadline,
                "no {UPKEEP_THREAD} thread among {:?}",
                thread_names()
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}
