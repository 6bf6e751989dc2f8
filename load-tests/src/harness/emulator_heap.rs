//! The Java heap the emulator gets for a run. It keeps every message published to it, acked or
//! not, for as long as it runs; once they fill its heap it spends its CPU collecting garbage and
//! fails publishes, which a run would read as the pipeline falling behind (run D1: a 1 GiB heap
//! gave way 540 s into a soak at 1,006 writes/s; with 4 GiB the same soak ran 17 minutes clean).

use courier_testkit::TEST_HEAP_MIB;
use procfs::Current as _;

/// Heap a message holds in the emulator, rounded up: 150,052 `PubsubMessage`s, every message
/// of a 150 s soak at 1,000/s, held ~265 MB of live heap (`jcmd <pid> GC.class_histogram`),
/// ~1.8 KB each with Courier's attributes.
const BYTES_PER_MESSAGE: u64 = 2 * 1024;

/// What the emulator needs besides the messages (a thread per ordering key, its buffers).
const BASE_MIB: u64 = 512;

const MIB: u64 = 1024 * 1024;

/// The heap for a run that publishes up to `messages` (`None`: not known before it starts): at
/// least the tests' heap, at most half of this machine's memory.
pub fn heap_mib(messages: Option<u64>) -> u64 {
    let half_of_memory = procfs::Meminfo::current().map_or(u64::MAX, |m| m.mem_total / 2 / MIB);
    heap_within(messages, half_of_memory)
}

fn heap_within(messages: Option<u64>, most_mib: u64) -> u64 {
    let wanted = messages.map_or(u64::MAX, |n| {
        BASE_MIB.saturating_add(n.saturating_mul(BYTES_PER_MESSAGE) / MIB)
    });
    wanted.min(most_mib).max(TEST_HEAP_MIB)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_gets_a_heap_for_its_messages_between_the_tests_heap_and_its_bound() {
        // A 10-minute soak at 1,000/s: 600,000 messages, ~1.2 GB of them.
        assert_eq!(heap_within(Some(600_000), 12_288), 512 + 1_171);
        assert_eq!(heap_within(Some(1_000), 12_288), TEST_HEAP_MIB);
        assert_eq!(heap_within(Some(100_000_000), 12_288), 12_288);
        assert_eq!(heap_within(None, 12_288), 12_288);
        assert_eq!(heap_within(None, 512), TEST_HEAP_MIB);
    }
}
