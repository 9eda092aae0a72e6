//! The report as an SVG chart (plotters' SVG backend; the text is laid out
//! by plotters' own estimate, with no system fonts, and drawn by whatever
//! opens the file): one panel per series, throughput (left axis) and p99
//! (right axis) over time, errors per second, fault events as red vertical
//! lines labelled with what they did, phase boundaries in grey; and for an
//! ef sweep with recall, recall against QPS and against p99.

use anyhow::{Result, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;

use super::report::{PhaseSummary, Report};

const WIDTH: u32 = 1200;
const PANEL: u32 = 300;
/// The strip above each timeline plot: its caption and legend.
const HEAD: u32 = 26;
/// The width of a timeline's axis areas, left and right; the caption
/// and the legend line up with the plot between them.
const AXIS: u32 = 70;
const SWEEP: u32 = 420;
pub(crate) const THROUGHPUT: RGBColor = RGBColor(31, 119, 180);
pub(crate) const P99: RGBColor = RGBColor(255, 127, 14);
pub(crate) const ERRORS: RGBColor = RGBColor(148, 103, 189);
/// Fault markers; the tests look for this colour.
pub(crate) const FAULT: RGBColor = RGBColor(214, 39, 40);
const PHASE: RGBColor = RGBColor(150, 150, 150);

/// The order panels appear in.
const SERIES: [&str; 4] = ["ingest", "query", "upsert", "delete"];

fn series_in(r: &Report) -> Vec<&'static str> {
    SERIES.into_iter().filter(|s| r.timeline.first().is_some_and(|row| row.series.contains_key(*s))).collect()
}

/// Query phases of a sweep that measured recall.
fn sweep(r: &Report) -> Vec<&PhaseSummary> {
    let q: Vec<&PhaseSummary> = r.phases.iter().filter(|p| p.series == "query" && p.recall.is_some()).collect();
    if q.len() > 1 { q } else { Vec::new() }
}

