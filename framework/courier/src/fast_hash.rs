//! The hasher of the relay's per-row maps (the claimer's rows in flight, the registry of key
//! publishers, keys with a lone row out). With a key per row each row is hashed there several
//! times, and std's SipHash cost the claimer's thread about a tenth of its CPU. foldhash is
//! several times faster on short keys and still seeded per process; the maps hold only rows
//! in flight, which the relay's limits bound.

/// A `BuildHasher` for those maps.
pub type FastHash = foldhash::quality::RandomState;
