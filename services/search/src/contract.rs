//! The events the search service publishes, generated from `proto/search/v1/` by `build.rs`.

/// The topic of the index's events (ordering key = video id).
pub const TOPIC: &str = "search.video.events";
/// A video's search document.
pub const AGGREGATE_TYPE: &str = "search_document";

pub mod v1 {
    #![allow(clippy::doc_lazy_continuation)]
    include!(concat!(env!("OUT_DIR"), "/search.v1.rs"));
}
