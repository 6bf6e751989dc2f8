//! The independent checker: reads the run's database directly (not the framework's counters)
//! and the dead-letter subscription, and reports every violation of the pipeline's promises:
//! - every committed write applied exactly once by effect (none lost, none twice, none
//!   applied that was never committed);
//! - the projection equal to the state computed from the committed writes;
//! - no version regression seen by the poller that sampled the projection during the run;
//! - the outbox drained, nothing dead;
//! - the dead letters exactly the poison messages the run injected.

use anyhow::Context as _;
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};

/// What the checker reads.
#[derive(Debug, Default)]
pub struct Facts {
    /// Committed writes: `(aggregate, version, value)`.
    pub writes: Vec<(String, i64, String)>,
    /// The projection's effects: `(aggregate, version)`, one per handler run that committed.
    pub applied: Vec<(String, i64)>,
    /// The read model: `(aggregate, version, value)`.
    pub projection: Vec<(String, i64, String)>,
    /// Outbox rows neither published nor dead.
    pub outbox_pending: i64,
    pub outbox_dead: i64,
    /// Ids of the messages found on the dead-letter subscription.
    pub dead_letters: Vec<String>,
    /// Ids of the poison messages the run published.
    pub injected_poison: Vec<String>,
    /// Version regressions the poller saw.
    pub regressions: Vec<Regression>,
}

/// A projection row seen at a lower version than it had been seen at before.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Regression {
    pub aggregate_id: String,
    pub seen: i64,
    pub then: i64,
}

/// The checker's findings: counts per promise, and examples of each violation.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Verdict {
    pub committed: u64,
    pub applied: u64,
    pub lost: u64,
    pub double_effects: u64,
    pub phantom_effects: u64,
    pub projection_mismatches: u64,
    pub regressions: u64,
    pub outbox_pending: i64,
    pub outbox_dead: i64,
    pub unexpected_dead_letters: u64,
    pub missing_dead_letters: u64,
    /// Up to a few examples per kind, for the report.
    pub examples: Vec<String>,
}

const EXAMPLES_PER_KIND: usize = 5;

impl Verdict {
    pub fn violations(&self) -> u64 {
        self.lost
            + self.double_effects
            + self.phantom_effects
            + self.projection_mismatches
            + self.regressions
            + u64::try_from(self.outbox_pending.max(0) + self.outbox_dead.max(0)).unwrap_or(0)
            + self.unexpected_dead_letters
            + self.missing_dead_letters
    }

    fn rows(&self) -> Vec<(&'static str, String)> {
        vec![
            ("committed writes", self.committed.to_string()),
            ("effects applied", self.applied.to_string()),
            ("lost (committed, never applied)", self.lost.to_string()),
            ("double effects", self.double_effects.to_string()),
            (
                "phantom effects (never committed)",
                self.phantom_effects.to_string(),
            ),
            (
                "projection rows ≠ source of truth",
                self.projection_mismatches.to_string(),
            ),
            ("version regressions observed", self.regressions.to_string()),
            ("outbox rows not published", self.outbox_pending.to_string()),
            ("outbox rows dead", self.outbox_dead.to_string()),
            (
                "dead letters not injected",
                self.unexpected_dead_letters.to_string(),
            ),
            (
                "injected poison not dead-lettered",
                self.missing_dead_letters.to_string(),
            ),
        ]
    }

    pub fn to_text(&self) -> String {
        let mut out = format!("  checker: {} violation(s)\n", self.violations());
        for (name, value) in self.rows() {
            out += &format!("    {name:<40} {value:>10}\n");
        }
        for example in &self.examples {
            out += &format!("    ! {example}\n");
        }
        out
    }

    pub fn to_markdown(&self) -> String {
        let mut out = format!(
            "{} violation(s).\n\n| check | count |\n|---|---:|\n",
            self.violations()
        );
        for (name, value) in self.rows() {
            out += &format!("| {name} | {value} |\n");
        }
        if !self.examples.is_empty() {
            out += "\nExamples:\n\n";
            for example in &self.examples {
                out += &format!("- {example}\n");
            }
        }
        out
    }
}

