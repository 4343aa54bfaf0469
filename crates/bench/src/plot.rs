//! PNG plots for benchmark reports (plotters, bitmap backend).
//!
//! Text is drawn with ab_glyph from a TrueType font found on the system
//! (Debian's fonts-dejavu-core, installed by scripts/install-test-deps.sh), so
//! no system font library is linked.

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;

const FONT_PATHS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

fn ensure_font() -> Result<(), String> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        // BLOBHOUSE_PLOT_FONT names another TrueType font (a machine
        // without Debian's fonts, e.g. matplotlib's copy of DejaVu Sans).
        let given = std::env::var("BLOBHOUSE_PLOT_FONT").ok().filter(|p| !p.is_empty());
        let path = given
            .as_deref()
            .into_iter()
            .chain(FONT_PATHS)
            .find(|p| Path::new(p).exists())
            .ok_or("no DejaVuSans.ttf found; run scripts/install-test-deps.sh (fonts-dejavu-core), or name a .ttf in BLOBHOUSE_PLOT_FONT")?;
        let bytes: &'static [u8] = Box::leak(std::fs::read(path).map_err(|e| format!("{path}: {e}"))?.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).map_err(|_| format!("{path} is not a usable font"))?;
        Ok(())
    })
    .clone()
}

/// One line of a chart.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    /// Draw markers at the points (measurements) or just a line (models).
    pub markers: bool,
}

/// Axes of a chart.
pub struct Axes {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Logarithmic x axis.
    pub log_x: bool,
    /// Put the legend lower right (for curves that rise from the left).
    pub legend_lower_right: bool,
}

/// Draws `series` into a PNG at `path`.
pub fn line_chart(path: &Path, axes: &Axes, series: &[Series]) -> Result<(), String> {
    ensure_font()?;
    let pts = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0.0f64);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        return Err("nothing to plot".into());
    }
    let root = BitMapBackend::new(path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let colors = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(23, 190, 207),
        BLACK,
    ];
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart.configure_mesh().x_desc(axes.x_label.as_str()).y_desc(axes.y_label.as_str()).draw().map_err(|e| e.to_string())?;
            for (i, s) in series.iter().enumerate() {
                let color = colors[i % colors.len()];
                chart
                    .draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))
                    .map_err(|e| e.to_string())?
                    .label(s.label.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
                if s.markers {
                    chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 4, color.filled()))).map_err(|e| e.to_string())?;
                }
            }
            chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).position(if axes.legend_lower_right { SeriesLabelPosition::LowerRight } else { SeriesLabelPosition::UpperLeft }).draw().map_err(|e| e.to_string())?;
        }};
    }
    let mut builder = ChartBuilder::on(&root);
    builder.caption(axes.title.as_str(), ("sans-serif", 24)).margin(15).x_label_area_size(45).y_label_area_size(70);
    if axes.log_x {
        draw!(builder.build_cartesian_2d((x0.max(1e-9)..x1 * 1.05).log_scale(), 0.0..y1 * 1.1).map_err(|e| e.to_string())?);
    } else {
        draw!(builder.build_cartesian_2d(x0..x1 * 1.05, 0.0..y1 * 1.1).map_err(|e| e.to_string())?);
    }
    root.present().map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(())
}
