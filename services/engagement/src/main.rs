//! `engagement serve | migrate | provision` — see `engagement --help`.

/// mimalloc, as in the benchmarks: the relay allocates rows on its actor thread and the Pub/Sub
/// client frees them on others; with glibc's malloc that cost a quarter of the actor thread
/// (`courier-load drain`), and fragmentation grew the process with every 25,000 new ordering
/// keys (`tests/distinct_keys.rs`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    courier_cli::service::main(courier_engagement::service)
}
