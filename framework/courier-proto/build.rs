//! Compiles `proto/**/*.proto` with protox (pure Rust), so building needs no system `protoc`.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "catalog/v1/video_events.proto",
    "engagement/v1/video_events.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("proto");
    println!("cargo:rerun-if-changed={}", root.display());
    let descriptors = protox::compile(PROTOS, [&root])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
