//! Small self-contained SVG charts for the benchmark report: grouped bars (optionally on a log
//! scale) and line charts (optionally with a log x axis). No dependencies; the output is
//! embedded in `report.html` and written beside it as `.svg` files.

use std::fmt::Write;

const W: f64 = 760.0;
const H: f64 = 340.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 6] = [
    "#8c8c8c", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn fmt_num(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn header(title: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
        W / 2.0,
        esc(title)
    )
}

fn legend(out: &mut String, names: &[&str]) {
    let mut x = LEFT;
    for (i, n) in names.iter().enumerate() {
        let _ = writeln!(
            out,
            "<rect x=\"{x}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>",
            H - 18.0,
            COLORS[i % COLORS.len()],
            x + 16.0,
            H - 8.0,
            esc(n)
        );
        x += 30.0 + 7.0 * n.len() as f64;
    }
}

/// Grouped bars: one group per category, one bar per series. `log`: logarithmic y axis.
pub fn bars(
    title: &str,
    y_label: &str,
    cats: &[String],
    series: &[(&str, Vec<f64>)],
    log: bool,
) -> String {
    let mut out = header(title);
    let max = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let (lo, hi) = if log {
        let min = series
            .iter()
            .flat_map(|(_, v)| v.iter().copied())
            .filter(|&x| x > 0.0)
            .fold(max, f64::min);
        (
            min.log10().floor(),
            max.log10().ceil().max(min.log10().floor() + 1.0),
        )
    } else {
        (0.0, max * 1.1)
    };
    let ph = H - TOP - BOTTOM;
    let pw = W - LEFT - RIGHT;
    let y = |v: f64| -> f64 {
        let f = if log {
            if v <= 0.0 {
                0.0
            } else {
                ((v.log10() - lo) / (hi - lo)).clamp(0.0, 1.0)
            }
        } else {
            v / hi
        };
        TOP + ph * (1.0 - f)
    };
    // Grid and y ticks.
    let ticks: Vec<f64> = if log {
        (lo as i32..=hi as i32).map(|e| 10f64.powi(e)).collect()
    } else {
        (0..=5).map(|i| hi * i as f64 / 5.0).collect()
    };
    for t in ticks {
        let yy = y(t);
        let _ = writeln!(
            out,
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{yy}\" y2=\"{yy}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
            W - RIGHT,
            LEFT - 6.0,
            yy + 4.0,
            fmt_num(t)
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"14\" y=\"{}\" transform=\"rotate(-90 14 {})\" text-anchor=\"middle\">{}</text>",
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        esc(y_label)
    );
    let gw = pw / cats.len().max(1) as f64;
    let bw = (gw * 0.8) / series.len().max(1) as f64;
    for (ci, c) in cats.iter().enumerate() {
        let gx = LEFT + gw * ci as f64 + gw * 0.1;
        for (si, (_, v)) in series.iter().enumerate() {
            let val = v.get(ci).copied().unwrap_or(0.0);
            let top = y(val);
            let _ = writeln!(
                out,
                "<rect x=\"{:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"><title>{}: {}</title></rect><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"10\">{}</text>",
                gx + bw * si as f64,
                bw - 2.0,
                (TOP + ph - top).max(0.0),
                COLORS[si % COLORS.len()],
                esc(c),
                fmt_num(val),
                gx + bw * si as f64 + bw / 2.0,
                top - 3.0,
                fmt_num(val)
            );
        }
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            gx + gw * 0.4,
            TOP + ph + 16.0,
            esc(c)
        );
    }
    let names: Vec<&str> = series.iter().map(|(n, _)| *n).collect();
    legend(&mut out, &names);
    out.push_str("</svg>\n");
    out
}

/// Lines: each series a list of (x, y) points. `log_x`: logarithmic x axis.
pub fn lines(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(&str, Vec<(f64, f64)>)],
    log_x: bool,
) -> String {
    lines_marked(title, x_label, y_label, series, log_x, &[])
}

