//! The services' event contracts, generated from `proto/` by `build.rs`.
//!
//! # Layout
//! - [`catalog::v1`]: the Video aggregate's events (`catalog.video.events`).
//! - [`engagement::v1`]: a user's engagement with a video (`engagement.video.events`).

#![allow(clippy::doc_lazy_continuation, clippy::large_enum_variant)]

use chrono::{DateTime, Utc};

pub mod catalog {
    /// The topic the catalog publishes its video events on (ordering key = video id).
    pub const TOPIC: &str = "catalog.video.events";
    pub const AGGREGATE_TYPE: &str = "video";

    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/catalog.v1.rs"));
    }

    /// A video's status as the services store it (`draft`, `published`, `deleted`); an
    /// unspecified or unknown status is an error naming it (a consumer dead-letters the event).
    pub fn status_name(status: i32) -> Result<&'static str, String> {
        match v1::VideoStatus::try_from(status) {
            Ok(v1::VideoStatus::Draft) => Ok("draft"),
            Ok(v1::VideoStatus::Published) => Ok("published"),
            Ok(v1::VideoStatus::Deleted) => Ok("deleted"),
            Ok(v1::VideoStatus::Unspecified) | Err(_) => {
                Err(format!("video status {status} is unspecified or unknown"))
            }
        }
    }
}

pub mod engagement {
    /// The topic the engagement service publishes on (ordering key = aggregate id).
    pub const TOPIC: &str = "engagement.video.events";
    /// One user's engagement with one video.
    pub const AGGREGATE_TYPE: &str = "video_engagement";

    /// The aggregate id of `user_id`'s engagement with `video_id`.
    pub fn aggregate_id(
        video_id: impl std::fmt::Display,
        user_id: impl std::fmt::Display,
    ) -> String {
        format!("{video_id}:{user_id}")
    }

    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/engagement.v1.rs"));
    }
}

/// A protobuf timestamp of `at`.
pub fn timestamp(at: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: at.timestamp(),
        nanos: at.timestamp_subsec_nanos() as i32,
    }
}

/// The instant of a protobuf timestamp, `None` when it is out of chrono's range.
pub fn datetime(at: &prost_types::Timestamp) -> Option<DateTime<Utc>> {
    let nanos = u32::try_from(at.nanos).ok()?;
    DateTime::from_timestamp(at.seconds, nanos)
}
