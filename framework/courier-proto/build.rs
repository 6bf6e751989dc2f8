//! Compiles `proto/**/*.proto` with protox (pure Rust), so building needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    courier_build::protos("proto")
}
