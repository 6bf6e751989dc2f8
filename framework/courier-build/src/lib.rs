//! Compiles a crate's event contracts to Rust in its build script, so a service owns its
//! `.proto` files beside its code. protox parses them in pure Rust (building needs no system
//! `protoc`); prost generates the types into `OUT_DIR`, one file per protobuf package.
//!
//! In the crate's `Cargo.toml`: `courier-build` under `[build-dependencies]`, `prost` and
//! `prost-types` under `[dependencies]`. Its `build.rs`:
//!
//! ```no_run
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     courier_build::protos("proto")
//! }
//! ```
//!
//! and where the package's types are wanted (for `package search.v1;`):
//!
//! ```ignore
//! pub mod v1 {
//!     include!(concat!(env!("OUT_DIR"), "/search.v1.rs"));
//! }
//! ```
//!
//! Imports resolve against the directory and protobuf's well-known types
//! (`google/protobuf/timestamp.proto`, …).

use std::error::Error;
use std::path::{Path, PathBuf};

/// Compiles every `.proto` file under `dir` (relative to the crate's root) and asks cargo to
/// build again when one changes. An error names the file and line protox or prost refused.
pub fn protos(dir: impl AsRef<Path>) -> Result<(), Box<dyn Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join(dir);
    println!("cargo:rerun-if-changed={}", root.display());
    let files = proto_files(&root)?;
    if files.is_empty() {
        return Err(format!("no .proto files under {}", root.display()).into());
    }
    let descriptors = protox::compile(&files, [&root])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}

/// The `.proto` files under `root`, relative to it, sorted (the generated code does not
/// depend on the order the directory lists them in).
fn proto_files(root: &Path) -> Result<Vec<PathBuf>, Box<dyn Error>> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let entries =
            std::fs::read_dir(&dir).map_err(|e| format!("read {}: {e}", dir.display()))?;
        for entry in entries {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "proto") {
                files.push(path.strip_prefix(root)?.to_path_buf());
            }
        }
    }
    files.sort();
    Ok(files)
}
