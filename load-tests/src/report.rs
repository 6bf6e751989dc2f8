//! A benchmark's result: measured rates, the ceilings measured in the same run, and the goal
//! ratio, printed side by side.

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
    pub met: bool,
}

impl Ratio {
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
            met: value >= at_least,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub benchmark: String,
    pub parameters: Vec<(String, String)>,
    pub rates: Vec<Rate>,
    pub ratios: Vec<Ratio>,
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
                if ratio.goal.starts_with("none") {
                    ""
                } else if ratio.met {
                    " — met"
                } else {
                    " — NOT met"
                }
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(ratio.met);
        assert!(ratio.goal.contains("claim"));
        let slow = Rate::new("relay", 10_000, 1.0);
        assert!(!Ratio::to_lowest("r", &slow, &[&publish, &claim], 0.7).met);
    }

    #[test]
    fn ratio_without_a_usable_ceiling_is_zero_and_not_met() {
        let relay = Rate::new("relay", 1, 1.0);
        let ratio = Ratio::to_lowest("r", &relay, &[], 0.7);
        assert_eq!(ratio.value, 0.0);
        assert!(!ratio.met);
    }
}
