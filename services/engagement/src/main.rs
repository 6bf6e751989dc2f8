//! `engagement serve | migrate | provision` — see `engagement --help`.

fn main() -> std::process::ExitCode {
    courier::service::cli::main(courier_engagement::service)
}
