//! `latency.svg`: p50 exchange latency against state size, log–log.

use super::measured::Row;
use std::path::Path;

/// p50 latency against state size, log–log, one line per (series, world size).
pub(super) fn draw(rows: &[Row], path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let xs: Vec<f64> = rows.iter().map(|r| r.sources as f64).collect();
    let ys: Vec<f64> = rows
        .iter()
        .flat_map(|r| {
            [r.ours.p50, r.floor.p50, r.fast.p50]
                .into_iter()
                .chain(r.pytorch.map(|p| p.p50))
        })
        .filter(|y| *y > 0.0 && y.is_finite())
        .collect();
    let (x0, x1) = (
        xs.iter().copied().fold(f64::MAX, f64::min).max(1.0),
        xs.iter().copied().fold(1.0, f64::max),
    );
    let (y0, y1) = (
        ys.iter().copied().fold(f64::MAX, f64::min).min(1.0) * 0.5,
        ys.iter().copied().fold(0.001, f64::max) * 2.0,
    );
    let mut chart = ChartBuilder::on(&root)
        .caption("exchange + merge latency (p50)", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((x0 * 0.8..x1 * 1.25).log_scale(), (y0..y1).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("sources per state")
        .y_desc("ms")
        .draw()?;
    // One line per (engine, world size) and measurement; PyTorch's once per world size.
    let mut groups: Vec<(&str, usize)> = Vec::new();
    for r in rows {
        if !groups.contains(&(r.engine.as_str(), r.world_size)) {
            groups.push((r.engine.as_str(), r.world_size));
        }
    }
    let first_engine = groups.first().map(|g| g.0).unwrap_or_default();
    type Get = fn(&Row) -> Option<f64>;
    let kinds: [(&str, Get, RGBColor); 4] = [
        ("ours", |r| Some(r.ours.p50), RGBColor(0x1f, 0x77, 0xb4)),
        (
            "raw floor",
            |r| Some(r.floor.p50),
            RGBColor(0x2c, 0xa0, 0x2c),
        ),
        (
            "PyTorch",
            |r| r.pytorch.map(|p| p.p50),
            RGBColor(0xd6, 0x27, 0x28),
        ),
        (
            "fast path",
            |r| Some(r.fast.p50),
            RGBColor(0x94, 0x67, 0xbd),
        ),
    ];
    let palette = [0u8, 0x55, 0x99];
    for (gi, &(engine, w)) in groups.iter().enumerate() {
        for (name, get, color) in &kinds {
            if *name == "PyTorch" && engine != first_engine {
                continue;
            }
            let pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.world_size == w && r.engine == engine)
                .filter_map(|r| get(r).map(|y| (r.sources as f64, y)))
                .collect();
            if pts.is_empty() {
                continue;
            }
            // Later groups: the same hue, lighter.
            let shade = palette[gi.min(palette.len() - 1)];
            let c = RGBColor(
                color.0.saturating_add(shade),
                color.1.saturating_add(shade),
                color.2.saturating_add(shade),
            );
            let ranks = crate::count(w, "rank", "ranks");
            let label = if *name == "PyTorch" {
                format!("PyTorch (torch gloo), {ranks}")
            } else {
                format!("{name} ({engine}), {ranks}")
            };
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}
