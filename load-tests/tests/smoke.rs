//! Short runs of the harness's pipeline commands (seconds, small numbers) so the harness
//! cannot rot: each must finish, write its three report files, and its independent checker
//! must find nothing wrong. The numbers themselves are not judged here (goals, not tests).

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn run(command: &str, args: &[&str]) -> (Value, PathBuf) {
    run_allowing(command, args, &[0])
}

/// Like [`run`], accepting the exit codes in `allowed` (2: the checker found violations).
fn run_allowing(command: &str, args: &[&str], allowed: &[i32]) -> (Value, PathBuf) {
    let out = std::env::temp_dir().join(format!(
        "courier-load-smoke-{command}-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&out).expect("create the report directory");
    // Output to a file, not a pipe: an emulator the run starts (and its watchdog) may keep
    // inherited pipes open after the run ends, and reading a pipe to its end would wait on them.
    let log_path = out.join("output.log");
    let log = std::fs::File::create(&log_path).expect("create the output log");
    let status = Command::new(env!("CARGO_BIN_EXE_courier-load"))
        // An emulator of its own, started and stopped by the run: the test run's shared one
        // carries the state of every ordering key the other tests sent (docs/emulator.md), and
        // with it these end-to-end runs took 265 s each in CI against 35 s on a fresh one.
        .env_remove("PUBSUB_EMULATOR_HOST")
        .arg(command)
        .args(args)
        .arg("--out")
        .arg(&out)
        .stdout(log.try_clone().expect("log handle"))
        .stderr(log)
        .status()
        .expect("run courier-load");
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(
        status.code().is_some_and(|code| allowed.contains(&code)),
        "courier-load {command} failed ({status}):\n{output}"
    );
    for file in ["report.json", "summary.md", "chart.svg"] {
        assert!(
            out.join(file).exists(),
            "{command}: no {file} in {}",
            out.display()
        );
    }
    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("report.json")).expect("read report.json"),
    )
    .expect("report.json is JSON");
    (report, out)
}

/// The value of a report parameter (`parameters` is a list of `[name, value]`).
fn parameter<'a>(report: &'a Value, name: &str) -> &'a str {
    report["parameters"]
        .as_array()
        .and_then(|list| list.iter().find(|p| p[0] == name))
        .and_then(|p| p[1].as_str())
        .unwrap_or_else(|| panic!("no parameter {name}: {}", report["parameters"]))
}

/// The checker's counts that must all be zero, and the events it saw.
fn assert_clean(command: &str, report: &Value) -> u64 {
    let verdict = &report["verdict"];
    for key in [
        "lost",
        "double_effects",
        "phantom_effects",
        "order_violations",
        "projection_mismatches",
        "wrong_fields",
        "outbox_pending",
        "outbox_dead",
        "unexpected_dead_letters",
        "missing_dead_letters",
    ] {
        assert_eq!(verdict[key], 0, "{command}: {key} in {verdict}");
    }
    let committed = verdict["committed"].as_u64().expect("committed count");
    assert!(committed > 0, "{command} wrote nothing: {verdict}");
    assert_eq!(verdict["applied"], committed, "{command}: {verdict}");
    committed
}

