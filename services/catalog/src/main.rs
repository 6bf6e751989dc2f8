//! `catalog serve | migrate | provision` — see `catalog --help`.

fn main() -> std::process::ExitCode {
    courier::service::cli::main(courier_catalog::service)
}
