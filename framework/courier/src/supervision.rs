//! Restart policies for supervised actors.
//!
//! actix's `Supervisor` restarts an actor whose context stopped, immediately and without limit.
//! Each Courier actor adds what it lacks: on every restart it asks its [`RestartTracker`] for a
//! decision — restart after a delay (exponential backoff with full jitter), or, once more than
//! `max_restarts` happened within `window_secs`, escalate. Escalation ends the process with a
//! non-zero status so Cloud Run / Kubernetes restart it with fresh state.

use crate::backoff::Backoff;
use serde::Deserialize;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Exit status used when an actor exceeded its restart budget (EX_SOFTWARE).
pub const ESCALATION_EXIT_CODE: i32 = 70;

/// How an actor kind is restarted; one per kind in `[supervision.<kind>]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RestartPolicy {
    /// Restarts allowed within `window_secs`; one more escalates.
    pub max_restarts: u32,
    /// Sliding window over which restarts are counted.
    pub window_secs: u64,
    /// Delay ceiling before the first restart in a window.
    pub initial_delay_millis: u64,
    /// Largest delay between restarts.
    pub max_delay_millis: u64,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        Self {
            max_restarts: 10,
            window_secs: 60,
            initial_delay_millis: 100,
            max_delay_millis: 10_000,
        }
    }
}

impl RestartPolicy {
    /// Checks the policy; on error returns the field name and why.
    pub fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        if self.max_restarts == 0 {
            return Err(("max_restarts", "must be at least 1"));
        }
        if self.window_secs == 0 {
            return Err(("window_secs", "must be at least 1"));
        }
        if self.max_delay_millis < self.initial_delay_millis {
            return Err(("max_delay_millis", "must be at least initial_delay_millis"));
        }
        Ok(())
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(
            Duration::from_millis(self.initial_delay_millis),
            Duration::from_millis(self.max_delay_millis),
        )
    }
}

/// What to do about one more restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartDecision {
    /// Restart, doing no work until `delay` has passed.
    Restart { delay: Duration },
    /// The budget is spent: escalate.
    Escalate { restarts_in_window: usize },
}

/// Counts one actor's restarts in a sliding window.
#[derive(Debug, Clone)]
pub struct RestartTracker {
    policy: RestartPolicy,
    /// Times of restarts still inside the window, oldest first.
    recent: VecDeque<Instant>,
}

impl RestartTracker {
    pub fn new(policy: RestartPolicy) -> Self {
        Self {
            policy,
            recent: VecDeque::new(),
        }
    }

    /// Records a restart at `now` and decides.
    pub fn on_restart(&mut self, now: Instant) -> RestartDecision {
        let window = Duration::from_secs(self.policy.window_secs);
        while self
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) >= window)
        {
            self.recent.pop_front();
        }
        self.recent.push_back(now);
        let count = self.recent.len();
        if count > self.policy.max_restarts as usize {
            return RestartDecision::Escalate {
                restarts_in_window: count,
            };
        }
        let attempt = u32::try_from(count - 1).unwrap_or(u32::MAX);
        RestartDecision::Restart {
            delay: self.policy.backoff().delay(attempt),
        }
    }
}

/// Why an actor escalated.
#[derive(Debug, Clone)]
pub struct Escalation {
    /// Actor kind, as in the config (`claimer`, `notify_listener`, …).
    pub actor: &'static str,
    /// Which instance (`shard 3`), for the log.
    pub instance: String,
    pub restarts_in_window: usize,
}

/// What happens on escalation. Production: log and exit non-zero. Tests: record it.
pub type EscalationHandler = Arc<dyn Fn(Escalation) + Send + Sync>;

/// The production handler: log, then exit with [`ESCALATION_EXIT_CODE`].
pub fn exit_process_on_escalation() -> EscalationHandler {
    Arc::new(|e: Escalation| {
        tracing::error!(
            actor = e.actor,
            instance = %e.instance,
            restarts = e.restarts_in_window,
            "restart budget exceeded, exiting so the platform restarts the process"
        );
        std::process::exit(ESCALATION_EXIT_CODE);
    })
}

/// Restart bookkeeping every supervised Courier actor embeds.
pub struct Supervision {
    kind: &'static str,
    instance: String,
    tracker: RestartTracker,
    escalate: EscalationHandler,
    /// Delay to wait before doing work after the latest (re)start.
    pub start_delay: Duration,
}

impl Supervision {
    pub fn new(
        kind: &'static str,
        instance: impl Into<String>,
        policy: RestartPolicy,
        escalate: EscalationHandler,
    ) -> Self {
        Self {
            kind,
            instance: instance.into(),
            tracker: RestartTracker::new(policy),
            escalate,
            start_delay: Duration::ZERO,
        }
    }

    /// Call from `Supervised::restarting`: counts the restart and sets `start_delay`, or
    /// escalates. Returns false when the actor must not resume work (escalated).
    pub fn restarting(&mut self) -> bool {
        metrics::counter!(crate::metrics::ACTOR_RESTARTS_TOTAL, "actor" => self.kind).increment(1);
        match self.tracker.on_restart(Instant::now()) {
            RestartDecision::Restart { delay } => {
                tracing::warn!(
                    actor = self.kind,
                    instance = %self.instance,
                    delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    "actor restarting"
                );
                self.start_delay = delay;
                true
            }
            RestartDecision::Escalate { restarts_in_window } => {
                (self.escalate)(Escalation {
                    actor: self.kind,
                    instance: self.instance.clone(),
                    restarts_in_window,
                });
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(max_restarts: u32) -> RestartPolicy {
        RestartPolicy {
            max_restarts,
            window_secs: 10,
            initial_delay_millis: 100,
            max_delay_millis: 1_000,
        }
    }

    #[test]
    fn restarts_within_budget_then_escalates() {
        let mut tracker = RestartTracker::new(policy(3));
        let t0 = Instant::now();
        for i in 0..3 {
            let decision = tracker.on_restart(t0 + Duration::from_secs(i));
            assert!(
                matches!(decision, RestartDecision::Restart { delay } if delay <= Duration::from_millis(100 << i)),
                "{decision:?}"
            );
        }
        assert_eq!(
            tracker.on_restart(t0 + Duration::from_secs(3)),
            RestartDecision::Escalate {
                restarts_in_window: 4
            }
        );
    }

    #[test]
    fn old_restarts_leave_the_window() {
        let mut tracker = RestartTracker::new(policy(2));
        let t0 = Instant::now();
        assert!(matches!(
            tracker.on_restart(t0),
            RestartDecision::Restart { .. }
        ));
        assert!(matches!(
            tracker.on_restart(t0 + Duration::from_secs(1)),
            RestartDecision::Restart { .. }
        ));
        // Both earlier restarts are older than the 10 s window now.
        assert!(matches!(
            tracker.on_restart(t0 + Duration::from_secs(12)),
            RestartDecision::Restart { .. }
        ));
    }

    #[test]
    fn invalid_policies_name_the_field() {
        let mut p = policy(1);
        p.max_delay_millis = 1;
        assert_eq!(p.validate().map_err(|e| e.0), Err("max_delay_millis"));
    }
}
