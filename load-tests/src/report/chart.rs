//! A plain SVG line chart: one panel per quantity (throughput, backlog, latency, memory)
//! sharing the time axis, with the run's timeline (faults, phases) as vertical markers.

use serde::Serialize;

/// One line: `(seconds from the start, value)` points.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// One chart panel: several lines in one unit.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Panel {
    pub title: String,
    pub unit: String,
    pub series: Vec<Series>,
}

impl Panel {
    pub fn new(title: &str, unit: &str) -> Self {
        Self {
            title: title.into(),
            unit: unit.into(),
            series: Vec::new(),
        }
    }

    pub fn with(mut self, name: &str, points: Vec<(f64, f64)>) -> Self {
        self.series.push(Series {
            name: name.into(),
            points,
        });
        self
    }
}

const WIDTH: f64 = 900.0;
const PANEL_HEIGHT: f64 = 190.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const GAP: f64 = 50.0;
const COLOURS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A round upper bound for an axis: 1, 2 or 5 × a power of ten, at least `max`.
pub fn nice_ceiling(max: f64) -> f64 {
    if !max.is_finite() || max <= 0.0 {
        return 1.0;
    }
    let magnitude = 10f64.powf(max.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|&c| c >= max)
        .unwrap_or(10.0 * magnitude)
}

/// The whole chart as an SVG document.
pub fn render(title: &str, panels: &[Panel], timeline: &[(f64, String)]) -> String {
    let points = || {
        panels
            .iter()
            .flat_map(|p| &p.series)
            .flat_map(|s| &s.points)
    };
    let t_max = nice_ceiling(
        points()
            .map(|p| p.0)
            .chain(timeline.iter().map(|m| m.0))
            .fold(0.0, f64::max),
    );
    let height = TOP + panels.len() as f64 * (PANEL_HEIGHT + GAP);
    let plot_width = WIDTH - LEFT - RIGHT;
    let x = |t: f64| LEFT + t / t_max * plot_width;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{LEFT}\" y=\"20\" font-size=\"14\">{}</text>\n",
        escape(title)
    );
    for (i, panel) in panels.iter().enumerate() {
        let top = TOP + i as f64 * (PANEL_HEIGHT + GAP);
        let bottom = top + PANEL_HEIGHT;
        let v_max = nice_ceiling(
            panel
                .series
                .iter()
                .flat_map(|s| &s.points)
                .map(|p| p.1)
                .fold(0.0, f64::max),
        );
        let y = |v: f64| bottom - v / v_max * PANEL_HEIGHT;
        svg += &format!(
            "<text x=\"{LEFT}\" y=\"{}\" font-weight=\"bold\">{} ({})</text>\n\
             <rect x=\"{LEFT}\" y=\"{top}\" width=\"{plot_width}\" height=\"{PANEL_HEIGHT}\" \
             fill=\"none\" stroke=\"#999\"/>\n",
            top - 6.0,
            escape(&panel.title),
            escape(&panel.unit)
        );
        for step in 0..=4 {
            let v = v_max * f64::from(step) / 4.0;
            svg += &format!(
                "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y0:.1}\" y2=\"{y0:.1}\" stroke=\"#eee\"/>\n\
                 <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
                WIDTH - RIGHT,
                LEFT - 4.0,
                y(v) + 4.0,
                format_value(v),
                y0 = y(v),
            );
        }
        for step in 0..=5 {
            let t = t_max * f64::from(step) / 5.0;
            svg += &format!(
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{} s</text>\n",
                x(t),
                bottom + 14.0,
                format_value(t)
            );
        }
        for (t, what) in timeline {
            svg += &format!(
                "<line x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"{top}\" y2=\"{bottom}\" stroke=\"#bbb\" \
                 stroke-dasharray=\"3,3\"><title>{1}</title></line>\n",
                x(*t),
                escape(what)
            );
        }
        for (n, series) in panel.series.iter().enumerate() {
            let colour = COLOURS[n % COLOURS.len()];
            let path: Vec<String> = series
                .points
                .iter()
                .map(|&(t, v)| format!("{:.1},{:.1}", x(t), y(v)))
                .collect();
            svg += &format!(
                "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>\n\
                 <text x=\"{:.1}\" y=\"{:.1}\" fill=\"{colour}\">{}</text>\n",
                path.join(" "),
                LEFT + 8.0 + n as f64 * 170.0,
                top + 14.0,
                escape(&series.name)
            );
        }
    }
    svg += "</svg>\n";
    svg
}

/// A horizontal bar per rate, for runs without time series (the focused benchmarks).
pub fn render_bars(title: &str, unit: &str, bars: &[(String, f64)]) -> String {
    const BAR: f64 = 22.0;
    const LABEL: f64 = 330.0;
    let height = TOP + bars.len() as f64 * (BAR + 8.0) + 30.0;
    let max = nice_ceiling(bars.iter().map(|b| b.1).fold(0.0, f64::max));
    let width = WIDTH - LABEL - RIGHT - 60.0;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"20\" font-size=\"14\">{} ({})</text>\n",
        escape(title),
        escape(unit)
    );
    for (i, (name, value)) in bars.iter().enumerate() {
        let y = TOP + i as f64 * (BAR + 8.0);
        let w = value / max * width;
        svg += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n\
             <rect x=\"{LABEL}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{BAR}\" fill=\"{}\"/>\n\
             <text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n",
            LABEL - 6.0,
            y + 15.0,
            escape(name),
            COLOURS[i % COLOURS.len()],
            LABEL + w + 4.0,
            y + 15.0,
            format_value(*value)
        );
    }
    svg += "</svg>\n";
    svg
}

fn format_value(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1_000.0)
    } else if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bar_chart_has_a_bar_per_rate_scaled_to_the_largest() {
        let svg = render_bars(
            "rates",
            "events/s",
            &[("a".into(), 500.0), ("b".into(), 1_000.0)],
        );
        assert_eq!(svg.matches("<rect x=").count(), 2);
        // 1,000 is the axis ceiling: the second bar spans the whole plot width.
        let full = WIDTH - 330.0 - RIGHT - 60.0;
        assert!(svg.contains(&format!("width=\"{full:.1}\"")), "{svg}");
        assert!(
            svg.contains(&format!("width=\"{:.1}\"", full / 2.0)),
            "{svg}"
        );
    }

    #[test]
    fn axis_ceilings_are_round_and_cover_the_maximum() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(0.7), 1.0);
        assert_eq!(nice_ceiling(1.3), 2.0);
        assert_eq!(nice_ceiling(4_200.0), 5_000.0);
        assert_eq!(nice_ceiling(5_000.0), 5_000.0);
        assert_eq!(nice_ceiling(7_001.0), 10_000.0);
    }

    #[test]
    fn a_chart_has_a_line_per_series_and_a_marker_per_event() {
        let panels = vec![
            Panel::new("throughput", "events/s")
                .with("written", vec![(0.0, 0.0), (1.0, 900.0), (2.0, 1_000.0)])
                .with("applied", vec![(0.0, 0.0), (1.0, 800.0), (2.0, 1_000.0)]),
            Panel::new("backlog", "events").with("backlog", vec![(0.0, 0.0), (2.0, 5.0)]),
        ];
        let svg = render("t <&>", &panels, &[(1.5, "kill relay-1".into())]);
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("<polyline").count(), 3);
        assert_eq!(
            svg.matches("stroke-dasharray").count(),
            2,
            "one marker per panel"
        );
        assert!(svg.contains("t &lt;&amp;&gt;"));
        assert!(svg.contains("kill relay-1"));
    }
}
