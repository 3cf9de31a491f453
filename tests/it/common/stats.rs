//! Figures of the benchmarks: percentiles of samples and the one summary line each bench prints
//! (median, p90, max, sample count and the verdict against a target).

use std::time::Duration;

/// Milliseconds of a duration.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The `p` (0..=1) percentile of sorted samples by nearest rank; NaN when there are none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Sorts the samples and returns their median.
pub fn p50(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    percentile(samples, 0.5)
}

/// Median, p90 and max of a set of samples.
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    pub n: usize,
    pub median: f64,
    pub p90: f64,
    pub max: f64,
}

impl Summary {
    /// Sorts the samples and summarises them.
    pub fn of(samples: &mut [f64]) -> Self {
        samples.sort_by(f64::total_cmp);
        Self {
            n: samples.len(),
            median: percentile(samples, 0.5),
            p90: percentile(samples, 0.9),
            max: samples.last().copied().unwrap_or(f64::NAN),
        }
    }

    /// Summary of durations, in milliseconds.
    pub fn of_durations(samples: &[Duration]) -> Self {
        let mut ms: Vec<f64> = samples.iter().map(|d| ms(*d)).collect();
        Self::of(&mut ms)
    }

    /// "ok" / "MISSED" against a target for the median, "n/a" without samples, "" without a target.
    pub fn verdict(&self, target: Option<f64>) -> &'static str {
        match target {
            Some(_) if self.n == 0 => "n/a",
            Some(t) if self.median <= t => "ok",
            Some(_) => "MISSED",
            None => "",
        }
    }
}

/// The header of [`print_row`]'s table.
pub fn print_header() {
    println!("{:<36} {:>9} {:>9} {:>9} {:>8} {:>5}  verdict", "metric", "median", "p90", "max", "target", "n");
}

/// One line: name, median, p90, max (in `unit`), the target of the median and the verdict; also
/// recorded for the results file.
pub fn print_row(name: &str, unit: &str, summary: &Summary, target: Option<f64>) {
    let target_text = target.map_or("-".to_string(), |t| format!("{t}"));
    println!(
        "{:<36} {:>6.2} {:<2} {:>6.2} {:<2} {:>6.2} {:<2} {:>6} {:>5}  {}",
        name,
        summary.median,
        unit,
        summary.p90,
        unit,
        summary.max,
        unit,
        target_text,
        summary.n,
        summary.verdict(target)
    );
    super::results::row(name, unit, summary, target);
}