/// Compares what was committed with what was applied and projected.
pub fn judge(facts: &Facts) -> Verdict {
    let mut verdict = Verdict {
        committed: facts.writes.len() as u64,
        applied: facts.applied.len() as u64,
        outbox_pending: facts.outbox_pending,
        outbox_dead: facts.outbox_dead,
        regressions: facts.regressions.len() as u64,
        ..Default::default()
    };
    let mut examples: HashMap<&'static str, Vec<String>> = HashMap::new();
    let mut example = |kind: &'static str, text: String| {
        let list = examples.entry(kind).or_default();
        if list.len() < EXAMPLES_PER_KIND {
            list.push(text);
        }
    };

    let mut effects: HashMap<(&str, i64), u64> = HashMap::new();
    for (aggregate, version) in &facts.applied {
        *effects.entry((aggregate.as_str(), *version)).or_default() += 1;
    }
    let mut expected: HashMap<&str, (i64, &str)> = HashMap::new();
    for (aggregate, version, value) in &facts.writes {
        match effects.remove(&(aggregate.as_str(), *version)) {
            None => {
                verdict.lost += 1;
                example(
                    "lost",
                    format!("lost: {aggregate} v{version} was committed, never applied"),
                );
            }
            Some(1) => {}
            Some(n) => {
                verdict.double_effects += n - 1;
                example(
                    "double",
                    format!("double effect: {aggregate} v{version} applied {n} times"),
                );
            }
        }
        let latest = expected.entry(aggregate).or_insert((*version, value));
        if *version > latest.0 {
            *latest = (*version, value);
        }
    }
    for ((aggregate, version), n) in effects {
        verdict.phantom_effects += n;
        example(
            "phantom",
            format!("phantom: {aggregate} v{version} applied but never committed"),
        );
    }

    let mut projected: HashMap<&str, (i64, &str)> = facts
        .projection
        .iter()
        .map(|(a, v, value)| (a.as_str(), (*v, value.as_str())))
        .collect();
    for (aggregate, want) in &expected {
        match projected.remove(aggregate) {
            Some(got) if got == *want => {}
            Some(got) => {
                verdict.projection_mismatches += 1;
                example(
                    "mismatch",
                    format!(
                        "projection: {aggregate} is v{} {:?}, the source says v{} {:?}",
                        got.0, got.1, want.0, want.1
                    ),
                );
            }
            None => {
                verdict.projection_mismatches += 1;
                example(
                    "mismatch",
                    format!("projection: {aggregate} is missing (source at v{})", want.0),
                );
            }
        }
    }
    for (aggregate, got) in projected {
        verdict.projection_mismatches += 1;
        example(
            "mismatch",
            format!("projection: {aggregate} v{} has no committed write", got.0),
        );
    }
    for regression in &facts.regressions {
        example(
            "regression",
            format!(
                "regression: {} seen at v{} after v{}",
                regression.aggregate_id, regression.seen, regression.then
            ),
        );
    }

    let injected: BTreeSet<&str> = facts.injected_poison.iter().map(String::as_str).collect();
    let dead: BTreeSet<&str> = facts.dead_letters.iter().map(String::as_str).collect();
    for id in dead.difference(&injected) {
        verdict.unexpected_dead_letters += 1;
        example(
            "dlq",
            format!("dead letter {id} was not injected by the run"),
        );
    }
    for id in injected.difference(&dead) {
        verdict.missing_dead_letters += 1;
        example(
            "dlq",
            format!("poison {id} never reached the dead-letter topic"),
        );
    }
    let mut kinds: Vec<_> = examples.into_iter().collect();
    kinds.sort_by_key(|(kind, _)| *kind);
    verdict.examples = kinds.into_iter().flat_map(|(_, list)| list).collect();
    verdict
}

/// Reads the database's side of the facts (writes, effects, projection, outbox).
pub async fn read_facts(client: &tokio_postgres::Client) -> anyhow::Result<Facts> {
    let writes = client
        .query("SELECT aggregate_id, version, value FROM load.writes", &[])
        .await
        .context("read the committed writes")?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let applied = client
        .query("SELECT aggregate_id, version FROM load.applied", &[])
        .await
        .context("read the effects")?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let projection = client
        .query(
            "SELECT aggregate_id, version, value FROM load.projection",
            &[],
        )
        .await
        .context("read the projection")?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let outbox = client
        .query_one(
            "SELECT count(*) FILTER (WHERE dead_at IS NULL), count(*) FILTER (WHERE dead_at IS NOT NULL)
             FROM courier.outbox WHERE published_at IS NULL",
            &[],
        )
        .await
        .context("read the outbox")?;
    Ok(Facts {
        writes,
        applied,
        projection,
        outbox_pending: outbox.get(0),
        outbox_dead: outbox.get(1),
        ..Default::default()
    })
}

