//! The independent checker: reads the run's database directly (not the framework's counters)
//! and the dead-letter subscription, and reports every violation of the pipeline's promises:
//! - every committed write applied exactly once by effect (none lost, none twice, none
//!   applied that was never committed);
//! - per aggregate, effects in version order: from `load.applied`'s apply order, an effect of
//!   version n+1 before version n is a violation (whole-state events hide it in the read
//!   model, so it is read from the effect log);
//! - the projection equal to the source of truth field by field (a delta applied out of
//!   order leaves a wrong field);
//! - the outbox drained, nothing dead;
//! - the dead letters exactly the poison messages the run injected.
//!
//! A relay-only run ([`Scope::RelayOnly`]) has no consumer: there the relay's effect is the
//! publish, read from the outbox, and the projection and order checks do not apply.

use anyhow::Context as _;
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};

/// What part of the pipeline a run drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Writes → relay → Pub/Sub → consumer → projection.
    EndToEnd,
    /// Writes → relay → Pub/Sub, no consumer: an effect is a published outbox row.
    RelayOnly,
}

/// An aggregate's state: in the source of truth or in the read model.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    pub aggregate_id: String,
    pub version: i64,
    pub fields: [String; 3],
}

/// One effect of the projection, in the order effects were applied (`seq`).
#[derive(Debug, Clone, PartialEq)]
pub struct Effect {
    pub seq: i64,
    pub aggregate_id: String,
    pub version: i64,
}

/// What the checker reads.
#[derive(Debug)]
pub struct Facts {
    pub scope: Scope,
    /// Committed writes: `(aggregate, version)`.
    pub writes: Vec<(String, i64)>,
    /// The projection's effects, one per handler run that committed (relay-only: one per
    /// published row).
    pub applied: Vec<Effect>,
    /// The source of truth (`load.source`).
    pub source: Vec<State>,
    /// The read model (`load.projection`).
    pub projection: Vec<State>,
    /// Outbox rows neither published nor dead.
    pub outbox_pending: i64,
    pub outbox_dead: i64,
    /// Ids of the messages found on the dead-letter subscription.
    pub dead_letters: Vec<String>,
    /// Ids of the poison messages the run published.
    pub injected_poison: Vec<String>,
}

impl Facts {
    pub fn new(scope: Scope) -> Self {
        Self {
            scope,
            writes: Vec::new(),
            applied: Vec::new(),
            source: Vec::new(),
            projection: Vec::new(),
            outbox_pending: 0,
            outbox_dead: 0,
            dead_letters: Vec::new(),
            injected_poison: Vec::new(),
        }
    }
}

