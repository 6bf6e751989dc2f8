//! Committer: gathers the ready groups of many keys' projectors into shared transactions.
//!
//! A projector hands over its next group (its key's ready deliveries) and waits for the
//! outcome. The committer collects groups until `consumer.commit_max_events` events wait or
//! the first has waited `consumer.commit_linger_millis`, then applies them in one transaction
//! (inbox for all, each key's handler, one offset save, one commit), then acks. Each key has at
//! most one group in flight (its projector waits for the outcome), so per-key order and the
//! gate hold; how many transactions run at once is bounded by the pool
//! ([`ConsumerParts::transactions`]). A shared transaction that fails falls back to one
//! transaction per key (`project_many`).

use crate::inbound::delivery::Delivery;
use crate::inbound::parts::ConsumerParts;
use crate::inbound::projection::Projection;
use crate::inbound::transaction::{project_many, Settled};
use actix::prelude::*;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// Apply this group (one key's ready deliveries) and say how it went.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Commit<E: 'static> {
    pub(crate) group: Vec<Delivery<E>>,
    /// Dropped unanswered (the committer stopped): the deliveries were dropped too, so nacked.
    pub(crate) reply: oneshot::Sender<Settled<E>>,
}

pub struct Committer<P: Projection> {
    parts: Arc<ConsumerParts<P>>,
    pending: Vec<Commit<P::Event>>,
    pending_events: usize,
    linger: Option<SpawnHandle>,
}

impl<P: Projection> Committer<P> {
    pub fn new(parts: Arc<ConsumerParts<P>>) -> Self {
        Self {
            parts,
            pending: Vec::new(),
            pending_events: 0,
            linger: None,
        }
    }

    fn flush(&mut self, ctx: &mut Context<Self>) {
        if let Some(linger) = self.linger.take() {
            ctx.cancel_future(linger);
        }
        let batch = std::mem::take(&mut self.pending);
        self.pending_events = 0;
        if batch.is_empty() {
            return;
        }
        let (groups, replies): (Vec<_>, Vec<_>) =
            batch.into_iter().map(|c| (c.group, c.reply)).unzip();
        let parts = self.parts.clone();
        ctx.spawn(
            async move {
                let outcomes = project_many(parts, groups).await;
                for (reply, settled) in replies.into_iter().zip(outcomes) {
                    // A projector that stopped meanwhile has nothing left to update.
                    let _ = reply.send(settled);
                }
            }
            .into_actor(self),
        );
    }
}

impl<P: Projection> Actor for Committer<P> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Each live projector has at most one group here.
        ctx.set_mailbox_capacity(self.parts.settings.max_live_projectors as usize);
    }
}

impl<P: Projection> Supervised for Committer<P> {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        // Dropped with their replies: the projectors see their deliveries nacked.
        self.pending.clear();
        self.pending_events = 0;
        self.linger = None;
    }
}

impl<P: Projection> Handler<Commit<P::Event>> for Committer<P> {
    type Result = ();

    fn handle(&mut self, msg: Commit<P::Event>, ctx: &mut Self::Context) {
        self.pending_events += msg.group.len();
        self.pending.push(msg);
        let settings = &self.parts.settings;
        if self.pending_events >= settings.commit_max_events as usize {
            self.flush(ctx);
        } else if self.linger.is_none() {
            let linger = Duration::from_millis(settings.commit_linger_millis);
            self.linger = Some(ctx.run_later(linger, |act, ctx| {
                act.linger = None;
                act.flush(ctx);
            }));
        }
    }
}
