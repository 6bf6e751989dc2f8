//! The hasher of the per-key and per-row maps (the claimer's rows in flight, the registries of
//! per-key actors: key publishers and projectors, keys with a lone row out). With a key per
//! row each row is hashed there several times, and std's SipHash cost the claimer's thread
//! about a tenth of its CPU. foldhash is several times faster on short keys and still seeded
//! per process; the maps hold only what is in flight or live, which the limits bound.

/// A `BuildHasher` for those maps.
pub type FastHash = foldhash::quality::RandomState;
