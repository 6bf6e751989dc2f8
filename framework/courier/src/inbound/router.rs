//! ProjectorRouter: hands each delivery to its aggregate's projector, creating projectors on
//! demand under a cap on how many live at once.
//!
//! Deliveries of one key reach its projector in the order the router receives them (one
//! mailbox, synchronous hand-over). The registry is a dashmap shared with the projectors, which
//! leave it themselves when idle; a per-projector `queued` counter, changed only under the
//! registry entry's lock, keeps "hand over" and "leave" exclusive, as in the key publishers.

use crate::inbound::consumer::ConsumerParts;
use crate::inbound::delivery::Delivery;
use crate::inbound::projection::Projection;
use crate::inbound::projector::{Deliver, Projector, Stop};
use crate::supervision::Supervision;
use actix::prelude::*;
use dashmap::DashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often routing re-checks for an idle projector while all are busy at the cap.
const CAP_RECHECK: Duration = Duration::from_millis(5);

/// Deliveries waiting in the router's mailbox. Each stream awaits `send()`, so a full mailbox
/// stops the streams from pulling, and the subscriber's flow control pushes back to Pub/Sub.
const ROUTER_MAILBOX: usize = 1_024;

/// A live projector and the deliveries handed to it and not yet settled.
pub struct LiveProjector<P: Projection> {
    pub addr: Addr<Projector<P>>,
    pub queued: Arc<AtomicUsize>,
}

/// The registry of live projectors, by routing key.
pub struct LiveProjectors<P: Projection> {
    map: DashMap<String, LiveProjector<P>>,
}

impl<P: Projection> Default for LiveProjectors<P> {
    fn default() -> Self {
        Self {
            map: DashMap::new(),
        }
    }
}

impl<P: Projection> LiveProjectors<P> {
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Removes `key`'s projector if it is `addr` and has nothing queued; true if removed.
    pub(crate) fn leave_if_idle(&self, key: &str, addr: &Addr<Projector<P>>) -> bool {
        self.map
            .remove_if(key, |_, live| {
                live.addr == *addr && live.queued.load(Ordering::SeqCst) == 0
            })
            .is_some()
    }

    /// Stops one projector with nothing queued, making room under the cap.
    fn evict_one_idle(&self) -> bool {
        let idle_key = self
            .map
            .iter()
            .find(|e| e.queued.load(Ordering::SeqCst) == 0)
            .map(|e| e.key().clone());
        let Some(key) = idle_key else { return false };
        match self
            .map
            .remove_if(&key, |_, live| live.queued.load(Ordering::SeqCst) == 0)
        {
            Some((_, live)) => {
                live.addr.do_send(Stop);
                true
            }
            None => false,
        }
    }
}

pub struct ProjectorRouter<P: Projection> {
    parts: Arc<ConsumerParts<P>>,
    live: Arc<LiveProjectors<P>>,
    supervision: Supervision,
}

impl<P: Projection> ProjectorRouter<P> {
    pub fn new(
        parts: Arc<ConsumerParts<P>>,
        live: Arc<LiveProjectors<P>>,
        supervision: Supervision,
    ) -> Self {
        Self {
            parts,
            live,
            supervision,
        }
    }

    fn has_room(&self, key: &str) -> bool {
        self.live.map.contains_key(key)
            || self.live.len() < self.parts.settings.max_live_projectors as usize
            || self.live.evict_one_idle()
    }

    fn route(&mut self, delivery: Delivery<P::Event>) {
        let key = delivery.meta.routing_key().to_string();
        let mut message = Deliver(delivery);
        // Twice: a projector that stopped after the lookup has a closed mailbox.
        for _ in 0..2 {
            let mut entry = self
                .live
                .map
                .entry(key.clone())
                .or_insert_with(|| self.start_projector(&key));
            let live = entry.value_mut();
            live.queued.fetch_add(1, Ordering::SeqCst);
            match live.addr.try_send(message) {
                Ok(()) => return,
                Err(SendError::Full(Deliver(delivery))) => {
                    // Cannot happen while flow control bounds what is outstanding (the
                    // mailbox holds that many); if it does, Pub/Sub redelivers later.
                    live.queued.fetch_sub(1, Ordering::SeqCst);
                    tracing::warn!(ordering_key = %key, "projector mailbox full; message nacked");
                    self.parts.nack(delivery);
                    return;
                }
                Err(SendError::Closed(returned)) => {
                    live.queued.fetch_sub(1, Ordering::SeqCst);
                    message = returned;
                    drop(entry);
                    self.live.map.remove(&key);
                }
            }
        }
        self.parts.nack(message.0);
    }

    fn start_projector(&self, key: &str) -> LiveProjector<P> {
        let queued = Arc::new(AtomicUsize::new(0));
        let settings = &self.parts.settings;
        let mailbox = (settings.streams * settings.max_outstanding_messages) as usize;
        let addr = Projector::new(
            key.to_string(),
            self.parts.clone(),
            self.live.clone(),
            queued.clone(),
            mailbox,
        )
        .start();
        LiveProjector { addr, queued }
    }
}

impl<P: Projection> Actor for ProjectorRouter<P> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(ROUTER_MAILBOX);
    }
}

impl<P: Projection> Supervised for ProjectorRouter<P> {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        self.supervision.restarting();
    }
}

impl<P: Projection> Handler<Deliver<P::Event>> for ProjectorRouter<P> {
    type Result = ();

    fn handle(&mut self, msg: Deliver<P::Event>, ctx: &mut Self::Context) {
        let key = msg.0.meta.routing_key().to_string();
        if self.has_room(&key) {
            self.route(msg.0);
            return;
        }
        // Every live projector is busy at the cap: hold this delivery, and the mailbox behind
        // it, until one is idle. The streams wait on the full mailbox meanwhile.
        let live = self.live.clone();
        ctx.wait(
            async move {
                while !live.evict_one_idle() {
                    tokio::time::sleep(CAP_RECHECK).await;
                }
            }
            .into_actor(self)
            .map(move |(), act, _| act.route(msg.0)),
        );
    }
}