/// [`lines`] with marked points: a ring at each (x, y) and its label beside it.
pub fn lines_marked(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(&str, Vec<(f64, f64)>)],
    log_x: bool,
    marks: &[(f64, f64, &str)],
) -> String {
    let mut out = header(title);
    let pts = || series.iter().flat_map(|(_, v)| v.iter().copied());
    let fx = |x: f64| if log_x { x.max(1e-9).log10() } else { x };
    let (mut x0, mut x1) = (f64::MAX, f64::MIN);
    let mut y1 = 0.0f64;
    for (x, y) in pts() {
        x0 = x0.min(fx(x));
        x1 = x1.max(fx(x));
        y1 = y1.max(y);
    }
    if x0 >= x1 {
        x0 = if x0 == f64::MAX { 0.0 } else { x0 };
        x1 = x0 + 1.0;
    }
    if log_x {
        x0 = x0.floor();
        x1 = x1.ceil();
    }
    let y1 = if y1 <= 0.0 { 1.0 } else { y1 * 1.1 };
    let ph = H - TOP - BOTTOM;
    let pw = W - LEFT - RIGHT;
    let px = |x: f64| LEFT + pw * (fx(x) - x0) / (x1 - x0);
    let py = |y: f64| TOP + ph * (1.0 - y / y1);
    for i in 0..=5 {
        let v = y1 * i as f64 / 5.0;
        let yy = py(v);
        let _ = writeln!(
            out,
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{yy}\" y2=\"{yy}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
            W - RIGHT,
            LEFT - 6.0,
            yy + 4.0,
            fmt_num(v)
        );
    }
    let xt: Vec<f64> = if log_x {
        (x0 as i32..=x1 as i32).map(|e| 10f64.powi(e)).collect()
    } else {
        (0..=5).map(|i| x0 + (x1 - x0) * i as f64 / 5.0).collect()
    };
    for t in xt {
        let xx = px(t);
        let _ = writeln!(
            out,
            "<line x1=\"{xx}\" x2=\"{xx}\" y1=\"{TOP}\" y2=\"{}\" stroke=\"#eee\"/><text x=\"{xx}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            TOP + ph,
            TOP + ph + 16.0,
            fmt_num(t)
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text><text x=\"14\" y=\"{}\" transform=\"rotate(-90 14 {})\" text-anchor=\"middle\">{}</text>",
        LEFT + pw / 2.0,
        TOP + ph + 32.0,
        esc(x_label),
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        esc(y_label)
    );
    for (si, (_, v)) in series.iter().enumerate() {
        let mut d = String::new();
        for (i, (x, y)) in v.iter().enumerate() {
            let _ = write!(
                d,
                "{}{:.1},{:.1} ",
                if i == 0 { "M" } else { "L" },
                px(*x),
                py(*y)
            );
        }
        let _ = writeln!(
            out,
            "<path d=\"{d}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>",
            COLORS[(si + 1) % COLORS.len()]
        );
    }
    for (x, y, label) in marks {
        let (xx, yy) = (px(*x), py(*y));
        if xx.is_finite() && yy.is_finite() {
            let _ = writeln!(
                out,
                "<circle cx=\"{xx:.1}\" cy=\"{yy:.1}\" r=\"6\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\"/><text x=\"{:.1}\" y=\"{:.1}\" fill=\"#d62728\">{}</text>",
                xx + 9.0,
                yy - 9.0,
                esc(label)
            );
        }
    }
    let names: Vec<&str> = series.iter().map(|(n, _)| *n).collect();
    // Line colours start at index 1 (index 0, grey, is the baseline in bar charts).
    let mut x = LEFT;
    for (i, n) in names.iter().enumerate() {
        let _ = writeln!(
            out,
            "<rect x=\"{x}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>",
            H - 18.0,
            COLORS[(i + 1) % COLORS.len()],
            x + 16.0,
            H - 8.0,
            esc(n)
        );
        x += 30.0 + 7.0 * n.len() as f64;
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_svg_and_survive_odd_input() {
        let b = bars(
            "t<",
            "IOPS",
            &["a".into(), "b".into()],
            &[("base", vec![1.0, 300.0]), ("cached", vec![50000.0, 0.0])],
            true,
        );
        assert!(b.starts_with("<svg") && b.ends_with("</svg>\n") && b.contains("t&lt;"));
        let e = bars("empty", "x", &[], &[], false);
        assert!(e.contains("</svg>"));
        let l = lines(
            "l",
            "x",
            "y",
            &[("s", vec![(1.0, 2.0), (100.0, 3.0)])],
            true,
        );
        assert!(l.contains("<path"));
        let l = lines("l", "x", "y", &[("s", vec![])], false);
        assert!(l.contains("</svg>"));
        let m = lines_marked(
            "m",
            "x",
            "y",
            &[("s", vec![(1.0, 0.9), (10.0, 0.2), (100.0, 0.1)])],
            true,
            &[(10.0, 0.2, "knee <10>")],
        );
        assert!(m.contains("<circle") && m.contains("knee &lt;10&gt;") && !m.contains("NaN"));
        assert!(!b.contains("NaN") && !l.contains("NaN"));
    }
}
