//! `training.png`: a chart per thing the run measured ([`panels`], as
//! [`super::table`] places the figures): reward, tool use, turns per
//! rollout, gradient norm, entropy, trainer-vs-engine gap.
//!
//! Text needs a TrueType font, which plotters' `ab_glyph` backend takes as
//! bytes: the first of a few usual system fonts (Debian's `fonts-dejavu-core`
//! first), or any `.ttf` under `/usr/share/fonts`. Without one the plot is
//! drawn without text (no titles, tick labels or legend) and says so.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::FontStyle;

use super::table::{METRICS, PANELS};
use super::{ReportError, StepRecord};

const SIZE: (u32, u32) = (1200, 1000);
const FONT: &str = "sans-serif";
const FONT_CANDIDATES: [&str; 5] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/Library/Fonts/Arial Unicode.ttf",
];

/// Whether the PNG has text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Labels {
    Drawn,
    /// No usable TrueType font was found: curves and grid only.
    NoFont,
}

/// Draws the run's curves to a PNG at `path`. Step 0 contributes only its
/// validation reward. Errors are for the caller to log; a failed plot
/// should never stop a run.
pub fn plot(records: &[StepRecord], path: &Path) -> Result<Labels, ReportError> {
    let labels = if system_font() {
        Labels::Drawn
    } else {
        Labels::NoFont
    };
    draw(records, path, labels == Labels::Drawn).map_err(|message| ReportError::Plot {
        path: path.to_path_buf(),
        message,
    })?;
    Ok(labels)
}

/// Registers the system font with plotters once; false when there is none.
fn system_font() -> bool {
    static FOUND: OnceLock<bool> = OnceLock::new();
    *FOUND.get_or_init(|| {
        let Some((path, bytes)) = find_font() else {
            tracing::warn!("no TrueType font found: the plot will have no text");
            return false;
        };
        // plotters keeps fonts for the life of the process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        let ok = plotters::style::register_font(FONT, FontStyle::Normal, bytes).is_ok();
        if !ok {
            tracing::warn!(font = %path.display(), "unusable font: the plot will have no text");
        }
        ok
    })
}

fn find_font() -> Option<(PathBuf, Vec<u8>)> {
    let any_ttf = || {
        let mut found: Vec<PathBuf> = Vec::new();
        let mut dirs = vec![PathBuf::from("/usr/share/fonts")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let p = entry.path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.extension().is_some_and(|e| e.eq_ignore_ascii_case("ttf")) {
                    found.push(p);
                }
            }
        }
        found.sort();
        found
    };
    FONT_CANDIDATES
        .iter()
        .map(PathBuf::from)
        .chain(std::iter::once_with(any_ttf).flatten())
        .find_map(|p| std::fs::read(&p).ok().map(|b| (p, b)))
}

type Points = Vec<(f64, f64)>;

/// One chart of the plot: a title and its named series.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    pub title: &'static str,
    pub lines: Vec<(&'static str, Points, RGBColor)>,
}

fn series(records: &[StepRecord], value: impl Fn(&StepRecord) -> Option<f64>) -> Points {
    records
        .iter()
        .filter_map(|r| value(r).map(|v| (r.step as f64, v)))
        .filter(|(_, v)| v.is_finite())
        .collect()
}

/// The panels the run's records fill: [`PANELS`] in order, each with the
/// series [`METRICS`] puts on it (a training figure without the baseline's
/// point). A series without a point is left out, and a panel without a
/// series (a harness that reports no tool use, entropy not computed): no
/// empty or constant-by-construction chart.
pub fn panels(records: &[StepRecord]) -> Vec<Panel> {
    let uses_tools = records
        .iter()
        .any(|r| r.tool_use.is_some_and(|t| t > 0.0) || r.val_tool_use.is_some_and(|t| t > 0.0));
    PANELS
        .iter()
        .filter(|p| uses_tools || !p.tools_only)
        .map(|p| Panel {
            title: p.title,
            lines: METRICS
                .iter()
                .filter_map(|m| {
                    let s = m.series.as_ref().filter(|s| s.panel == p.title)?;
                    let points = series(records, |r| {
                        m.value(r).filter(|_| m.baseline || !r.is_baseline())
                    });
                    Some((s.label, points, s.color))
                })
                .filter(|(_, points, _)| !points.is_empty())
                .collect(),
        })
        .filter(|p| !p.lines.is_empty())
        .collect()
}