/// Unique aggregates with delta events (each update carries one field): the checker compares
/// the projection field by field and the apply order per key, and finds nothing wrong.
#[test]
fn throughput_runs_end_to_end_and_reports_against_the_ceilings() {
    let (report, out) = run(
        "throughput",
        &[
            "--seconds",
            "3",
            "--probe-seconds",
            "1",
            "--writers",
            "2",
            "--key-space",
            "unique",
            "--updates",
            "3",
            "--workload",
            "delta",
        ],
    );
    assert_clean("throughput", &report);
    let rates: Vec<&str> = report["rates"]
        .as_array()
        .expect("rates")
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert!(
        rates.iter().any(|r| r.starts_with("PostgreSQL raw insert")),
        "{rates:?}"
    );
    assert!(
        rates.iter().any(|r| r.starts_with("emulator raw receive")),
        "{rates:?}"
    );
    assert!(
        rates.iter().any(|r| r.starts_with("end to end")),
        "{rates:?}"
    );
    let ratio = &report["ratios"][0];
    assert!(ratio["value"].as_f64().expect("ratio") > 0.0, "{ratio}");
    let bound = &report["ratios"][1];
    assert!(bound["value"].as_f64().expect("ratio") > 0.0, "{bound}");
    assert!(
        bound["met"].is_null(),
        "no goal, so neither met nor missed: {bound}"
    );
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn throughput_via_the_services_http_apis_reaches_the_other_services_replica() {
    let (report, out) = run(
        "throughput",
        &[
            "--via",
            "http",
            "--seconds",
            "2",
            "--probe-seconds",
            "1",
            "--writers",
            "2",
        ],
    );
    let end_to_end = report["rates"]
        .as_array()
        .expect("rates")
        .iter()
        .find(|r| {
            r["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("end to end"))
        })
        .cloned()
        .expect("an end-to-end rate");
    assert!(
        end_to_end["events"].as_u64().unwrap_or(0) > 0,
        "{end_to_end}"
    );
    assert_eq!(parameter(&report, "refused_or_failed_requests"), "0");
    let goals = report["goals"].as_array().expect("goals");
    // Every video reached the replica within the drain timeout, and no row died: a publish
    // the broker failed was retried.
    assert!(
        !goals.iter().any(|g| g["name"] == "converged"),
        "{}",
        report["goals"]
    );
    assert_eq!(parameter(&report, "outbox_rows_dead"), "0");
    // The relays' broker-failure counter is read. How many failed is the run's goal, not this
    // test's: on a CI machine running other tests against the same emulator, a stalled
    // emulator has left publishes unacknowledged past the 20 s deadline (26 of 320 once).
    let broker = goals
        .iter()
        .find(|g| g["name"] == "publishes failed on the broker's side")
        .expect("a goal for broker-side failures");
    assert!(
        broker["value"].as_str().is_some_and(|v| v
            .split(' ')
            .next()
            .is_some_and(|n| n.parse::<u64>().is_ok())),
        "the counter was not read: {broker}"
    );
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn latency_runs_open_loop_and_reports_percentiles_and_hops_beside_the_emulators() {
    let (report, out) = run(
        "latency",
        &[
            "--seconds",
            "3",
            "--warm-up-secs",
            "1",
            "--rate",
            "100",
            "--probe-seconds",
            "1",
            "--writers",
            "2",
            "--keys",
            "50",
        ],
    );
    let committed = assert_clean("latency", &report);
    let latency = &report["latency"];
    // The warm-up's writes are reported apart (after the emulator's own hop).
    let warm_up = &report["reference_latencies"][1];
    assert_eq!(
        latency["count"].as_u64().unwrap_or(0) + warm_up["count"].as_u64().unwrap_or(0),
        committed,
        "{latency} {warm_up}"
    );
    assert!(warm_up["count"].as_u64().unwrap_or(0) > 0, "{warm_up}");
    // Every measured event's time, split into its hops: the path's five and the mark beside it.
    let hops = report["hops"].as_array().cloned().unwrap_or_default();
    assert_eq!(hops.len(), 6, "{hops:?}");
    for hop in &hops {
        assert_eq!(hop["count"], latency["count"], "{hop}");
    }
    let (p50, p99) = (
        latency["p50_ms"].as_f64().unwrap_or(0.0),
        latency["p99_ms"].as_f64().unwrap_or(0.0),
    );
    assert!(p50 > 0.0 && p99 >= p50, "{latency}");
    assert!(
        report["reference_latencies"][0]["p99_ms"]
            .as_f64()
            .unwrap_or(0.0)
            > 0.0
    );
    let _ = std::fs::remove_dir_all(out);
}

/// A relay-only run's hop ends at the mark, after the broker's acknowledgement: the emulator's
/// own latency it is judged against ends at the acknowledgement too, not at a receipt (with
/// unique keys the emulator's delivery alone took 340 ms at p99, a budget the relay never used).
#[test]
fn relay_only_latency_is_judged_against_the_emulators_publish_acknowledgement() {
    let (report, out) = run(
        "latency",
        &[
            "--relay-only",
            "--key-space",
            "unique",
            "--updates",
            "1",
            "--seconds",
            "2",
            "--warm-up-secs",
            "1",
            "--rate",
            "100",
            "--writers",
            "2",
        ],
    );
    assert_clean("latency", &report);
    let reference = &report["reference_latencies"][0];
    assert!(
        reference["name"]
            .as_str()
            .unwrap_or_default()
            .contains("publish → acknowledged"),
        "{reference}"
    );
    assert!(
        reference["p99_ms"].as_f64().unwrap_or(0.0) > 0.0,
        "{reference}"
    );
    let _ = std::fs::remove_dir_all(out);
}

/// Relay kills, PostgreSQL restarts and emulator freezes. Consumer kills are left out here:
/// on the emulator they can break the subscription for good (see README, load tests).
#[test]
fn chaos_under_faults_loses_nothing_and_applies_nothing_twice() {
    // Three faults must strike: at worst 5 s gaps and two 5 s freezes put the third at 25 s
    // (20 s failed when two freezes were drawn).
    let (report, out) = run(
        "chaos",
        &[
            "--seconds",
            "28",
            "--rate",
            "50",
            "--writers",
            "2",
            "--keys",
            "30",
            "--min-gap-secs",
            "3",
            "--max-gap-secs",
            "5",
            "--poison",
            "2",
            "--faults",
            "kill-relay,restart-postgres,freeze-emulator",
            "--drain-timeout-secs",
            "240",
        ],
    );
    assert_clean("chaos", &report);
    // Faults, not poison messages (which share the timeline).
    let struck: u32 = parameter(&report, "faults_struck")
        .parse()
        .expect("a count");
    assert!(struck >= 3, "too few faults struck: {}", report["timeline"]);
    assert_eq!(parameter(&report, "poison"), "2", "{}", report["timeline"]);
    let _ = std::fs::remove_dir_all(out);
}

/// Projection rows held locked while handlers run with a lock timeout. Whether the framework
/// keeps every promise under it is the checker's verdict (exit 2 otherwise); here the faults
/// must strike and the run must end in a judged report. 12 s for three or four strikes: a
/// strike can find no row with events on their way (one full run's only strike of an 8 s run
/// did, 2.4 s in).
#[test]
fn handler_transient_faults_strike_and_the_run_is_judged() {
    let (report, out) = run_allowing(
        "throughput",
        &[
            "--seconds",
            "12",
            "--probe-seconds",
            "1",
            "--writers",
            "2",
            "--keys",
            "20",
            "--workload",
            "delta",
            "--faults",
            "handler-transient",
            "--min-gap-secs",
            "2",
            "--max-gap-secs",
            "3",
            // A dead-lettered event is never applied: the drain then ends at this timeout.
            "--drain-timeout-secs",
            "30",
        ],
        &[0, 2],
    );
    let struck: u32 = parameter(&report, "faults_struck")
        .parse()
        .expect("a count");
    assert!(struck >= 1, "{}", report["timeline"]);
    assert!(
        report["timeline"]
            .as_array()
            .is_some_and(|strikes| strikes.iter().any(|s| s[1]
                .as_str()
                .is_some_and(|what| what.contains("held locked") && !what.starts_with("0 ")))),
        "no strike held a row: {}",
        report["timeline"]
    );
    assert!(report["verdict"]["committed"].as_u64().unwrap_or(0) > 0);
    let _ = std::fs::remove_dir_all(out);
}

/// Relay only, unique keys, Pub/Sub slowed or silenced by the proxy: the run ends judged, with
/// every write published and the relay's memory drift stated.
#[test]
fn a_relay_only_soak_with_a_slow_broker_publishes_everything() {
    let (report, out) = run_allowing(
        "soak",
        &[
            "--relay-only",
            "--key-space",
            "unique",
            "--rate",
            "100",
            "--minutes",
            "0.3",
            "--faults",
            "broker-slow",
            "--min-gap-secs",
            "2",
            "--max-gap-secs",
            "2",
            "--seed",
            "7",
        ],
        &[0, 2],
    );
    assert_eq!(
        parameter(&report, "faults_struck"),
        "1",
        "{}",
        report["timeline"]
    );
    assert!(
        report["timeline"][0][1]
            .as_str()
            .is_some_and(|what| what.starts_with("Pub/Sub")),
        "{}",
        report["timeline"]
    );
    assert_eq!(report["verdict"]["lost"], 0, "{}", report["verdict"]);
    assert!(
        report["goals"]
            .as_array()
            .is_some_and(|goals| goals.iter().any(|g| g["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("relay-1 RSS drift")))),
        "{}",
        report["goals"]
    );
    let _ = std::fs::remove_dir_all(out);
}

/// A 30-second soak of 50 keys at 200 writes/s, the xmin horizon pinned from 10 s to its end.
const SMALL_PINNED_SOAK: [&str; 12] = [
    "--minutes",
    "0.5",
    "--rate",
    "200",
    "--pin-xmin-at",
    "10",
    "--probe-seconds",
    "2",
    "--writers",
    "2",
    "--keys",
    "50",
];

/// A soak with the xmin horizon pinned from 10 s to its end: the report compares the
/// statements before and while pinned and gives the framework tables' dead tuples. Whether the
/// framework met the goals is the measurement's business, not this test's.
#[test]
fn a_soak_with_the_xmin_horizon_pinned_reports_the_pinned_window() {
    let (report, out) = run("soak", &SMALL_PINNED_SOAK);
    assert_clean("soak", &report);
    assert_eq!(parameter(&report, "pin_xmin"), "--pin-xmin-at 10");
    let pins = report["pins"].as_array().expect("a pinned window");
    assert_eq!(pins.len(), 1, "{}", report["pins"]);
    let pin = &pins[0];
    let (from, to) = (
        pin["from_s"].as_f64().unwrap_or(0.0),
        pin["to_s"].as_f64().unwrap_or(0.0),
    );
    assert!(from > 0.0 && to > from, "{pin}");
    let statements = pin["statements"]
        .as_array()
        .unwrap_or_else(|| panic!("no statements compared: {pin}"));
    assert!(
        statements
            .iter()
            .any(|s| s["owner"] == "framework" && s["calls_pinned"].as_u64().unwrap_or(0) > 0),
        "no framework statement called while pinned: {pin}"
    );
    let outbox = pin["tables"]
        .as_array()
        .and_then(|tables| tables.iter().find(|t| t["table"] == "outbox"))
        .unwrap_or_else(|| panic!("no outbox tuples: {pin}"));
    for key in ["dead_at_start", "dead_at_end", "live_at_end"] {
        assert!(outbox[key].is_i64(), "{key}: {outbox}");
    }
    assert!(
        pin["oldest_snapshot_at_release_s"].as_f64().is_some(),
        "the pin's own snapshot was not seen: {pin}"
    );
    assert!(
        pin["run_queue"]
            .as_array()
            .is_some_and(|waits| waits.iter().any(|w| w["pinned"].as_f64().is_some())),
        "no backend's run-queue wait read while pinned: {pin}"
    );
    assert!(!parameter(&report, "emulator_heap").is_empty());
    let goals = report["goals"].as_array().expect("goals");
    for goal in [
        "framework statements' mean while xmin pinned",
        "framework statements' pages a call while xmin pinned",
    ] {
        assert!(
            goals
                .iter()
                .any(|g| g["name"].as_str().is_some_and(|n| n.starts_with(goal))),
            "{goal}: {}",
            report["goals"]
        );
    }
    let per_write = &pin["per_write"];
    assert!(
        per_write["writes_before"].as_i64().is_some_and(|n| n > 0)
            && per_write["writes_pinned"].as_i64().is_some_and(|n| n > 0)
            && per_write["ms_pinned"].as_f64().is_some_and(|ms| ms > 0.0),
        "no time per write compared: {pin}"
    );
    assert!(
        goals.iter().any(|g| g["name"].as_str().is_some_and(|n| {
            n.starts_with("framework statements' time per committed write while xmin pinned")
        })),
        "{}",
        report["goals"]
    );
    let summary = std::fs::read_to_string(out.join("summary.md")).expect("summary.md");
    assert!(summary.contains("## xmin pinned"), "{summary}");
    assert!(
        summary.contains("the framework's statements per committed write"),
        "{summary}"
    );
    assert!(summary.contains("| outbox |"), "{summary}");
    let _ = std::fs::remove_dir_all(out);
}

/// The application's rows appended (`--app-rows appended`) with delta events, under a pin:
/// the writers append each key's next version and the projection its fields on the newest,
/// and the checker compares the two views field by field. The writers' append reads the key's
/// newest version first, so its pages a call must not grow with the versions the pin keeps,
/// as an in-place upsert's do: that is what the switch is for.
#[test]
fn a_pinned_soak_with_the_applications_rows_appended_is_checked_and_its_appends_stay_flat() {
    let appended = ["--app-rows", "appended", "--workload", "delta"];
    let (report, out) = run("soak", &[&SMALL_PINNED_SOAK[..], &appended].concat());
    assert_clean("soak", &report);
    let shape = parameter(&report, "shape");
    assert!(shape.contains("rows appended"), "{shape}");
    let pin = &report["pins"][0];
    let append = pin["statements"]
        .as_array()
        .and_then(|statements| {
            statements.iter().find(|s| {
                s["owner"] == "harness"
                    && s["query"]
                        .as_str()
                        .is_some_and(|q| q.contains("FROM load.source_log"))
            })
        })
        .unwrap_or_else(|| panic!("the writers' append was not compared: {pin}"));
    let (before, pinned) = (
        append["pages_before"].as_f64().expect("pages before"),
        append["pages_pinned"].as_f64().expect("pages pinned"),
    );
    assert!(
        pinned <= 1.5 * before,
        "the writers' append read {before:.1} → {pinned:.1} pages a call: {append}"
    );
    let _ = std::fs::remove_dir_all(out);
}

/// `claim-cost` runs the relay's own claim statement (under EXPLAIN too), so it breaks when
/// that statement's parameters change: run it small, so such a change is caught here.
#[test]
fn claim_cost_runs_the_relays_claim_with_and_without_parked_rows() {
    let (report, _) = run(
        "claim-cost",
        &["--parked", "500", "--fresh", "2000", "--rounds", "1"],
    );
    let ratios = report["ratios"].as_array().expect("ratios");
    assert!(
        ratios
            .iter()
            .any(|r| r["value"].as_f64().is_some_and(|v| v > 0.0)),
        "{}",
        report["ratios"]
    );
}

/// `append --via sql` runs both writers and judges the SQL function on both counts of issue 57:
/// events/s and the machine's CPU per event, each against `Outbox::append` in the same run.
#[test]
fn append_via_sql_judges_the_rate_and_the_cpu_per_event() {
    let (report, out) = run(
        "append",
        &[
            "--via",
            "sql",
            "--seconds",
            "1",
            "--rounds",
            "2",
            "--clients",
            "2",
        ],
    );
    let rates = report["rates"].as_array().expect("rates");
    assert_eq!(rates.len(), 2, "{rates:?}");
    for rate in rates {
        assert!(rate["events"].as_u64().unwrap_or(0) > 0, "{rate}");
    }
    let ratios = report["ratios"].as_array().expect("ratios");
    let names: Vec<&str> = ratios.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "SQL append_event / Outbox::append",
            "CPU per event: SQL append_event / Outbox::append"
        ]
    );
    for ratio in ratios {
        assert!(ratio["value"].as_f64().unwrap_or(0.0) > 0.0, "{ratio}");
        assert!(ratio["met"].is_boolean(), "judged: {ratio}");
    }
    let _ = std::fs::remove_dir_all(out);
}
