//! `catalog serve | migrate | provision | rebuild | backfill` — see `catalog --help`.

fn main() -> std::process::ExitCode {
    courier::service::cli::main(courier_catalog::service)
}
