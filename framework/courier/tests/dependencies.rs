//! Issue 24: a service embedding the framework does not pull in command-line crates; those
//! live in `courier-cli`. Read from the manifest, so adding one back fails here.

#[test]
fn the_framework_crate_has_no_command_line_dependencies() {
    let manifest: toml::Table = toml::from_str(include_str!("../Cargo.toml")).expect("Cargo.toml");
    let dependencies = manifest
        .get("dependencies")
        .and_then(|d| d.as_table())
        .expect("[dependencies]");
    for crate_name in ["clap", "indicatif", "anyhow"] {
        assert!(
            !dependencies.contains_key(crate_name),
            "courier depends on {crate_name}: command-line code belongs in courier-cli"
        );
    }
}
