//! The Prometheus text exposition format (version 0.0.4), written by hand:
//! it is a few lines per metric, and a client library would bring a
//! registry, its own locking and dependencies for what a `String` does.
//!
//! Each family is a `# HELP` and a `# TYPE` line, then its samples;
//! label values are escaped (`\\`, `\"`, `\n`); a histogram's buckets are
//! cumulative, end with `le="+Inf"` (equal to `_count`) and are followed
//! by `_sum` and `_count`.

use std::fmt::Write;

/// Content type of what [`Text`] writes.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A histogram's figures: per-bucket counts (not cumulative; one per
/// bound, plus the overflow past the last bound), their sum and count.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistogramData {
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl HistogramData {
    pub fn new(bounds: &[f64]) -> HistogramData {
        HistogramData {
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// Counts `v` in the first bucket whose bound is at least `v`.
    pub fn observe(&mut self, bounds: &[f64], v: f64) {
        let i = bounds.iter().position(|b| v <= *b).unwrap_or(bounds.len());
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        }
        self.sum += v;
        self.count += 1;
    }
}

/// A page of metrics being written.
#[derive(Default)]
pub struct Text {
    out: String,
}

impl Text {
    pub fn new() -> Text {
        Text::default()
    }

    pub fn finish(self) -> String {
        self.out
    }

    /// Starts a family: its HELP and TYPE lines.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.name());
    }

    /// One sample of the current family.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        labels_into(&mut self.out, labels, None);
        self.out.push(' ');
        self.out.push_str(&number(value));
        self.out.push('\n');
    }

    /// A whole family with one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: Kind, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// One histogram of the current family (`name` without suffixes).
    pub fn histogram(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        bounds: &[f64],
        h: &HistogramData,
    ) {
        let mut cumulative = 0u64;
        for (i, b) in bounds.iter().enumerate() {
            cumulative += h.counts.get(i).copied().unwrap_or(0);
            self.bucket(name, labels, &number(*b), cumulative);
        }
        // +Inf is the count itself: every observation is at most +Inf.
        self.bucket(name, labels, "+Inf", h.count);
        self.sample(&format!("{name}_sum"), labels, h.sum);
        self.sample(&format!("{name}_count"), labels, h.count as f64);
    }

    fn bucket(&mut self, name: &str, labels: &[(&str, &str)], le: &str, n: u64) {
        self.out.push_str(name);
        self.out.push_str("_bucket");
        labels_into(&mut self.out, labels, Some(le));
        let _ = writeln!(self.out, " {n}");
    }
}

fn labels_into(out: &mut String, labels: &[(&str, &str)], le: Option<&str>) {
    if labels.is_empty() && le.is_none() {
        return;
    }
    out.push('{');
    let mut first = true;
    for (k, v) in labels.iter().copied().chain(le.map(|le| ("le", le))) {
        if !first {
            out.push(',');
        }
        first = false;
        out.push_str(k);
        out.push_str("=\"");
        for ch in v.chars() {
            match ch {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push('}');
}

/// A value as Prometheus reads it: integers without a fraction, the
/// infinities and NaN by their names.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let mut t = Text::new();
        t.family("byom_x_total", Kind::Counter, "A \\ help\nline.");
        t.sample("byom_x_total", &[("connector", "a\"b\\c\nd")], 3.0);
        assert_eq!(
            t.finish(),
            "# HELP byom_x_total A \\\\ help\\nline.\n\
             # TYPE byom_x_total counter\n\
             byom_x_total{connector=\"a\\\"b\\\\c\\nd\"} 3\n"
        );
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_with_inf() {
        let bounds = [0.1, 1.0, 10.0];
        let mut h = HistogramData::new(&bounds);
        for v in [0.05, 0.1, 0.5, 20.0, 30.0] {
            h.observe(&bounds, v);
        }
        let mut t = Text::new();
        t.family("byom_wait_seconds", Kind::Histogram, "Wait.");
        t.histogram("byom_wait_seconds", &[("role", "router")], &bounds, &h);
        let text = t.finish();
        let want = "\
byom_wait_seconds_bucket{role=\"router\",le=\"0.1\"} 2
byom_wait_seconds_bucket{role=\"router\",le=\"1\"} 3
byom_wait_seconds_bucket{role=\"router\",le=\"10\"} 3
byom_wait_seconds_bucket{role=\"router\",le=\"+Inf\"} 5
byom_wait_seconds_sum{role=\"router\"} 50.65
byom_wait_seconds_count{role=\"router\"} 5
";
        assert!(text.ends_with(want), "{text}");
    }

    #[test]
    fn an_empty_histogram_has_every_bucket_at_zero() {
        let bounds = [1.0];
        let mut t = Text::new();
        t.histogram("h", &[], &bounds, &HistogramData::new(&bounds));
        assert_eq!(
            t.finish(),
            "h_bucket{le=\"1\"} 0\nh_bucket{le=\"+Inf\"} 0\nh_sum 0\nh_count 0\n"
        );
    }

    #[test]
    fn numbers() {
        assert_eq!(number(3.0), "3");
        assert_eq!(number(0.005), "0.005");
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(-2.5), "-2.5");
        assert_eq!(number(f64::NAN), "NaN");
    }
}
