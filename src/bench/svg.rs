//! Standalone SVG charts a person can open: latency CDFs, lines over time in stacked panels
//! (the placement replay), and bars side by side (a comparison's throughput and CPU).
//!
//! Nothing is clipped: titles and legend entries are measured (an estimate of DejaVu Sans, the
//! widest of the usual sans-serif fonts, so narrower fonts only leave more room) and wrapped,
//! and the document grows to hold them. The legend sits under the plots, one entry per series,
//! and tells every series apart by colour and, where asked, by dash.

use std::fmt::Write;

/// Series colours, in order.
pub const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];
/// Line dashes, in order: solid, dashed, dotted, dash-dot.
pub const DASHES: [&str; 4] = ["", "7 4", "2 3", "8 3 2 3"];

const FONT: f64 = 12.0;
const TITLE_FONT: f64 = 14.0;
const MARGIN: f64 = 14.0;

/// One line of a plot: its name, its points, and its colour and dash (indexes into
/// [`COLORS`] and [`DASHES`]).
#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub color: usize,
    pub dash: usize,
}

impl Series {
    /// A solid line in colour `color`.
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>, color: usize) -> Series {
        Series {
            name: name.into(),
            points,
            color,
            dash: 0,
        }
    }

    pub fn dashed(mut self, dash: usize) -> Series {
        self.dash = dash;
        self
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn color(i: usize) -> &'static str {
    COLORS[i % COLORS.len()]
}

fn dash_attr(i: usize) -> String {
    match DASHES[i % DASHES.len()] {
        "" => String::new(),
        d => format!(r#" stroke-dasharray="{d}""#),
    }
}

/// Advance width of `c` in em, from DejaVu Sans's metrics (rounded up).
fn char_em(c: char) -> f64 {
    match c {
        'i' | 'j' | 'l' | '\'' | '|' | '!' => 0.28,
        ' ' | '.' | ',' | ':' | ';' => 0.34,
        'f' | 't' | 'I' | '(' | ')' | '[' | ']' | '{' | '}' | '-' | '/' | '\\' => 0.40,
        'r' => 0.42,
        'm' => 0.98,
        'w' => 0.82,
        'M' | 'W' | '%' | '@' => 1.0,
        '=' | '+' | '<' | '>' | '~' | '&' => 0.84,
        c if c.is_ascii_uppercase() => 0.78,
        c if c.is_ascii_digit() => 0.64,
        c if c.is_ascii() => 0.64,
        _ => 0.80,
    }
}

/// Estimated width of `text` at font size `size`.
pub fn text_width(text: &str, size: f64) -> f64 {
    text.chars().map(char_em).sum::<f64>() * size
}

/// `text` in lines no wider than `max` at `size`: broken between words, and inside a word
/// only when the word alone is wider than `max`.
pub fn wrap(text: &str, size: f64, max: f64) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let candidate = if line.is_empty() {
            word.to_string()
        } else {
            format!("{line} {word}")
        };
        if text_width(&candidate, size) <= max {
            line = candidate;
            continue;
        }
        if !line.is_empty() {
            lines.push(std::mem::take(&mut line));
        }
        // The word alone: split it where it must.
        for c in word.chars() {
            if !line.is_empty() && text_width(&format!("{line}{c}"), size) > max {
                lines.push(std::mem::take(&mut line));
            }
            line.push(c);
        }
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

/// An SVG document being laid out top to bottom.
struct Doc {
    width: f64,
    body: String,
}

impl Doc {
    fn new(width: f64) -> Doc {
        Doc {
            width,
            body: String::new(),
        }
    }

    /// Centred lines of `text` wrapped to the document's width, from `y`; returns the y
    /// under them.
    fn centered(&mut self, text: &str, size: f64, y: f64) -> f64 {
        let mut y = y;
        for line in wrap(text, size, self.width - 2.0 * MARGIN) {
            y += size * 1.3;
            let _ = writeln!(
                self.body,
                r#"<text x="{:.1}" y="{y:.1}" text-anchor="middle" font-size="{size}">{}</text>"#,
                self.width / 2.0,
                escape(&line)
            );
        }
        y
    }

    /// The legend from `y`: entries packed left to right in rows, each wrapped to the width;
    /// returns the y under it.
    fn legend(&mut self, entries: &[LegendEntry], y: f64) -> f64 {
        let swatch = 26.0;
        let gap = 22.0;
        let max_text = self.width - 2.0 * MARGIN - swatch;
        let mut x = MARGIN;
        let mut y = y + 6.0;
        let mut row_height: f64 = 0.0;
        for entry in entries {
            let lines = wrap(&entry.name, FONT, max_text);
            let text_w = lines
                .iter()
                .map(|l| text_width(l, FONT))
                .fold(0.0, f64::max);
            let w = swatch + text_w;
            if x > MARGIN && x + w > self.width - MARGIN {
                x = MARGIN;
                y += row_height;
                row_height = 0.0;
            }
            let mid = y + FONT * 0.9;
            match entry.mark {
                Mark::Line { dash } => {
                    let _ = writeln!(
                        self.body,
                        r#"<line x1="{:.1}" y1="{mid:.1}" x2="{:.1}" y2="{mid:.1}" stroke="{}" stroke-width="2.5"{}/>"#,
                        x,
                        x + 20.0,
                        color(entry.color),
                        dash_attr(dash)
                    );
                }
                Mark::Dot => {
                    let _ = writeln!(
                        self.body,
                        r##"<circle cx="{:.1}" cy="{mid:.1}" r="3" fill="white" stroke="#222" stroke-width="1.2"/>"##,
                        x + 10.0
                    );
                }
                Mark::Box => {
                    let _ = writeln!(
                        self.body,
                        r#"<rect x="{:.1}" y="{:.1}" width="16" height="10" fill="{}"/>"#,
                        x + 2.0,
                        mid - 5.0,
                        color(entry.color)
                    );
                }
            }
            for (k, line) in lines.iter().enumerate() {
                let _ = writeln!(
                    self.body,
                    r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
                    x + swatch,
                    mid + 4.0 + k as f64 * FONT * 1.25,
                    escape(line)
                );
            }
            row_height = row_height.max(lines.len() as f64 * FONT * 1.25 + 6.0);
            x += w + gap;
        }
        y + row_height
    }

    fn finish(self, height: f64) -> String {
        let (w, h) = (self.width, height.ceil());
        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="DejaVu Sans, Verdana, sans-serif" font-size="{FONT}">"#
        );
        let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
        out.push_str(&self.body);
        out.push_str("</svg>\n");
        out
    }
}

