//! The search service's own event contract (`proto/search/v1/`), compiled into `OUT_DIR`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    courier_build::protos("proto")
}
