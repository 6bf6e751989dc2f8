//! `courier` — see `courier --help` and the library's documentation.

use clap::Parser;
use courier_cli::Cli;
use std::process::ExitCode;

/// mimalloc, as in the benchmarks: the relay allocates rows on its actor thread and the Pub/Sub
/// client frees them on others; with glibc's malloc that cost a quarter of the actor thread
/// (`courier-load drain`), and fragmentation grew the process with every 25,000 new ordering
/// keys (`tests/distinct_keys.rs`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    courier::telemetry::init_logging(cli.log_json, cli.default_log_level());
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(courier_cli::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