enum Mark {
    Line { dash: usize },
    Box,
    Dot,
}

struct LegendEntry {
    name: String,
    color: usize,
    mark: Mark,
}

fn line_legend(series: &[Series]) -> Vec<LegendEntry> {
    series
        .iter()
        .map(|s| LegendEntry {
            name: s.name.clone(),
            color: s.color,
            mark: Mark::Line { dash: s.dash },
        })
        .collect()
}

/// A plot area and its axes.
#[derive(Clone, Copy)]
struct Frame {
    x: f64,
    y: f64,
    w: f64,
    h: f64,
}

#[derive(Clone, Copy)]
enum Scale {
    /// Decades from 10^lo to 10^hi.
    Log {
        lo: f64,
        hi: f64,
    },
    Linear {
        lo: f64,
        hi: f64,
    },
}

impl Scale {
    fn fraction(&self, v: f64) -> f64 {
        match *self {
            Scale::Log { lo, hi } => (v.max(1e-9).log10() - lo) / (hi - lo),
            Scale::Linear { lo, hi } => (v - lo) / (hi - lo),
        }
    }

    fn ticks(&self) -> Vec<f64> {
        match *self {
            Scale::Log { lo, hi } => (lo as i32..=hi as i32).map(|d| 10f64.powi(d)).collect(),
            Scale::Linear { lo, hi } => {
                let step = nice_step((hi - lo) / 5.0);
                let mut out = Vec::new();
                let mut v = (lo / step).ceil() * step;
                while v <= hi + step * 1e-9 {
                    out.push(if v.abs() < step * 1e-9 { 0.0 } else { v });
                    v += step;
                }
                out
            }
        }
    }

    /// A linear scale from 0 (or the lowest value) to the highest and `headroom` (a fraction)
    /// over it, so a line at the maximum does not run along the frame.
    fn linear_over(values: impl Iterator<Item = f64>, headroom: f64) -> Scale {
        let (lo, hi) = values.fold((0.0f64, 0.0f64), |(l, h), v| (l.min(v), h.max(v)));
        let hi = if hi <= lo { lo + 1.0 } else { hi };
        Scale::Linear {
            lo,
            hi: hi + (hi - lo) * headroom,
        }
    }
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|s| *s >= raw * 0.999)
        .unwrap_or(10.0 * power)
}