fn draw(records: &[StepRecord], path: &Path, text: bool) -> Result<(), String> {
    let panels = panels(records);
    let last_step = records.iter().map(|r| r.step).max().unwrap_or(0).max(1) as f64;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let rows = panels.len().div_ceil(2).max(1);
    let areas = root.split_evenly((rows, 2));
    for (panel_def, area) in panels.iter().zip(&areas) {
        let lines: Vec<(&str, &Points, RGBColor)> = panel_def
            .lines
            .iter()
            .map(|(name, points, color)| (*name, points, *color))
            .collect();
        panel(area, text.then_some(panel_def.title), last_step, &lines)?;
    }
    root.present().map_err(|e| e.to_string())
}

/// One chart: each series as a line with its points marked.
fn panel(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    title: Option<&str>,
    last_step: f64,
    lines: &[(&str, &Points, RGBColor)],
) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<_>| e.to_string();
    let y = y_range(lines.iter().flat_map(|(_, p, _)| p.iter().map(|(_, v)| *v)));
    let mut builder = ChartBuilder::on(area);
    builder.margin(12).margin_right(24);
    if let Some(title) = title {
        builder
            .caption(title, (FONT, 22))
            .x_label_area_size(35)
            .y_label_area_size(60);
    }
    let mut chart = builder.build_cartesian_2d(0.0..last_step, y).map_err(err)?;
    let mut mesh = chart.configure_mesh();
    if title.is_some() {
        mesh.x_desc("step")
            // Whole steps only: at most one label per step.
            .x_labels((last_step as usize + 1).min(11))
            .x_label_formatter(&|x| format!("{x:.0}"))
            .label_style((FONT, 14));
    }
    mesh.draw().map_err(err)?;
    for (name, points, color) in lines {
        let color = *color;
        let drawn = chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(err)?;
        if title.is_some() {
            drawn.label(*name).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        }
        chart
            .draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(err)?;
    }
    if title.is_some() {
        chart
            .configure_series_labels()
            .position(legend_corner(lines, last_step))
            .label_font((FONT, 14))
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

/// The right-hand corner the curves leave free: upper when the points in
/// the right third of the chart lie, on average, in its lower half, else
/// lower.
fn legend_corner(lines: &[(&str, &Points, RGBColor)], last_step: f64) -> SeriesLabelPosition {
    let all = || lines.iter().flat_map(|(_, p, _)| p.iter());
    let y = y_range(all().map(|(_, v)| *v));
    let mid = (y.start + y.end) / 2.0;
    let right: Vec<f64> = all()
        .filter(|(x, _)| *x >= last_step * 2.0 / 3.0)
        .map(|(_, v)| *v)
        .collect();
    let mean = right.iter().sum::<f64>() / right.len().max(1) as f64;
    if !right.is_empty() && mean < mid {
        SeriesLabelPosition::UpperRight
    } else {
        SeriesLabelPosition::LowerRight
    }
}

/// The values' range with a margin; a fixed range when there is no spread.
fn y_range(values: impl Iterator<Item = f64>) -> Range<f64> {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !lo.is_finite() {
        return 0.0..1.0;
    }
    let pad = ((hi - lo) * 0.08).max(1e-3 * lo.abs().max(1.0));
    (lo - pad)..(hi + pad)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Draws without registering any font: the no-font path must not need
    /// one (this test binary never registers a font: `plot` is not called
    /// from the library's unit tests).
    #[test]
    fn draws_without_a_font() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.png");
        let records: Vec<StepRecord> = (0..4)
            .map(|step| {
                let mut r = StepRecord {
                    step,
                    reward_mean: Some(step as f64 / 4.0),
                    val_reward: (step % 2 == 0).then_some(0.5),
                    ..StepRecord::default()
                };
                r.update.set("grad_norm", 1.0 / (step + 1) as f64);
                r
            })
            .collect();
        draw(&records, &path, false).unwrap();
        let png = std::fs::read(&path).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    }

    #[test]
    fn the_legend_goes_where_the_curves_are_not() {
        let rising: Points = vec![(1.0, 0.1), (2.0, 0.5), (3.0, 0.9)];
        let falling: Points = vec![(1.0, 0.9), (2.0, 0.5), (3.0, 0.1)];
        let at = |p: &Points| legend_corner(&[("x", p, BLUE)], 3.0);
        assert!(matches!(at(&rising), SeriesLabelPosition::LowerRight));
        assert!(matches!(at(&falling), SeriesLabelPosition::UpperRight));
    }

    #[test]
    fn y_range_pads_and_handles_flat_or_empty_data() {
        let r = y_range([0.2, 0.8].into_iter());
        assert!(r.start < 0.2 && r.end > 0.8);
        let flat = y_range([0.5, 0.5].into_iter());
        assert!(flat.start < 0.5 && flat.end > 0.5);
        assert_eq!(y_range(std::iter::empty()), 0.0..1.0);
    }
}
