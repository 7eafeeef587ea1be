//! A latency CDF as a standalone SVG a person can open: latency on a log axis, fraction of
//! requests at or below it on the other, one line per series.

use std::fmt::Write;

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// One line of the plot: its name and its (latency µs, fraction) points, fractions rising.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The SVG document.
pub fn cdf(title: &str, series: &[Series]) -> String {
    let all = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (mut low, mut high) = all.fold((f64::MAX, 0.0f64), |(l, h), x| (l.min(x), h.max(x)));
    if low > high {
        (low, high) = (1.0, 10.0);
    }
    let low_decade = low.max(1.0).log10().floor();
    let high_decade = high.max(10.0).log10().ceil().max(low_decade + 1.0);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x_of =
        |us: f64| LEFT + (us.max(1.0).log10() - low_decade) / (high_decade - low_decade) * plot_w;
    let y_of = |fraction: f64| TOP + (1.0 - fraction) * plot_h;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>"#,
        LEFT + plot_w / 2.0,
        escape(title)
    );
    // Grid and axes: decades on x, tenths on y.
    let mut decade = low_decade;
    while decade <= high_decade {
        let x = x_of(10f64.powf(decade));
        let label = match 10f64.powf(decade) {
            us if us >= 1e6 => format!("{} s", us / 1e6),
            us if us >= 1e3 => format!("{} ms", us / 1e3),
            us => format!("{us} µs"),
        };
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{label}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 18.0
        );
        decade += 1.0;
    }
    for tenth in 0..=10 {
        let f = f64::from(tenth) / 10.0;
        let y = y_of(f);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end">{f:.1}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#444"/>"##
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">latency (log scale)</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 10.0
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">fraction of requests at or below</text>"#,
        TOP + plot_h / 2.0
    );
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mut path = String::new();
        let mut previous = 0.0;
        for (k, &(us, fraction)) in s.points.iter().enumerate() {
            // A step: up at this latency from the fraction before it.
            let (x, y0, y1) = (x_of(us), y_of(previous), y_of(fraction));
            let _ = write!(
                path,
                "{}{x:.1},{y0:.1} L{x:.1},{y1:.1} ",
                if k == 0 { "M" } else { "L" }
            );
            previous = fraction;
        }
        if !path.is_empty() {
            let _ = writeln!(
                svg,
                r#"<path d="{}" fill="none" stroke="{color}" stroke-width="1.6"/>"#,
                path.trim_end()
            );
        }
        let ly = TOP + 14.0 + 18.0 * i as f64;
        let lx = LEFT + plot_w + 12.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 18.0,
            lx + 24.0,
            ly + 4.0,
            escape(&s.name)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plot_has_every_series_and_is_well_formed() {
        let s = cdf(
            "GET <latency> & more",
            &[
                Series {
                    name: "a".into(),
                    points: vec![(10.0, 0.5), (100.0, 1.0)],
                },
                Series {
                    name: "b".into(),
                    points: vec![(20.0, 0.9), (2000.0, 1.0)],
                },
            ],
        );
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<path").count(), 2);
        assert!(s.contains("GET &lt;latency&gt; &amp; more"));
        assert!(s.contains("1 ms") || s.contains("10 ms"));
        // Empty series still give a valid document.
        assert!(cdf("empty", &[]).contains("</svg>"));
    }
}
