//! A run's result: measured rates, the ceilings measured in the same run, the goal ratios,
//! latency percentiles, the checker's verdict and time series; printed as text, written as
//! `report.json`, `summary.md` and `chart.svg`.

pub mod chart;
pub mod measures;

use crate::harness::checker::Verdict;
use crate::report::chart::Panel;
use crate::report::measures::{Goal, Latency, Rate, Ratio, StatementCost};
use anyhow::Context as _;
use serde::Serialize;
use std::path::Path;

#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub benchmark: String,
    pub parameters: Vec<(String, String)>,
    pub rates: Vec<Rate>,
    pub ratios: Vec<Ratio>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub goals: Vec<Goal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency: Option<Latency>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reference_latencies: Vec<Latency>,
    /// Where each event's time went, hop by hop (`hops.rs`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hops: Vec<Latency>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
    /// Where PostgreSQL's time went, top statements first (when `pg_stat_statements` is
    /// loaded).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub statements: Vec<StatementCost>,
    /// Each window the xmin horizon was pinned: statements before and while, dead tuples, the
    /// oldest snapshot, the backlog.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pins: Vec<crate::harness::pin::PinnedWindow>,
    /// Remarks on the run a reader needs to judge the numbers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// What happened when, in seconds from the start (faults, phases).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<(f64, String)>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub panels: Vec<Panel>,
}

impl Report {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    pub fn to_text(&self) -> String {
        let mut out = format!("{}\n", self.benchmark);
        let params: Vec<String> = self
            .parameters
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        out += &format!("  parameters: {}\n", params.join(" "));
        for rate in &self.rates {
            out += &format!(
                "  {:<44} {:>10.0} events/s  ({} events in {:.2} s)\n",
                rate.name, rate.per_second, rate.events, rate.seconds
            );
        }
        for ratio in &self.ratios {
            out += &format!(
                "  {:<44} {:>10.2}  goal {}{}\n",
                ratio.name,
                ratio.value,
                ratio.goal,
                match ratio.met {
                    None => "",
                    Some(true) => " — met",
                    Some(false) => " — NOT met",
                }
            );
        }
        for latency in self.latency.iter().chain(&self.reference_latencies) {
            out += &format!(
                "  {:<44} p50 {:.1} p90 {:.1} p99 {:.1} p99.9 {:.1} max {:.1} ms ({} samples)\n",
                latency.name,
                latency.p50_ms,
                latency.p90_ms,
                latency.p99_ms,
                latency.p999_ms,
                latency.max_ms,
                latency.count
            );
        }
        if !self.hops.is_empty() {
            out += "  hop by hop:\n";
            for hop in &self.hops {
                out += &format!(
                    "    {:<48} p50 {:.1} p99 {:.1} max {:.1} ms\n",
                    hop.name, hop.p50_ms, hop.p99_ms, hop.max_ms
                );
            }
        }
        for goal in &self.goals {
            out += &format!(
                "  {:<44} {:>10}  goal {} — {}\n",
                goal.name,
                goal.value,
                goal.goal,
                if goal.met { "met" } else { "NOT met" }
            );
        }
        if let Some(verdict) = &self.verdict {
            out += &verdict.to_text();
        }
        if !self.statements.is_empty() {
            out += "  PostgreSQL time per committed write (pg_stat_statements):\n";
            for st in &self.statements {
                out += &format!(
                    "    {:>8.1} µs  {:>5.2} calls  {:>7.3} ms each  {}\n",
                    st.micros_per_event,
                    st.calls_per_event,
                    st.mean_ms,
                    st.query.chars().take(90).collect::<String>()
                );
            }
        }
        for pin in &self.pins {
            out += &pin.to_text();
        }
        for note in &self.notes {
            out += &format!("  note: {note}\n");
        }
        out
    }

    pub fn to_markdown(&self) -> String {
        let mut out = format!("# {}\n\n", self.benchmark);
        out += "| parameter | value |\n|---|---|\n";
        for (k, v) in &self.parameters {
            out += &format!("| {k} | {v} |\n");
        }
        if !self.rates.is_empty() {
            out += "\n| rate | events/s | events | seconds |\n|---|---:|---:|---:|\n";
            for r in &self.rates {
                out += &format!(
                    "| {} | {:.0} | {} | {:.2} |\n",
                    r.name, r.per_second, r.events, r.seconds
                );
            }
        }
        if !self.ratios.is_empty() || !self.goals.is_empty() {
            out += "\n| goal | result | target | met |\n|---|---:|---|---|\n";
            for r in &self.ratios {
                let met = match r.met {
                    None => "—",
                    Some(true) => "yes",
                    Some(false) => "**no**",
                };
                out += &format!("| {} | {:.2} | {} | {met} |\n", r.name, r.value, r.goal);
            }
            for g in &self.goals {
                let met = if g.met { "yes" } else { "**no**" };
                out += &format!("| {} | {} | {} | {met} |\n", g.name, g.value, g.goal);
            }
        }
        let latencies: Vec<&Latency> = self
            .latency
            .iter()
            .chain(&self.reference_latencies)
            .collect();
        if !latencies.is_empty() {
            out += "\n| latency | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | samples |\n\
                    |---|---:|---:|---:|---:|---:|---:|\n";
            for l in latencies {
                out += &format!(
                    "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} |\n",
                    l.name, l.p50_ms, l.p90_ms, l.p99_ms, l.p999_ms, l.max_ms, l.count
                );
            }
        }
        if !self.hops.is_empty() {
            out += "\n## Hop by hop\n\n| hop | p50 ms | p90 ms | p99 ms | max ms | events |\n\
                    |---|---:|---:|---:|---:|---:|\n";
            for h in &self.hops {
                out += &format!(
                    "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {} |\n",
                    h.name, h.p50_ms, h.p90_ms, h.p99_ms, h.max_ms, h.count
                );
            }
        }
        if let Some(verdict) = &self.verdict {
            out += "\n## Checker\n\n";
            out += &verdict.to_markdown();
        }
        if !self.statements.is_empty() {
            out += "\n## Where PostgreSQL's time went (pg_stat_statements)\n\n\
                    | µs per write | calls per write | mean ms | statement |\n|---:|---:|---:|---|\n";
            for st in &self.statements {
                out += &format!(
                    "| {:.1} | {:.2} | {:.3} | `{}` |\n",
                    st.micros_per_event,
                    st.calls_per_event,
                    st.mean_ms,
                    st.query.replace('|', "\\|").replace('`', "'")
                );
            }
        }
        for pin in &self.pins {
            out += &pin.to_markdown();
        }
        if !self.notes.is_empty() {
            out += "\n## Notes\n\n";
            for note in &self.notes {
                out += &format!("- {note}\n");
            }
        }
        if !self.timeline.is_empty() {
            out += "\n## Timeline\n\n";
            for (t, what) in &self.timeline {
                out += &format!("- {t:.1} s: {what}\n");
            }
        }
        out += if self.panels.is_empty() {
            "\n![the rates](chart.svg)\n"
        } else {
            "\n![throughput, backlog and latency over time](chart.svg)\n"
        };
        out
    }

