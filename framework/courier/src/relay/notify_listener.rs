//! NotifyListener: one dedicated connection doing `LISTEN`, turning notifications into wakes.
//!
//! NOTIFY is only a hint: claimers also poll. When the connection drops, this actor stops and
//! its supervisor reconnects it (with backoff); after every (re)connect it wakes all claimers,
//! since notifications sent while it was away are lost.

use crate::config::DatabaseConfig;
use crate::relay::shard_owner::WakeShard;
use crate::supervision::Supervision;
use actix::prelude::*;
use futures::stream::StreamExt;
use std::sync::Arc;
use tokio_postgres::{AsyncMessage, Client};

/// The word after a shard in a wake's payload (`"7 rescan"`) asking its claimer to scan from the
/// shard's start: rows below where its claims look became claimable (an operator's action).
pub const RESCAN: &str = "rescan";

pub struct NotifyListener {
    db: DatabaseConfig,
    channel: String,
    target: Recipient<WakeShard>,
    supervision: Supervision,
    /// Kept alive: dropping the client closes the LISTEN session.
    client: Option<Arc<Client>>,
    escalated: bool,
}

impl NotifyListener {
    pub fn new(
        db: DatabaseConfig,
        channel: String,
        target: Recipient<WakeShard>,
        supervision: Supervision,
    ) -> Self {
        Self {
            db,
            channel,
            target,
            supervision,
            client: None,
            escalated: false,
        }
    }

    fn connect(&mut self, ctx: &mut Context<Self>) {
        let db = self.db.clone();
        let channel = self.channel.clone();
        ctx.wait(
            async move { crate::db::dedicated(&db, "courier-notify-listener").await }
                .into_actor(self)
                .map(move |result, act, ctx| match result {
                    Ok((client, mut connection)) => {
                        // The connection must be polled for LISTEN to complete and for
                        // notifications to arrive; its messages become this actor's stream.
                        let messages =
                            futures::stream::poll_fn(move |cx| connection.poll_message(cx)).fuse();
                        ctx.add_stream(messages);
                        let listen = format!("LISTEN \"{channel}\"");
                        let client = Arc::new(client);
                        act.client = Some(client.clone());
                        // spawn, not wait: `wait` would pause the message stream that drives
                        // the connection, and LISTEN would never complete.
                        ctx.spawn(
                            async move { client.batch_execute(&listen).await }
                                .into_actor(act)
                                .map(|result, act, ctx| match result {
                                    Ok(()) => {
                                        tracing::info!(channel = %act.channel, "listening for outbox wakes");
                                        act.target.do_send(WakeShard {
                                            shard: None,
                                            rescan: true,
                                        });
                                    }
                                    Err(e) => {
                                        tracing::warn!(error = %e, "LISTEN failed");
                                        ctx.stop();
                                    }
                                }),
                        );
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "notify listener cannot connect");
                        ctx.stop();
                    }
                }),
        );
    }
}

impl Actor for NotifyListener {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if self.escalated {
            return;
        }
        ctx.run_later(self.supervision.start_delay, |act, ctx| act.connect(ctx));
    }

    fn stopping(&mut self, _ctx: &mut Self::Context) -> Running {
        self.client = None;
        Running::Stop
    }
}

impl Supervised for NotifyListener {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        if !self.supervision.restarting() {
            self.escalated = true;
        }
    }
}

impl StreamHandler<Result<AsyncMessage, tokio_postgres::Error>> for NotifyListener {
    fn handle(
        &mut self,
        item: Result<AsyncMessage, tokio_postgres::Error>,
        ctx: &mut Self::Context,
    ) {
        match item {
            Ok(AsyncMessage::Notification(n)) => {
                let mut words = n.payload().split_whitespace();
                let shard = words.next().and_then(|word| word.parse::<u32>().ok());
                let rescan = words.next() == Some(RESCAN);
                // Wakes are hints; when the owner's mailbox is full one is already queued.
                let _ = self.target.try_send(WakeShard { shard, rescan });
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "notify listener connection failed");
                ctx.stop();
            }
        }
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        tracing::warn!("notify listener connection closed");
        ctx.stop();
    }
}