/// The checker's findings: counts per promise, and examples of each violation.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Verdict {
    pub scope: String,
    pub committed: u64,
    pub applied: u64,
    pub lost: u64,
    pub double_effects: u64,
    pub phantom_effects: u64,
    /// Effects applied after an effect of a later version of the same aggregate.
    pub order_violations: u64,
    /// Read-model rows that differ from the source of truth (missing, behind, or a field).
    pub projection_mismatches: u64,
    /// Fields that differ where the read model and the source agree on the version: a change
    /// lost to an out-of-order apply.
    pub wrong_fields: u64,
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
            + self.order_violations
            + self.projection_mismatches
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
                "out of order (applied after a later version)",
                self.order_violations.to_string(),
            ),
            (
                "projection rows ≠ source of truth",
                self.projection_mismatches.to_string(),
            ),
            (
                "  of which fields wrong at the same version",
                self.wrong_fields.to_string(),
            ),
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
        let mut out = format!(
            "  checker ({}): {} violation(s)\n",
            self.scope,
            self.violations()
        );
        for (name, value) in self.rows() {
            out += &format!("    {name:<46} {value:>10}\n");
        }
        for example in &self.examples {
            out += &format!("    ! {example}\n");
        }
        out
    }

    pub fn to_markdown(&self) -> String {
        let mut out = format!(
            "{} violation(s) ({}).\n\n| check | count |\n|---|---:|\n",
            self.violations(),
            self.scope
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

/// Collects up to [`EXAMPLES_PER_KIND`] examples of each kind of violation.
#[derive(Default)]
struct Examples(HashMap<&'static str, Vec<String>>);

impl Examples {
    fn add(&mut self, kind: &'static str, text: String) {
        let list = self.0.entry(kind).or_default();
        if list.len() < EXAMPLES_PER_KIND {
            list.push(text);
        }
    }

    fn into_sorted(self) -> Vec<String> {
        let mut kinds: Vec<_> = self.0.into_iter().collect();
        kinds.sort_by_key(|(kind, _)| *kind);
        kinds.into_iter().flat_map(|(_, list)| list).collect()
    }
}

/// Compares what was committed with what was applied and projected.
pub fn judge(facts: &Facts) -> Verdict {
    let mut verdict = Verdict {
        scope: match facts.scope {
            Scope::EndToEnd => "end to end".into(),
            Scope::RelayOnly => "relay only: an effect is a published row".into(),
        },
        committed: facts.writes.len() as u64,
        applied: facts.applied.len() as u64,
        outbox_pending: facts.outbox_pending,
        outbox_dead: facts.outbox_dead,
        ..Default::default()
    };
    let mut examples = Examples::default();
    check_effects(facts, &mut verdict, &mut examples);
    if facts.scope == Scope::EndToEnd {
        check_order(&facts.applied, &mut verdict, &mut examples);
        check_projection(facts, &mut verdict, &mut examples);
    }
    check_dead_letters(facts, &mut verdict, &mut examples);
    verdict.examples = examples.into_sorted();
    verdict
}

/// Lost, double and phantom effects.
fn check_effects(facts: &Facts, verdict: &mut Verdict, examples: &mut Examples) {
    let mut effects: HashMap<(&str, i64), u64> = HashMap::new();
    for effect in &facts.applied {
        *effects
            .entry((effect.aggregate_id.as_str(), effect.version))
            .or_default() += 1;
    }
    for (aggregate, version) in &facts.writes {
        match effects.remove(&(aggregate.as_str(), *version)) {
            None => {
                verdict.lost += 1;
                examples.add(
                    "lost",
                    format!("lost: {aggregate} v{version} was committed, never applied"),
                );
            }
            Some(1) => {}
            Some(n) => {
                verdict.double_effects += n - 1;
                examples.add(
                    "double",
                    format!("double effect: {aggregate} v{version} applied {n} times"),
                );
            }
        }
    }
    for ((aggregate, version), n) in effects {
        verdict.phantom_effects += n;
        examples.add(
            "phantom",
            format!("phantom: {aggregate} v{version} applied but never committed"),
        );
    }
}

/// Per aggregate, in apply order: an effect of a version below one already applied came
/// after a later version.
fn check_order(applied: &[Effect], verdict: &mut Verdict, examples: &mut Examples) {
    let mut in_order: Vec<&Effect> = applied.iter().collect();
    in_order.sort_by_key(|e| e.seq);
    let mut highest: HashMap<&str, i64> = HashMap::new();
    for effect in in_order {
        let seen = highest.entry(effect.aggregate_id.as_str()).or_insert(0);
        if effect.version < *seen {
            verdict.order_violations += 1;
            examples.add(
                "order",
                format!(
                    "out of order: {} v{} applied after v{}",
                    effect.aggregate_id, effect.version, seen
                ),
            );
        } else {
            *seen = effect.version;
        }
    }
}

/// The read model against the source of truth, field by field.
fn check_projection(facts: &Facts, verdict: &mut Verdict, examples: &mut Examples) {
    let mut projected: HashMap<&str, &State> = facts
        .projection
        .iter()
        .map(|s| (s.aggregate_id.as_str(), s))
        .collect();
    for want in &facts.source {
        let aggregate = &want.aggregate_id;
        let Some(got) = projected.remove(aggregate.as_str()) else {
            verdict.projection_mismatches += 1;
            examples.add(
                "mismatch",
                format!(
                    "projection: {aggregate} is missing (source at v{})",
                    want.version
                ),
            );
            continue;
        };
        if got == want {
            continue;
        }
        verdict.projection_mismatches += 1;
        if got.version != want.version {
            examples.add(
                "mismatch",
                format!(
                    "projection: {aggregate} is at v{}, the source at v{}",
                    got.version, want.version
                ),
            );
            continue;
        }
        for (i, name) in crate::harness::workload::FIELDS.iter().enumerate() {
            if got.fields[i] != want.fields[i] {
                verdict.wrong_fields += 1;
                examples.add(
                    "wrong field",
                    format!(
                        "wrong field: {aggregate} v{} has {name} = {:?}, the source {:?}",
                        want.version, got.fields[i], want.fields[i]
                    ),
                );
            }
        }
    }
    for (aggregate, got) in projected {
        verdict.projection_mismatches += 1;
        examples.add(
            "mismatch",
            format!("projection: {aggregate} v{} has no source row", got.version),
        );
    }
}

fn check_dead_letters(facts: &Facts, verdict: &mut Verdict, examples: &mut Examples) {
    let injected: BTreeSet<&str> = facts.injected_poison.iter().map(String::as_str).collect();
    let dead: BTreeSet<&str> = facts.dead_letters.iter().map(String::as_str).collect();
    for id in dead.difference(&injected) {
        verdict.unexpected_dead_letters += 1;
        examples.add(
            "dlq",
            format!("dead letter {id} was not injected by the run"),
        );
    }
    for id in injected.difference(&dead) {
        verdict.missing_dead_letters += 1;
        examples.add(
            "dlq",
            format!("poison {id} never reached the dead-letter topic"),
        );
    }
}

fn states(rows: &[tokio_postgres::Row]) -> Vec<State> {
    rows.iter()
        .map(|r| State {
            aggregate_id: r.get(0),
            version: r.get(1),
            fields: [r.get(2), r.get(3), r.get(4)],
        })
        .collect()
}

/// Reads the database's side of the facts (writes, effects, source and projection, outbox).
pub async fn read_facts(client: &tokio_postgres::Client, scope: Scope) -> anyhow::Result<Facts> {
    let mut facts = Facts::new(scope);
    facts.writes = client
        .query("SELECT aggregate_id, version FROM load.writes", &[])
        .await
        .context("read the committed writes")?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let effects = match scope {
        Scope::EndToEnd => "SELECT seq, aggregate_id, version FROM load.applied",
        Scope::RelayOnly => {
            "SELECT seq, aggregate_id, version FROM courier.outbox WHERE published_at IS NOT NULL"
        }
    };
    facts.applied = client
        .query(effects, &[])
        .await
        .context("read the effects")?
        .iter()
        .map(|r| Effect {
            seq: r.get(0),
            aggregate_id: r.get(1),
            version: r.get(2),
        })
        .collect();
    if scope == Scope::EndToEnd {
        let read = |table: &'static str| async move {
            client
                .query(
                    &format!("SELECT aggregate_id, version, a, b, c FROM load.{table}"),
                    &[],
                )
                .await
                .with_context(|| format!("read load.{table}"))
        };
        facts.source = states(&read("source").await?);
        facts.projection = states(&read("projection").await?);
    }
    let outbox = client
        .query_one(
            "SELECT count(*) FILTER (WHERE dead_at IS NULL), count(*) FILTER (WHERE dead_at IS NOT NULL)
             FROM courier.outbox WHERE published_at IS NULL",
            &[],
        )
        .await
        .context("read the outbox")?;
    facts.outbox_pending = outbox.get(0);
    facts.outbox_dead = outbox.get(1);
    Ok(facts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(a: &str, v: i64, fields: [&str; 3]) -> State {
        State {
            aggregate_id: a.into(),
            version: v,
            fields: fields.map(String::from),
        }
    }

    fn effect(seq: i64, a: &str, v: i64) -> Effect {
        Effect {
            seq,
            aggregate_id: a.into(),
            version: v,
        }
    }

    fn clean_facts() -> Facts {
        Facts {
            writes: vec![("a".into(), 1), ("a".into(), 2), ("b".into(), 1)],
            applied: vec![effect(1, "a", 1), effect(2, "b", 1), effect(3, "a", 2)],
            source: vec![
                state("a", 2, ["v1", "v2", "v1"]),
                state("b", 1, ["v1", "v1", "v1"]),
            ],
            projection: vec![
                state("a", 2, ["v1", "v2", "v1"]),
                state("b", 1, ["v1", "v1", "v1"]),
            ],
            dead_letters: vec!["p1".into()],
            injected_poison: vec!["p1".into()],
            ..Facts::new(Scope::EndToEnd)
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
        facts.applied.retain(|e| e.seq != 1);
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
        facts.applied.push(effect(4, "b", 1));
        facts.applied.push(effect(5, "c", 9));
        let verdict = judge(&facts);
        assert_eq!(verdict.double_effects, 1);
        assert_eq!(verdict.phantom_effects, 1);
    }

    #[test]
    fn one_reordered_pair_in_the_effect_log_is_an_order_violation_naming_key_and_versions() {
        let mut facts = clean_facts();
        // a v2 applied (seq 1) before a v1 (seq 3): same effects, other order.
        facts.applied = vec![effect(1, "a", 2), effect(2, "b", 1), effect(3, "a", 1)];
        let verdict = judge(&facts);
        assert_eq!(verdict.order_violations, 1, "{verdict:?}");
        assert_eq!(verdict.violations(), 1, "{verdict:?}");
        assert_eq!(
            verdict.examples,
            vec!["out of order: a v1 applied after v2"]
        );
    }

    #[test]
    fn the_apply_order_is_the_logs_sequence_not_the_order_rows_were_read_in() {
        let mut facts = clean_facts();
        facts.applied.reverse();
        assert_eq!(judge(&facts).order_violations, 0);
    }

    #[test]
    fn one_wrong_field_at_the_right_version_is_flagged_with_its_name() {
        let mut facts = clean_facts();
        // a's v2 changed b; applied before v1's create, the change was lost.
        facts.projection[0] = state("a", 2, ["v1", "v1", "v1"]);
        let verdict = judge(&facts);
        assert_eq!(
            (verdict.projection_mismatches, verdict.wrong_fields),
            (1, 1),
            "{verdict:?}"
        );
        assert_eq!(
            verdict.examples,
            vec![r#"wrong field: a v2 has b = "v1", the source "v2""#]
        );
    }

    #[test]
    fn a_projection_behind_missing_or_extra_is_a_mismatch() {
        let mut facts = clean_facts();
        facts.projection = vec![
            state("a", 1, ["v1", "v1", "v1"]),
            state("z", 1, ["v1", "v1", "v1"]),
        ];
        let verdict = judge(&facts);
        assert_eq!(verdict.projection_mismatches, 3, "behind, missing, extra");
        assert_eq!(verdict.wrong_fields, 0);
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
    fn a_relay_only_run_judges_published_rows_and_skips_the_read_model() {
        let mut facts = clean_facts();
        facts.scope = Scope::RelayOnly;
        facts.projection.clear();
        facts.applied = vec![effect(9, "a", 2), effect(8, "a", 1)];
        let verdict = judge(&facts);
        assert_eq!(verdict.lost, 1, "b v1 unpublished: {verdict:?}");
        assert_eq!(verdict.violations(), 1, "{verdict:?}");
    }
}
