//! Issue 22: the operator's commands reach a PostgreSQL that accepts TLS only, with libpq's
//! `sslmode`/`sslrootcert` in the URL or as `database.*` settings, and say why when the
//! certificate does not fit.

use courier_testkit::TlsPostgres;
use std::process::Command;

/// Runs `courier` with `env` on top of an empty config; returns (success, stdout, stderr).
fn courier(env: &[(&str, String)], args: &[&str]) -> (bool, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_courier"));
    command
        .args(["--config", "/dev/null"])
        .args(args)
        .env("COURIER_DATABASE__CONNECT_TIMEOUT_SECS", "2")
        .env("RUST_LOG", "warn");
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().expect("run courier");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn commands_connect_over_verified_tls_and_name_a_certificate_that_does_not_fit() {
    let pg = TlsPostgres::start().expect("start a TLS-only PostgreSQL");
    let verify_full = |host: &str| {
        pg.url(
            host,
            "postgres",
            &format!("?sslmode=verify-full&sslrootcert={}", pg.ca_cert.display()),
        )
    };

    let (ok, stdout, stderr) = courier(
        &[("COURIER_DATABASE__URL", verify_full("localhost"))],
        &["migrate", "--json"],
    );
    assert!(ok, "migrate over verify-full: {stdout}{stderr}");
    assert!(stdout.contains("0001_create_outbox"), "{stdout}");
    let (ok, stdout, stderr) = courier(
        &[
            ("COURIER_DATABASE__URL", pg.url("localhost", "postgres", "")),
            ("COURIER_DATABASE__SSLMODE", "verify-full".into()),
            (
                "COURIER_DATABASE__SSL_ROOT_CERT",
                pg.ca_cert.display().to_string(),
            ),
        ],
        &["outbox", "stats"],
    );
    assert!(ok, "outbox stats with the settings: {stdout}{stderr}");

    let (ok, stdout, stderr) = courier(
        &[("COURIER_DATABASE__URL", verify_full("127.0.0.1"))],
        &["outbox", "stats"],
    );
    assert!(
        !ok,
        "a certificate for localhost accepted for 127.0.0.1: {stdout}"
    );
    assert!(
        stderr.contains("not valid for name") && stderr.contains("127.0.0.1"),
        "the error does not say the certificate names another host: {stderr}"
    );

    let (ok, _, stderr) = courier(
        &[
            ("COURIER_DATABASE__URL", pg.url("localhost", "postgres", "")),
            ("COURIER_DATABASE__SSLMODE", "verify-everything".into()),
        ],
        &["outbox", "stats"],
    );
    assert!(!ok && stderr.contains("sslmode"), "{stderr}");
}
