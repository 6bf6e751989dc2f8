//! One module per `courier-load` command (and the hidden `worker` the pipeline commands
//! start); each parses its flags, runs on the harness and returns its report.

pub mod append;
pub mod baseline;
pub mod chaos;
pub mod claim_cost;
pub mod drain;
pub mod http_path;
pub mod latency;
pub mod limits;
pub mod project;
pub mod scale;
pub mod soak;
pub mod throughput;
pub mod worker;
