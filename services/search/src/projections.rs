//! `search_documents`: a document per catalog video, and in the same transaction the event
//! saying whether it can be found. Creates and snapshots carry the whole video; an update only
//! what changed, so versions apply one after another (`contiguous_versions`); a delete leaves a
//! tombstone. A redelivery is stopped by the inbox before `apply`; a replay (rebuild) applies
//! again and appends nothing again (the emitted event names its cause).

use crate::events::{document_event, Document};
use courier::db::PgTransaction;
use courier::inbound::{uuid_field, EventMeta, HandlerError, Projection};
use courier::outbox::Outbox;
use courier_proto::catalog::v1::{event::Payload, Event};
use uuid::Uuid;

#[derive(Clone)]
pub struct SearchIndex {
    /// The deployment's outbox (see `crate::service`).
    outbox: Outbox,
}

impl SearchIndex {
    pub fn new(outbox: Outbox) -> Self {
        Self { outbox }
    }
}

/// A video's whole state, as a create or a snapshot carries it.
struct WholeState<'a> {
    video_id: &'a str,
    title: &'a str,
    description: &'a str,
    status: i32,
}

impl SearchIndex {
    /// The document after `event`, or `None` when its row already holds this version or a
    /// newer one (then nothing is emitted).
    async fn index(
        &self,
        tx: &PgTransaction<'_>,
        meta: &EventMeta,
        event: &Event,
    ) -> Result<Option<Document>, HandlerError> {
        let version = meta.version;
        let (video_id, written) = match &event.payload {
            Some(Payload::VideoCreated(e)) => {
                let state = WholeState {
                    video_id: &e.video_id,
                    title: &e.title,
                    description: &e.description,
                    status: e.status,
                };
                upsert_whole(tx, state, version).await?
            }
            Some(Payload::VideoSnapshot(e)) => {
                let state = WholeState {
                    video_id: &e.video_id,
                    title: &e.title,
                    description: &e.description,
                    status: e.status,
                };
                upsert_whole(tx, state, version).await?
            }
            Some(Payload::VideoUpdated(e)) => {
                let video = uuid_field("video_id", &e.video_id)?;
                let status = e.status.map(status_name).transpose()?;
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
                    [&video, &e.title, &e.description, &status, &version];
                let row = tx
                    .query_opt(include_str!("queries/update_document.sql"), &params)
                    .await?;
                (video, row)
            }
            Some(Payload::VideoDeleted(e)) => {
                let video = uuid_field("video_id", &e.video_id)?;
                let none: Option<&str> = None;
                let row = tx
                    .query_opt(
                        include_str!("queries/update_document.sql"),
                        &[&video, &none, &none, &Some("deleted"), &version],
                    )
                    .await?;
                (video, row)
            }
            None => {
                return Err(HandlerError::Permanent(format!(
                    "{} event has no payload",
                    meta.event_type
                )))
            }
        };
        let Some(row) = written else {
            tracing::debug!(video_id = %video_id, version, "the document holds this version or a newer one");
            return Ok(None);
        };
        Ok(Some(Document {
            video_id,
            title: row.try_get("title")?,
            status: row.try_get("status")?,
        }))
    }
}

/// Writes `state` over an older version of the document (or inserts it).
async fn upsert_whole(
    tx: &PgTransaction<'_>,
    state: WholeState<'_>,
    version: i64,
) -> Result<(Uuid, Option<tokio_postgres::Row>), HandlerError> {
    let video = uuid_field("video_id", state.video_id)?;
    let status = status_name(state.status)?;
    let row = tx
        .query_opt(
            include_str!("queries/upsert_document.sql"),
            &[&video, &state.title, &state.description, &status, &version],
        )
        .await?;
    Ok((video, row))
}

/// The status as stored; an unknown one is the event's fault, for good.
fn status_name(status: i32) -> Result<&'static str, HandlerError> {
    courier_proto::catalog::status_name(status).map_err(HandlerError::Permanent)
}

impl Projection for SearchIndex {
    type Event = Event;

    /// An update carries only the changed fields: it applies only on top of the version
    /// before it.
    fn contiguous_versions(&self) -> bool {
        true
    }

    /// A create or a snapshot carries the whole video.
    fn is_whole_state(&self, _meta: &EventMeta, event: &Event) -> bool {
        matches!(
            event.payload,
            Some(Payload::VideoCreated(_) | Payload::VideoSnapshot(_))
        )
    }

    async fn apply(
        &self,
        tx: &PgTransaction<'_>,
        meta: &EventMeta,
        event: &Event,
    ) -> Result<(), HandlerError> {
        if let Some(document) = self.index(tx, meta, event).await? {
            self.outbox
                .append(tx, document_event(meta, &document))
                .await?;
        }
        Ok(())
    }
}
