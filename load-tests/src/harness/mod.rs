//! What the commands run on: the rig (a database, topics, config), the pipeline of relay and
//! consumer processes, the writers and the sampler, faults and pins, the independent checker,
//! and the probes of the limits each ratio is measured against.

pub mod canary;
pub mod checker;
pub mod cpu;
pub mod drive;
pub mod emulator_heap;
pub mod faults;
pub mod fixtures;
pub mod hops;
pub mod middle;
pub mod own_stack;
pub mod pg_statements;
pub mod pin;
pub mod pipeline;
pub mod processes;
pub mod rig;
pub mod run_queue;
pub mod stages;
pub mod workload;