/// A number for an axis: thousands as `k`, millions as `M`, small ones with the decimals they need.
pub fn short_number(v: f64) -> String {
    let a = v.abs();
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if a >= 1e6 {
        format!("{}M", trim(format!("{:.2}", v / 1e6)))
    } else if a >= 1e4 {
        format!("{}k", trim(format!("{:.1}", v / 1e3)))
    } else if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else {
        trim(format!("{v:.2}"))
    }
}

fn latency_label(us: f64) -> String {
    if us >= 1e6 {
        format!("{} s", short_number(us / 1e6))
    } else if us >= 1e3 {
        format!("{} ms", short_number(us / 1e3))
    } else {
        format!("{} µs", short_number(us))
    }
}

/// Draws the frame's grid, tick labels and axis labels.
#[allow(clippy::too_many_arguments)]
fn axes(
    doc: &mut Doc,
    f: Frame,
    xs: Scale,
    ys: Scale,
    x_label: Option<&str>,
    y_label: &str,
    x_tick: &dyn Fn(f64) -> String,
    y_tick: &dyn Fn(f64) -> String,
) {
    for t in xs.ticks() {
        let x = f.x + xs.fraction(t) * f.w;
        let _ = writeln!(
            doc.body,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/>"##,
            f.y,
            f.y + f.h
        );
        if x_label.is_some() {
            let _ = writeln!(
                doc.body,
                r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                f.y + f.h + 16.0,
                escape(&x_tick(t))
            );
        }
    }
    for t in ys.ticks() {
        let y = f.y + (1.0 - ys.fraction(t)) * f.h;
        let _ = writeln!(
            doc.body,
            r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            f.x,
            f.x + f.w,
            f.x - 6.0,
            y + 4.0,
            escape(&y_tick(t))
        );
    }
    let _ = writeln!(
        doc.body,
        r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="#444"/>"##,
        f.x, f.y, f.w, f.h
    );
    if let Some(label) = x_label {
        let _ = writeln!(
            doc.body,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            f.x + f.w / 2.0,
            f.y + f.h + 34.0,
            escape(label)
        );
    }
    y_label_at(doc, f, y_label, 0.0);
}

/// The y label, rotated, wrapped to the frame's height, at the left of its slot.
fn y_label_at(doc: &mut Doc, f: Frame, y_label: &str, slot_x: f64) {
    for (k, line) in wrap(y_label, FONT, f.h).iter().enumerate() {
        // Rotated text's glyphs rise to the left of its baseline.
        let x = slot_x + MARGIN + FONT + k as f64 * FONT * 1.2;
        let _ = writeln!(
            doc.body,
            r#"<text transform="translate({x:.1} {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
            f.y + f.h / 2.0,
            escape(line)
        );
    }
}

/// Room left of a frame for the y label (`lines` of it) and the widest tick label.
fn left_room(ys: Scale, y_tick: &dyn Fn(f64) -> String, y_label: &str, h: f64) -> f64 {
    let ticks = ys
        .ticks()
        .into_iter()
        .map(|t| text_width(&y_tick(t), FONT))
        .fold(0.0, f64::max);
    let label_lines = wrap(y_label, FONT, h).len() as f64;
    MARGIN + FONT + (label_lines - 1.0) * FONT * 1.2 + 4.0 + 8.0 + ticks + 6.0
}

fn polyline(doc: &mut Doc, f: Frame, xs: Scale, ys: Scale, s: &Series, steps: bool) {
    let mut path = String::new();
    let mut previous: Option<f64> = None;
    for (k, &(xv, yv)) in s.points.iter().enumerate() {
        let x = f.x + xs.fraction(xv).clamp(0.0, 1.0) * f.w;
        let y = f.y + (1.0 - ys.fraction(yv).clamp(0.0, 1.0)) * f.h;
        let op = if k == 0 { "M" } else { "L" };
        match (steps, previous) {
            // A CDF step: up at this x from the fraction before it.
            (true, prior) => {
                let y0 = f.y + (1.0 - ys.fraction(prior.unwrap_or(0.0)).clamp(0.0, 1.0)) * f.h;
                let _ = write!(path, "{op}{x:.1},{y0:.1} L{x:.1},{y:.1} ");
            }
            (false, _) => {
                let _ = write!(path, "{op}{x:.1},{y:.1} ");
            }
        }
        previous = Some(yv);
    }
    if !path.is_empty() {
        let _ = writeln!(
            doc.body,
            r#"<path d="{}" fill="none" stroke="{}" stroke-width="1.8"{}/>"#,
            path.trim_end(),
            color(s.color),
            dash_attr(s.dash)
        );
    }
}

