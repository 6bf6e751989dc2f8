//! `search serve | migrate | provision | rebuild …` — see `search --help`.

/// mimalloc, as in the other services (see services/catalog/src/main.rs).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    courier_cli::service::main(courier_search::service)
}