    /// Writes `report.json`, `summary.md` and `chart.svg` (the time series, or the rates as
    /// bars when there are none).
    pub fn write_to(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let write = |name: &str, text: String| {
            let path = dir.join(name);
            std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))
        };
        write("report.json", self.to_json())?;
        write("summary.md", self.to_markdown())?;
        let chart = if self.panels.is_empty() {
            let bars: Vec<(String, f64)> = self
                .rates
                .iter()
                .map(|r| (r.name.clone(), r.per_second))
                .collect();
            crate::report::chart::render_bars(&self.benchmark, "events/s", &bars)
        } else {
            crate::report::chart::render(&self.benchmark, &self.panels, &self.timeline)
        };
        write("chart.svg", chart)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::measures::new_histogram;

    #[test]
    fn rate_divides_events_by_seconds() {
        assert_eq!(Rate::new("r", 1_000, 0.5).per_second, 2_000.0);
        assert_eq!(Rate::new("r", 1_000, 0.0).per_second, 0.0);
    }

    #[test]
    fn ratio_is_taken_against_the_lowest_ceiling() {
        let relay = Rate::new("relay", 15_000, 1.0);
        let publish = Rate::new("publish", 60_000, 1.0);
        let claim = Rate::new("claim", 20_000, 1.0);
        let ratio = Ratio::to_lowest("relay/ceiling", &relay, &[&publish, &claim], 0.7);
        assert!((ratio.value - 0.75).abs() < 1e-9);
        assert_eq!(ratio.met, Some(true));
        assert!(ratio.goal.contains("claim"));
        let slow = Rate::new("relay", 10_000, 1.0);
        assert_eq!(
            Ratio::to_lowest("r", &slow, &[&publish, &claim], 0.7).met,
            Some(false)
        );
    }

    #[test]
    fn latency_percentiles_come_from_the_histogram_in_milliseconds() {
        let mut histogram = new_histogram();
        for micros in 1..=1_000u64 {
            histogram.record(micros * 1_000).expect("in range");
        }
        let latency = Latency::from_histogram("l", &histogram);
        assert_eq!(latency.count, 1_000);
        assert!((latency.p50_ms - 500.0).abs() <= 1.0, "{latency:?}");
        assert!((latency.p99_ms - 990.0).abs() <= 1.0, "{latency:?}");
        assert!((latency.max_ms - 1_000.0).abs() <= 1.0, "{latency:?}");
    }

    #[test]
    fn the_summary_lists_goals_and_links_the_chart() {
        let report = Report {
            benchmark: "b".into(),
            goals: vec![Goal {
                name: "lost events".into(),
                value: "0".into(),
                goal: "0".into(),
                met: true,
            }],
            panels: vec![Panel::new("backlog", "events")],
            ..Default::default()
        };
        let md = report.to_markdown();
        assert!(md.contains("| lost events | 0 | 0 | yes |"), "{md}");
        assert!(md.contains("chart.svg"));
        let dir = std::env::temp_dir().join(courier_testkit::unique_name("report-test"));
        report.write_to(&dir).expect("written");
        for file in ["report.json", "summary.md", "chart.svg"] {
            assert!(dir.join(file).exists(), "{file} missing");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn ratio_without_a_usable_ceiling_is_zero_and_not_met() {
        let relay = Rate::new("relay", 1, 1.0);
        let ratio = Ratio::to_lowest("r", &relay, &[], 0.7);
        assert_eq!(ratio.value, 0.0);
        assert_eq!(ratio.met, Some(false));
    }

    #[test]
    fn a_ratio_without_a_goal_is_neither_met_nor_missed() {
        let ratio = Ratio::to_lowest(
            "bound / ceiling",
            &Rate::new("bound", 5, 1.0),
            &[&Rate::new("ceiling", 10, 1.0)],
            0.0,
        );
        assert_eq!(ratio.met, None);
        assert!(serde_json::to_string(&ratio)
            .expect("json")
            .contains(r#""met":null"#));
    }
}