/// Samples the projection's versions during a run and records every row seen at a lower
/// version than before. A failed sample (PostgreSQL restarting) is skipped.
pub struct RegressionPoller {
    seen: HashMap<String, i64>,
    pub regressions: Vec<Regression>,
    pub samples: u64,
}

impl RegressionPoller {
    pub fn new() -> Self {
        Self {
            seen: HashMap::new(),
            regressions: Vec::new(),
            samples: 0,
        }
    }

    pub fn observe(&mut self, rows: impl IntoIterator<Item = (String, i64)>) {
        self.samples += 1;
        for (aggregate, version) in rows {
            match self.seen.get_mut(&aggregate) {
                Some(then) if version < *then => self.regressions.push(Regression {
                    aggregate_id: aggregate,
                    seen: version,
                    then: *then,
                }),
                Some(then) => *then = version,
                None => {
                    self.seen.insert(aggregate, version);
                }
            }
        }
    }

    pub async fn sample(&mut self, pool: &courier::db::PgPool) {
        let Ok(conn) = pool.get().await else { return };
        if let Ok(rows) = conn
            .query("SELECT aggregate_id, version FROM load.projection", &[])
            .await
        {
            self.observe(rows.iter().map(|r| (r.get(0), r.get(1))));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(a: &str, v: i64) -> (String, i64, String) {
        (a.into(), v, format!("{a}@{v}"))
    }

    fn clean_facts() -> Facts {
        Facts {
            writes: vec![write("a", 1), write("a", 2), write("b", 1)],
            applied: vec![("a".into(), 1), ("b".into(), 1), ("a".into(), 2)],
            projection: vec![write("a", 2), write("b", 1)],
            dead_letters: vec!["p1".into()],
            injected_poison: vec!["p1".into()],
            ..Default::default()
        }
    }

    #[test]
    fn a_run_that_kept_every_promise_has_no_violation() {
        let verdict = judge(&clean_facts());
        assert_eq!(verdict.violations(), 0, "{verdict:?}");
        assert_eq!((verdict.committed, verdict.applied), (3, 3));
    }

    #[test]
    fn a_committed_write_never_applied_is_lost() {
        let mut facts = clean_facts();
        facts.applied.retain(|e| *e != ("a".to_string(), 1));
        let verdict = judge(&facts);
        assert_eq!(verdict.lost, 1);
        assert_eq!(verdict.violations(), 1);
        assert!(
            verdict.examples[0].contains("a v1"),
            "{:?}",
            verdict.examples
        );
    }

    #[test]
    fn an_effect_applied_twice_is_a_double_effect_and_one_never_committed_a_phantom() {
        let mut facts = clean_facts();
        facts.applied.push(("b".into(), 1));
        facts.applied.push(("c".into(), 9));
        let verdict = judge(&facts);
        assert_eq!(verdict.double_effects, 1);
        assert_eq!(verdict.phantom_effects, 1);
    }

    #[test]
    fn a_projection_behind_wrong_or_extra_is_a_mismatch() {
        let mut facts = clean_facts();
        facts.projection = vec![
            write("a", 1),
            ("b".into(), 1, "other".into()),
            write("z", 1),
        ];
        assert_eq!(judge(&facts).projection_mismatches, 3);
        facts.projection = vec![write("a", 2)];
        assert_eq!(judge(&facts).projection_mismatches, 1, "b missing");
    }

    #[test]
    fn an_undrained_outbox_and_a_wrong_dead_letter_set_are_violations() {
        let mut facts = clean_facts();
        facts.outbox_pending = 2;
        facts.outbox_dead = 1;
        facts.dead_letters = vec!["x".into()];
        let verdict = judge(&facts);
        assert_eq!(verdict.unexpected_dead_letters, 1);
        assert_eq!(verdict.missing_dead_letters, 1);
        assert_eq!(verdict.violations(), 5);
    }

    #[test]
    fn the_poller_records_a_version_going_backwards_only() {
        let mut poller = RegressionPoller::new();
        poller.observe([("a".to_string(), 1), ("b".to_string(), 5)]);
        poller.observe([("a".to_string(), 3), ("b".to_string(), 5)]);
        assert!(poller.regressions.is_empty());
        poller.observe([("a".to_string(), 2)]);
        assert_eq!(
            poller.regressions,
            vec![Regression {
                aggregate_id: "a".into(),
                seen: 2,
                then: 3
            }]
        );
        let verdict = judge(&Facts {
            regressions: poller.regressions.clone(),
            ..clean_facts()
        });
        assert_eq!(verdict.regressions, 1);
    }
}