/// Latency CDFs: latency on a log axis, the fraction of requests at or below it on the other,
/// one line per series (its points are (latency µs, fraction), fractions rising).
pub fn cdf(title: &str, series: &[Series]) -> String {
    const WIDTH: f64 = 760.0;
    let all = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (mut low, mut high) = all.fold((f64::MAX, 0.0f64), |(l, h), x| (l.min(x), h.max(x)));
    if low > high {
        (low, high) = (1.0, 10.0);
    }
    let lo = low.max(1.0).log10().floor();
    let hi = high.max(10.0).log10().ceil().max(lo + 1.0);
    let xs = Scale::Log { lo, hi };
    let ys = Scale::Linear { lo: 0.0, hi: 1.0 };
    let mut doc = Doc::new(WIDTH);
    let top = doc.centered(title, TITLE_FONT, 4.0) + 12.0;
    let y_label = "fraction of requests at or below";
    let y_tick = |t: f64| format!("{t:.1}");
    let h = 330.0;
    let left = left_room(ys, &y_tick, y_label, h);
    let f = Frame {
        x: left,
        y: top,
        w: WIDTH - left - 24.0,
        h,
    };
    axes(
        &mut doc,
        f,
        xs,
        ys,
        Some("latency (log scale)"),
        y_label,
        &latency_label,
        &y_tick,
    );
    for s in series {
        polyline(&mut doc, f, xs, ys, s, true);
    }
    let bottom = doc.legend(&line_legend(series), f.y + f.h + 44.0);
    doc.finish(bottom + MARGIN)
}

/// One panel of [`line_panels`]: its y label, its lines, and how its y ticks read.
pub struct Panel {
    pub y_label: String,
    pub series: Vec<Series>,
    /// Where the y axis ends at least (a capacity line, say); the data may raise it.
    pub y_max: Option<f64>,
}

/// Panels stacked over one x axis (the same x range in each), one shared legend under them;
/// `legend` names the colours (`(name, colour)`, drawn as solid lines).
pub fn line_panels(
    title: &str,
    x_label: &str,
    panels: &[Panel],
    legend: &[(String, usize)],
) -> String {
    const WIDTH: f64 = 760.0;
    const H: f64 = 170.0;
    let mut doc = Doc::new(WIDTH);
    let mut y = doc.centered(title, TITLE_FONT, 4.0) + 12.0;
    let xs = Scale::linear_over(
        panels
            .iter()
            .flat_map(|p| p.series.iter().flat_map(|s| s.points.iter().map(|q| q.0))),
        0.0,
    );
    let scales: Vec<Scale> = panels
        .iter()
        .map(|p| {
            Scale::linear_over(
                p.series
                    .iter()
                    .flat_map(|s| s.points.iter().map(|q| q.1))
                    .chain(p.y_max),
                0.05,
            )
        })
        .collect();
    let left = panels
        .iter()
        .zip(&scales)
        .map(|(p, s)| left_room(*s, &short_number, &p.y_label, H))
        .fold(0.0, f64::max);
    for (i, (panel, ys)) in panels.iter().zip(&scales).enumerate() {
        let last = i + 1 == panels.len();
        let f = Frame {
            x: left,
            y,
            w: WIDTH - left - 24.0,
            h: H,
        };
        axes(
            &mut doc,
            f,
            xs,
            *ys,
            if last { Some(x_label) } else { None },
            &panel.y_label,
            &short_number,
            &short_number,
        );
        for s in &panel.series {
            polyline(&mut doc, f, xs, *ys, s, false);
        }
        y += H + if last { 44.0 } else { 14.0 };
    }
    let entries: Vec<LegendEntry> = legend
        .iter()
        .map(|(name, c)| LegendEntry {
            name: name.clone(),
            color: *c,
            mark: Mark::Line { dash: 0 },
        })
        .collect();
    let bottom = doc.legend(&entries, y);
    doc.finish(bottom + MARGIN)
}

