//! The lab's SVG plots, drawn with `plotters`' SVG backend:
//! - `throughput.svg`: upload goodput per second, one line per state;
//! - `latency_cdf.svg`: the CDF of the RTT samples during upload, per state;
//! - `staircase.svg`: median RTT against the number of streams.
//!
//! Units: seconds, Mbit/s, ms. Non-goals: styling beyond legible defaults.

use anyhow::{Result, anyhow};
use plotters::prelude::*;

use super::{measured::LabRun, stats::percentile};

const SIZE: (u32, u32) = (800, 480);

/// One colour per state, in order.
fn colour(i: usize) -> RGBColor {
    const C: [RGBColor; 6] = [
        RGBColor(0x1f, 0x77, 0xb4),
        RGBColor(0xd6, 0x27, 0x28),
        RGBColor(0x2c, 0xa0, 0x2c),
        RGBColor(0xff, 0x7f, 0x0e),
        RGBColor(0x94, 0x67, 0xbd),
        RGBColor(0x8c, 0x56, 0x4b),
    ];
    C[i % C.len()]
}

/// One line per state: (name, points).
type Series = Vec<(String, Vec<(f64, f64)>)>;

fn line_chart(title: &str, x_label: &str, y_label: &str, series: &Series) -> Result<String> {
    let mut svg = String::new();
    let pts = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x1, mut y1) = (1.0_f64, 1.0_f64);
    for &(x, y) in pts {
        if x.is_finite() {
            x1 = x1.max(x);
        }
        if y.is_finite() {
            y1 = y1.max(y);
        }
    }
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        let e = |e: &dyn std::fmt::Display| anyhow!("drawing {title}: {e}");
        root.fill(&WHITE).map_err(|x| e(&x))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(56)
            .build_cartesian_2d(0.0..x1 * 1.05, 0.0..y1 * 1.1)
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .draw()
            .map_err(|x| e(&x))?;
        for (i, (name, points)) in series.iter().enumerate() {
            let c = colour(i);
            chart
                .draw_series(LineSeries::new(
                    points
                        .iter()
                        .copied()
                        .filter(|(x, y)| x.is_finite() && y.is_finite()),
                    c.stroke_width(2),
                ))
                .map_err(|x| e(&x))?
                .label(name.clone())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], c.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|x| e(&x))?;
        root.present().map_err(|x| e(&x))?;
    }
    Ok(svg)
}

/// Empirical CDF points of `samples`: (value, fraction ≤ value).
pub fn cdf(samples: &[f64]) -> Vec<(f64, f64)> {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    v.iter()
        .enumerate()
        .map(|(i, &x)| (x, (i + 1) as f64 / n))
        .collect()
}

/// Every plot as (file name, SVG text).
pub fn all(lab: &LabRun) -> Result<Vec<(&'static str, String)>> {
    let throughput: Series = lab
        .states
        .iter()
        .map(|s| {
            let pts =
                s.up.tcp
                    .intervals
                    .iter()
                    .filter(|i| !i.omitted)
                    .map(|i| (i.end, i.bps / 1e6))
                    .collect();
            (s.name.to_owned(), pts)
        })
        .collect();
    let latency: Series = lab
        .states
        .iter()
        .map(|s| (s.name.to_owned(), cdf(&s.up.ping_ms)))
        .collect();
    let stairs: Series = lab
        .states
        .iter()
        .map(|s| {
            let pts = s
                .staircase
                .iter()
                .map(|st| {
                    (
                        f64::from(st.streams),
                        percentile(&st.ping_ms, 50.0).unwrap_or(f64::NAN),
                    )
                })
                .collect();
            (s.name.to_owned(), pts)
        })
        .collect();
    Ok(vec![
        (
            "throughput.svg",
            line_chart(
                "Upload goodput over time",
                "seconds (after warm-up)",
                "Mbit/s",
                &throughput,
            )?,
        ),
        (
            "latency_cdf.svg",
            line_chart(
                "RTT during upload: CDF",
                "RTT, ms",
                "fraction of samples",
                &latency,
            )?,
        ),
        (
            "staircase.svg",
            line_chart(
                "Staircase: median RTT against streams",
                "streams",
                "RTT p50, ms",
                &stairs,
            )?,
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_is_sorted_and_ends_at_one() {
        let c = cdf(&[3.0, 1.0, f64::NAN, 2.0]);
        assert_eq!(c, vec![(1.0, 1.0 / 3.0), (2.0, 2.0 / 3.0), (3.0, 1.0)]);
        assert!(cdf(&[]).is_empty());
    }

    #[test]
    fn a_chart_is_an_svg_with_its_title_and_legend() {
        let s: Series = vec![
            ("cake".to_owned(), vec![(1.0, 40.0), (2.0, 45.0)]),
            ("none".to_owned(), vec![(1.0, 900.0), (2.0, f64::NAN)]),
        ];
        let svg = line_chart("T", "x", "y", &s).expect("draws");
        assert!(svg.starts_with("<svg") || svg.contains("<svg"), "{svg}");
        assert!(svg.contains("cake") && svg.contains("none") && svg.contains("\nT\n"));
    }
}
