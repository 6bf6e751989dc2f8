//! What a run measures: rates, ratios against limits measured in the same run, latency
//! percentiles, goals and statement costs. The report ([`crate::report`]) gathers them.

use hdrhistogram::Histogram;
use serde::Serialize;

/// One measured rate.
#[derive(Debug, Clone, Serialize)]
pub struct Rate {
    pub name: String,
    pub events: u64,
    pub seconds: f64,
    pub per_second: f64,
}

impl Rate {
    pub fn new(name: &str, events: u64, seconds: f64) -> Self {
        let per_second = if seconds > 0.0 {
            events as f64 / seconds
        } else {
            0.0
        };
        Self {
            name: name.into(),
            events,
            seconds,
            per_second,
        }
    }
}

/// `measured / reference`, with the goal it is held to.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    pub name: String,
    pub value: f64,
    pub goal: String,
    /// `None` (JSON `null`) for a ratio reported without a goal: nothing was met or missed.
    pub met: Option<bool>,
}

impl Ratio {
    /// A cost ratio, met when it is at most `goal` (`None`: reported without a goal). A ratio
    /// of 0 measured nothing and meets no goal.
    pub fn at_most(name: impl Into<String>, value: f64, goal: Option<f64>) -> Self {
        Self {
            name: name.into(),
            value,
            goal: goal.map_or("none".into(), |g| format!("≤ {g}")),
            met: goal.map(|g| value > 0.0 && value <= g),
        }
    }

    /// The ratio of `measured` to the lowest of `ceilings` (the one that binds), which must
    /// reach `at_least`.
    pub fn to_lowest(name: &str, measured: &Rate, ceilings: &[&Rate], at_least: f64) -> Self {
        let lowest = ceilings
            .iter()
            .min_by(|a, b| a.per_second.total_cmp(&b.per_second));
        let value = match lowest {
            Some(c) if c.per_second > 0.0 => measured.per_second / c.per_second,
            _ => 0.0,
        };
        let against = lowest.map_or("nothing".to_string(), |c| c.name.clone());
        Self {
            name: name.into(),
            value,
            goal: if at_least > 0.0 {
                format!("≥ {at_least} × {against}")
            } else {
                format!("none, vs {against}")
            },
            met: (at_least > 0.0).then_some(value >= at_least),
        }
    }
}

/// A latency histogram in microseconds, 1 µs to 1 hour at 3 significant digits (a value
/// above an hour is recorded as an hour).
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3)
        .unwrap_or_else(|_| unreachable!("the bounds are valid"))
}

/// Percentiles of one latency distribution, in milliseconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Latency {
    pub name: String,
    pub count: u64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    /// From a histogram of microseconds.
    pub fn from_histogram(name: &str, histogram: &Histogram<u64>) -> Self {
        let ms = |q: f64| histogram.value_at_quantile(q) as f64 / 1_000.0;
        Self {
            name: name.into(),
            count: histogram.len(),
            p50_ms: ms(0.5),
            p90_ms: ms(0.9),
            p99_ms: ms(0.99),
            p999_ms: ms(0.999),
            max_ms: histogram.max() as f64 / 1_000.0,
        }
    }
}

/// A goal that is not a ratio of rates (latency budget, memory drift, chaos counts).
#[derive(Debug, Clone, Serialize)]
pub struct Goal {
    pub name: String,
    pub value: String,
    pub goal: String,
    pub met: bool,
}

impl Goal {
    /// A goal naming why a pipeline never caught up (`drained`: the seconds it took, or why
    /// it did not); `None` when it did.
    pub fn not_converged(drained: &anyhow::Result<f64>) -> Option<Self> {
        drained.as_ref().err().map(|e| Self {
            name: "converged".into(),
            value: format!("{e:#}"),
            goal: "within the drain timeout".into(),
            met: false,
        })
    }
}

/// One statement's share of PostgreSQL's time in a run (from `pg_stat_statements`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StatementCost {
    /// The normalized statement, whitespace collapsed, cut to 160 characters.
    pub query: String,
    pub calls_per_event: f64,
    pub mean_ms: f64,
    /// Execution time per committed write, microseconds.
    pub micros_per_event: f64,
}