/// One bar of a [`bar_panels`] panel: its value (a median, say), the values behind it (drawn as
/// dots), and its colour.
pub struct Bar {
    pub value: f64,
    pub dots: Vec<f64>,
    pub color: usize,
}

/// One panel of bars; `empty` is said in the panel when it has no bars.
pub struct BarPanel {
    pub y_label: String,
    pub bars: Vec<Bar>,
    pub empty: String,
}

/// Bar panels side by side, one shared legend under them naming the colours.
pub fn bar_panels(title: &str, panels: &[BarPanel], legend: &[(String, usize)]) -> String {
    const WIDTH: f64 = 760.0;
    const H: f64 = 280.0;
    let mut doc = Doc::new(WIDTH);
    let top = doc.centered(title, TITLE_FONT, 4.0) + 12.0;
    let n = panels.len().max(1) as f64;
    let slot = (WIDTH - MARGIN) / n;
    for (i, panel) in panels.iter().enumerate() {
        let ys = Scale::linear_over(
            panel
                .bars
                .iter()
                .flat_map(|b| b.dots.iter().copied().chain([b.value])),
            0.12,
        );
        let left = left_room(ys, &short_number, &panel.y_label, H);
        let f = Frame {
            x: i as f64 * slot + left,
            y: top,
            w: slot - left - 12.0,
            h: H,
        };
        // axes() puts the y label at the page's left for the first panel; shift it for others.
        axes_in_slot(&mut doc, f, ys, &panel.y_label, i as f64 * slot);
        if panel.bars.is_empty() {
            for (k, line) in wrap(&panel.empty, FONT, f.w - 16.0).iter().enumerate() {
                let _ = writeln!(
                    doc.body,
                    r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#666">{}</text>"##,
                    f.x + f.w / 2.0,
                    f.y + f.h / 2.0 + k as f64 * FONT * 1.3,
                    escape(line)
                );
            }
            continue;
        }
        let per = f.w / panel.bars.len() as f64;
        for (k, bar) in panel.bars.iter().enumerate() {
            let bw = per * 0.55;
            let bx = f.x + per * k as f64 + (per - bw) / 2.0;
            let y_of = |v: f64| f.y + (1.0 - ys.fraction(v).clamp(0.0, 1.0)) * f.h;
            let top_y = y_of(bar.value);
            let _ = writeln!(
                doc.body,
                r#"<rect x="{bx:.1}" y="{top_y:.1}" width="{bw:.1}" height="{:.1}" fill="{}" fill-opacity="0.75"/>"#,
                (y_of(0.0) - top_y).max(0.0),
                color(bar.color)
            );
            let _ = writeln!(
                doc.body,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                bx + bw / 2.0,
                (top_y - 5.0).max(f.y + FONT),
                escape(&short_number(bar.value))
            );
            for (d, &v) in bar.dots.iter().enumerate() {
                let spread = bw * 0.6;
                let dx = if bar.dots.len() > 1 {
                    spread * (d as f64 / (bar.dots.len() - 1) as f64 - 0.5)
                } else {
                    0.0
                };
                let _ = writeln!(
                    doc.body,
                    r##"<circle cx="{:.1}" cy="{:.1}" r="3" fill="white" stroke="#222" stroke-width="1.2"/>"##,
                    bx + bw / 2.0 + dx,
                    y_of(v)
                );
            }
        }
    }
    let mut entries: Vec<LegendEntry> = legend
        .iter()
        .map(|(name, c)| LegendEntry {
            name: name.clone(),
            color: *c,
            mark: Mark::Box,
        })
        .collect();
    entries.push(LegendEntry {
        name: "each round (the bar: their median)".into(),
        color: 0,
        mark: Mark::Dot,
    });
    let bottom = doc.legend(&entries, top + H + 16.0);
    doc.finish(bottom + MARGIN)
}