pub(crate) fn render(r: &Report) -> Result<String> {
    let series = series_in(r);
    let sweep = sweep(r);
    let height = PANEL * series.len().max(1) as u32 + if sweep.is_empty() { 0 } else { SWEEP } + 40;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let title = format!("shoal-loadtest {} - {} ({}), {:.0} s", r.command, r.target.collection, r.target.kind, r.duration_s);
        let (head, body) = root.split_vertically(40);
        head.draw_text(&title, &("sans-serif", 20).into_font().color(&BLACK), (12, 10)).map_err(err)?;
        let (timeline, rest) = body.split_vertically(PANEL * series.len().max(1) as u32);
        if series.is_empty() {
            timeline.draw_text("no requests finished", &("sans-serif", 16).into_font().color(&BLACK), (12, 20)).map_err(err)?;
        }
        let panels = timeline.split_evenly((series.len().max(1), 1));
        for (i, (s, area)) in series.iter().zip(panels.iter()).enumerate() {
            panel(r, s, area, i == 0)?;
        }
        if !sweep.is_empty() {
            let halves = rest.split_evenly((1, 2));
            sweep_panel(&sweep, &halves[0], true)?;
            sweep_panel(&sweep, &halves[1], false)?;
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing the chart: {e}")
}

fn nice_max(v: f64) -> f64 {
    if v <= 0.0 { 1.0 } else { v * 1.15 }
}

/// Throughput, errors and p99 of one series over time, with the faults.
fn panel(r: &Report, series: &str, area: &DrawingArea<SVGBackend<'_>, Shift>, labels: bool) -> Result<()> {
    // Errors in the throughput's unit: an ingest batch that failed lost
    // its batch of vectors (the last batch may be smaller).
    let per_error =
        r.phases.iter().find(|p| p.series == series).and_then(|p| p.params.get("batch")).and_then(serde_json::Value::as_f64).unwrap_or(1.0);
    let rows: Vec<(f64, f64, f64, f64)> = r
        .timeline
        .iter()
        // The last second, if the run ended inside it, is partial: its
        // rate would read as a drop.
        .filter(|row| row.t as f64 + 1.0 <= r.duration_s + 0.05 || r.duration_s < 1.0)
        .filter_map(|row| row.series.get(series).map(|s| (row.t as f64 + 0.5, s.items as f64, s.errors as f64 * per_error, s.p99_ms)))
        .collect();
    let t_max = (r.timeline.len() as f64).max(r.duration_s).max(1.0);
    let y_max = nice_max(rows.iter().map(|x| x.1.max(x.2)).fold(0.0, f64::max));
    let p_max = nice_max(rows.iter().map(|x| x.3).fold(0.0, f64::max));
    let (unit, errors) = if series == "ingest" { ("vectors/s", "failed vectors/s") } else { ("ok/s", "errors/s") };
    let with_errors = rows.iter().any(|x| x.2 > 0.0);
    // The caption and the legend share a strip above the plot: a legend
    // inside it covered the fault labels and the lines it explains.
    let (head, plot) = area.split_vertically(HEAD);
    head.draw_text(&format!("{series}: throughput and p99 latency"), &("sans-serif", 16).into_font().color(&BLACK), (AXIS as i32, 6))
        .map_err(err)?;
    let mut legend = vec![(format!("{series} {unit}"), THROUGHPUT)];
    if with_errors {
        legend.push((format!("{series} {errors}"), ERRORS));
    }
    legend.push((format!("{series} p99 ms"), P99));
    legend_row(&head, &legend)?;
    let mut chart = ChartBuilder::on(&plot)
        .margin(10)
        .margin_top(4)
        .x_label_area_size(32)
        .y_label_area_size(AXIS)
        .right_y_label_area_size(AXIS)
        .build_cartesian_2d(0f64..t_max, 0f64..y_max)
        .map_err(err)?
        .set_secondary_coord(0f64..t_max, 0f64..p_max);
    chart.configure_mesh().x_desc("seconds").y_desc(unit).light_line_style(WHITE.mix(0.0)).draw().map_err(err)?;
    chart.configure_secondary_axes().y_desc("p99 ms").draw().map_err(err)?;
    chart.draw_series(LineSeries::new(rows.iter().map(|x| (x.0, x.1)), line_style(THROUGHPUT))).map_err(err)?;
    if with_errors {
        chart.draw_series(LineSeries::new(rows.iter().map(|x| (x.0, x.2)), line_style(ERRORS))).map_err(err)?;
    }
    chart.draw_secondary_series(LineSeries::new(rows.iter().map(|x| (x.0, x.3)), line_style(P99))).map_err(err)?;
    // Phase boundaries (an ef sweep), named at the bottom.
    let phases: Vec<&PhaseSummary> = r.phases.iter().filter(|p| p.series == series).collect();
    if phases.len() > 1 {
        for p in &phases {
            let line = PathElement::new(
                vec![(p.start_s, 0.0), (p.start_s, y_max)],
                ShapeStyle { color: PHASE.to_rgba(), filled: false, stroke_width: 1 },
            );
            chart.draw_series(std::iter::once(line)).map_err(err)?;
            let text = Text::new(p.name.clone(), (p.start_s + t_max * 0.004, y_max * 0.06), ("sans-serif", 12).into_font().color(&PHASE));
            chart.draw_series(std::iter::once(text)).map_err(err)?;
        }
    }
    for (i, f) in r.faults.iter().enumerate() {
        let Some(t) = f.fired_s else { continue };
        let line = PathElement::new(vec![(t, 0.0), (t, y_max)], ShapeStyle { color: FAULT.to_rgba(), filled: false, stroke_width: 2 });
        chart.draw_series(std::iter::once(line)).map_err(err)?;
        if labels {
            // Staggered so that faults close in time stay readable.
            let y = y_max * (0.97 - 0.08 * (i % 5) as f64);
            let label = format!("{:.1}s {}{}", t, f.label, if f.ok { "" } else { " (failed)" });
            let text = Text::new(label, (t + t_max * 0.004, y), ("sans-serif", 13).into_font().color(&FAULT));
            chart.draw_series(std::iter::once(text)).map_err(err)?;
        }
    }
    Ok(())
}

fn line_style(c: RGBColor) -> ShapeStyle {
    ShapeStyle { color: c.to_rgba(), filled: false, stroke_width: 2 }
}

/// The series' names with their line colours, in a row that ends above
/// the right axis.
fn legend_row(head: &DrawingArea<SVGBackend<'_>, Shift>, entries: &[(String, RGBColor)]) -> Result<()> {
    let font = ("sans-serif", 12).into_font().color(&BLACK);
    let widths: Vec<i32> = entries
        .iter()
        .map(|(label, _)| head.estimate_text_size(label, &font).map(|(w, _)| w as i32))
        .collect::<Result<_, _>>()
        .map_err(err)?;
    let (sample, gap) = (20, 18);
    let total: i32 = widths.iter().map(|w| sample + 4 + w + gap).sum();
    let mut x = (WIDTH - AXIS) as i32 - total;
    let y = HEAD as i32 / 2 + 2;
    for ((label, colour), w) in entries.iter().zip(widths) {
        head.draw(&PathElement::new(vec![(x, y), (x + sample, y)], line_style(*colour))).map_err(err)?;
        head.draw_text(label, &font, (x + sample + 4, y - 6)).map_err(err)?;
        x += sample + 4 + w + gap;
    }
    Ok(())
}

/// Recall against QPS (left) or p99 (right), one point per ef.
fn sweep_panel(phases: &[&PhaseSummary], area: &DrawingArea<SVGBackend<'_>, Shift>, qps: bool) -> Result<()> {
    let pts: Vec<(f64, f64, &str)> = phases
        .iter()
        .map(|p| (if qps { p.ok_per_s } else { p.latency_ms.p99_ms }, p.recall.as_ref().map_or(0.0, |r| r.mean), p.name.as_str()))
        .collect();
    let (lo, hi) = pts.iter().fold((f64::MAX, 0.0f64), |(lo, hi), p| (lo.min(p.0), hi.max(p.0)));
    let pad = ((hi - lo) * 0.15).max(hi * 0.05).max(1e-3);
    let (x_lo, x_hi) = ((lo - pad).max(0.0), hi + pad);
    let r_min = pts.iter().map(|p| p.1).fold(1.0, f64::min);
    let y_lo = (r_min - 0.02).clamp(0.0, 0.98);
    let (title, x_desc) =
        if qps { ("recall against QPS (one point per ef)", "answered queries/s") } else { ("recall against p99 latency", "p99 ms") };
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 16))
        .margin(14)
        .x_label_area_size(32)
        .y_label_area_size(60)
        .build_cartesian_2d(x_lo..x_hi, y_lo..1.005)
        .map_err(err)?;
    chart.configure_mesh().x_desc(x_desc).y_desc("recall@k").light_line_style(WHITE.mix(0.0)).draw().map_err(err)?;
    let style = ShapeStyle { color: THROUGHPUT.to_rgba(), filled: true, stroke_width: 2 };
    chart.draw_series(LineSeries::new(pts.iter().map(|p| (p.0, p.1)), style)).map_err(err)?;
    // Each point with its ef, labels alternating above and below so that
    // points of equal recall stay readable.
    let font = ("sans-serif", 12).into_font().color(&BLACK);
    chart
        .draw_series(pts.iter().enumerate().map(|(i, p)| {
            let dy = if i % 2 == 0 { -18 } else { 6 };
            EmptyElement::at((p.0, p.1)) + Circle::new((0, 0), 4, style) + Text::new(p.2.to_owned(), (4, dy), font.clone())
        }))
        .map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::report::tests::sample;

    fn fault_strokes(svg: &str) -> usize {
        let c = FAULT;
        svg.matches(&format!("stroke=\"#{:02X}{:02X}{:02X}\"", c.0, c.1, c.2)).count()
    }

    #[test]
    fn the_svg_is_well_formed_with_its_series_faults_and_sweep() {
        let r = sample();
        let svg = render(&r).unwrap();
        let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let texts: Vec<String> = doc.descendants().filter(|n| n.has_tag_name("text")).filter_map(|n| n.text().map(str::to_owned)).collect();
        let has = |s: &str| texts.iter().any(|t| t.contains(s));
        for want in [
            "query ok/s",
            "query p99 ms",
            "query errors/s",
            "1.0s kill shard-1",
            "recall against QPS",
            "recall against p99 latency",
            "ef=16",
            "ef=64",
            "seconds",
        ] {
            assert!(has(want), "no text {want:?} in {texts:?}");
        }
        // One red vertical line for the one fault, in the one panel.
        assert_eq!(fault_strokes(&svg), 1);
        // The legend sits above the plot, where it cannot cover the
        // fault's label or the lines (it once did, seen in Chromium).
        let red = format!("#{:02X}{:02X}{:02X}", FAULT.0, FAULT.1, FAULT.2);
        let fault = doc.descendants().find(|n| n.attribute("stroke") == Some(red.as_str())).expect("the fault's line");
        let ys = |n: &roxmltree::Node| -> Vec<f64> {
            n.attribute("points").unwrap().split_whitespace().map(|p| p.split(',').nth(1).unwrap().parse().unwrap()).collect()
        };
        let plot_top = ys(&fault).into_iter().fold(f64::MAX, f64::min);
        let text_y = |want: &str| -> f64 {
            let n = doc.descendants().find(|n| n.has_tag_name("text") && n.text().is_some_and(|t| t.contains(want))).unwrap();
            n.attribute("y").unwrap().parse().unwrap()
        };
        for legend in ["query ok/s", "query errors/s", "query p99 ms"] {
            assert!(text_y(legend) < plot_top, "{legend} at y {} is inside the plot (top {plot_top})", text_y(legend));
        }
        assert!(text_y("1.0s kill shard-1") > plot_top);
        // The throughput line has a point per full second: the run lasted
        // 3.5 s, so the fourth row (partial) is left out.
        assert_eq!((r.duration_s, r.timeline.len()), (3.5, 4));
        let polylines: Vec<_> = doc.descendants().filter(|n| n.has_tag_name("polyline")).collect();
        let blue = format!("#{:02X}{:02X}{:02X}", THROUGHPUT.0, THROUGHPUT.1, THROUGHPUT.2);
        // The first blue line in the plot (the legend's sample is above it).
        let line = polylines
            .iter()
            .find(|n| n.attribute("stroke") == Some(blue.as_str()) && ys(n).iter().all(|y| *y >= plot_top))
            .expect("a throughput line");
        assert_eq!(line.attribute("points").unwrap().split_whitespace().count(), 3);
    }

    #[test]
    fn without_faults_or_sweep_there_are_no_markers_and_no_sweep_panel() {
        let mut r = sample();
        r.faults.clear();
        r.phases.truncate(1);
        let svg = render(&r).unwrap();
        roxmltree::Document::parse(&svg).expect("well-formed SVG");
        assert_eq!(fault_strokes(&svg), 0);
        assert!(!svg.contains("recall against QPS"));
        assert!(svg.contains("query ok/s"));
    }

    #[test]
    fn every_series_gets_a_panel_and_every_fault_a_line_in_each() {
        let mut r = sample();
        for row in &mut r.timeline {
            let q = row.series["query"].clone();
            row.series.insert("ingest".into(), q);
        }
        let mut second = r.faults[0].clone();
        second.fired_s = Some(2.5);
        second.label = "run: echo <&>".into();
        r.faults.push(second);
        let svg = render(&r).unwrap();
        roxmltree::Document::parse(&svg).expect("labels are escaped");
        assert!(svg.contains("ingest vectors/s") && svg.contains("ingest failed vectors/s"));
        assert_eq!(fault_strokes(&svg), 4);
    }
}
