//! The catalog binary's command line: help, and a rebuild that refuses to run unconfirmed.

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
    for sub in ["serve", "migrate", "provision", "rebuild"] {
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