/// A bar panel's frame: grid, y ticks and its y label inside its own slot (no x axis).
fn axes_in_slot(doc: &mut Doc, f: Frame, ys: Scale, y_label: &str, slot_x: f64) {
    for t in ys.ticks() {
        let y = f.y + (1.0 - ys.fraction(t)) * f.h;
        let _ = writeln!(
            doc.body,
            r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            f.x,
            f.x + f.w,
            f.x - 6.0,
            y + 4.0,
            escape(&short_number(t))
        );
    }
    let _ = writeln!(
        doc.body,
        r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="#444"/>"##,
        f.x, f.y, f.w, f.h
    );
    y_label_at(doc, f, y_label, slot_x);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two() -> Vec<Series> {
        vec![
            Series::new("a", vec![(10.0, 0.5), (100.0, 1.0)], 0),
            Series::new("b", vec![(20.0, 0.9), (2000.0, 1.0)], 1).dashed(1),
        ]
    }

    #[test]
    fn a_plot_has_every_series_and_is_well_formed() {
        let s = cdf("GET <latency> & more", &two());
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<path").count(), 2);
        assert!(s.contains("GET &lt;latency&gt; &amp; more"));
        assert!(s.contains("1 ms") || s.contains("10 ms"));
        assert!(s.contains(r#"stroke-dasharray="7 4""#));
        // Empty series still give a valid document.
        assert!(cdf("empty", &[]).contains("</svg>"));
    }

    /// Every text element's estimated extent lies inside the document.
    fn texts_fit(svg: &str) {
        let width: f64 = svg
            .split("width=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap()
            .parse()
            .unwrap();
        for piece in svg.split("<text ").skip(1) {
            if piece.starts_with("transform") {
                continue;
            }
            let attr = |name: &str| -> Option<f64> {
                piece
                    .split(&format!("{name}=\""))
                    .nth(1)?
                    .split('"')
                    .next()?
                    .parse()
                    .ok()
            };
            let x = attr("x").unwrap();
            let size = attr("font-size").unwrap_or(FONT);
            let text = piece.split('>').nth(1).unwrap().split('<').next().unwrap();
            let w = text_width(&text.replace("&amp;", "&"), size);
            let (lo, hi) = if piece.contains(r#"text-anchor="middle""#) {
                (x - w / 2.0, x + w / 2.0)
            } else if piece.contains(r#"text-anchor="end""#) {
                (x - w, x)
            } else {
                (x, x + w)
            };
            assert!(
                lo >= 0.0 && hi <= width,
                "'{text}' spans {lo:.0}..{hi:.0} of {width}"
            );
        }
    }

    #[test]
    fn long_titles_and_legend_entries_wrap_inside_the_page() {
        let title = "memcached -t 2 -m 1024 -U 0 -c 4096 vs headroom: 8 threads x 16 connections, pipeline 32, 1:10 SET:GET, 1000000 keys (zipf 0.99), values 32:9,1K:1,256K:0.01";
        let series = vec![
            Series::new(format!("{title} GET"), vec![(10.0, 1.0)], 0),
            Series::new(format!("{title} SET"), vec![(30.0, 1.0)], 0).dashed(1),
        ];
        let svg = cdf(title, &series);
        texts_fit(&svg);
        // Both legend entries keep their distinguishing last word.
        assert!(svg.contains("GET</text>") && svg.contains("SET</text>"));
        let panels = line_panels(
            title,
            "puts",
            &[Panel {
                y_label: "free GiB".into(),
                series: vec![Series::new("x", vec![(0.0, 1.0), (5.0, 3.0)], 2)],
                y_max: Some(64.0),
            }],
            &[(title.to_string(), 2)],
        );
        texts_fit(&panels);
        let bars = bar_panels(
            title,
            &[
                BarPanel {
                    y_label: "requests/s".into(),
                    bars: vec![Bar {
                        value: 150_000.0,
                        dots: vec![140_000.0, 160_000.0],
                        color: 0,
                    }],
                    empty: String::new(),
                },
                BarPanel {
                    y_label: "CPU µs per request".into(),
                    bars: Vec::new(),
                    empty: "no CPU figure: the bench did not start these servers".into(),
                },
            ],
            &[("A: headroom".into(), 0)],
        );
        texts_fit(&bars);
        assert!(bars.contains("150k"));
    }

    #[test]
    fn wrapping_keeps_every_character() {
        let text = "a b averyveryveryveryverylongword c";
        let lines = wrap(text, 12.0, 60.0);
        assert!(lines.len() > 2);
        assert_eq!(lines.concat().replace(' ', ""), text.replace(' ', ""));
        for l in &lines {
            assert!(text_width(l, 12.0) <= 60.0, "{l}");
        }
        assert_eq!(short_number(150_000.0), "150k");
        assert_eq!(short_number(2_500_000.0), "2.5M");
        assert_eq!(short_number(3.25), "3.25");
        assert_eq!(nice_step(0.23), 0.5);
    }
}
