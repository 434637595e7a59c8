//! The console output of training: Megatron's log line (SPEC §6.10), the validation block
//! (SPEC §6.11) and a progress indication.

use std::io::{IsTerminal, Write};

/// What one log line reports, averaged over the iterations since the last log.
pub struct LogLine {
    pub iteration: u64,
    pub train_iters: u64,
    pub consumed_samples: u64,
    pub elapsed_ms_per_iter: f64,
    pub tflops: f64,
    pub lr: f64,
    pub global_batch_size: usize,
    pub lm_loss: f64,
    pub loss_scale: f64,
    pub grad_norm: Option<f64>,
    pub skipped_iters: u64,
    pub nan_iters: u64,
}

impl LogLine {
    pub fn render(&self, timestamp: &str) -> String {
        let mut s = format!(" [{timestamp}] iteration {:8}/{:8} |", self.iteration, self.train_iters);
        s += &format!(" consumed samples: {:12} |", self.consumed_samples);
        s += &format!(" elapsed time per iteration (ms): {:.1} |", self.elapsed_ms_per_iter);
        s += &format!(" throughput per GPU (TFLOP/s/GPU): {:.1} |", self.tflops);
        s += &format!(" learning rate: {} |", sci(self.lr));
        s += &format!(" global batch size: {:5} |", self.global_batch_size);
        if self.lm_loss > 0.0 {
            s += &format!(" lm loss: {} |", sci(self.lm_loss));
        }
        s += &format!(" loss scale: {:.1} |", self.loss_scale);
        if let Some(g) = self.grad_norm {
            s += &format!(" grad norm: {g:.3} |");
        }
        s += &format!(" number of skipped iterations: {:3} |", self.skipped_iters);
        s += &format!(" number of nan iterations: {:3} |", self.nan_iters);
        s
    }
}

/// Python's `'{:.6E}'` (e.g. `5.000000E-05`): Rust's `{:E}` has no zero-padded exponent.
/// The model's own values ([`megatron_core::Model::take_metrics`]: MoE losses and expert
/// loads) averaged over the iterations of a log interval, appended to the log line.
#[derive(Default)]
pub struct ModelMetrics {
    sums: std::collections::BTreeMap<String, (f64, f64)>,
}

impl ModelMetrics {
    pub fn add(&mut self, values: Vec<(String, f64)>) {
        for (name, v) in values {
            let e = self.sums.entry(name).or_insert((0.0, 0.0));
            e.0 += v;
            e.1 += 1.0;
        }
    }

    pub fn averages(&self) -> Vec<(String, f64)> {
        self.sums.iter().map(|(k, (s, n))| (k.clone(), s / n.max(1.0))).collect()
    }

    /// ` name: value |` for each, in name order (empty without metrics).
    pub fn render(&self) -> String {
        self.averages().iter().map(|(k, v)| format!(" {k}: {} |", sci(*v))).collect()
    }
}

pub fn sci(x: f64) -> String {
    if x == 0.0 {
        return "0.000000E+00".into();
    }
    if !x.is_finite() {
        return format!("{x}");
    }
    let s = format!("{x:.6E}");
    match s.split_once('E') {
        Some((m, e)) => {
            let (sign, digits) = if let Some(d) = e.strip_prefix('-') { ('-', d) } else { ('+', e) };
            format!("{m}E{sign}{digits:0>2}")
        }
        None => s,
    }
}

/// The framed validation block of SPEC §6.11.
pub fn validation_block(label: &str, loss: f64) -> String {
    validation_block_with(label, loss, &[])
}

/// [`validation_block`] with the model's evaluation values after the `lm loss` (BERT's `sop
/// loss`): `{name} value: … | {name} PPL: … |` for each, as Megatron prints every loss key.
pub fn validation_block_with(label: &str, loss: f64, extra: &[(String, f64)]) -> String {
    let ppl = loss.min(20.0).exp();
    let mut line = format!(" validation loss at {label} | lm loss value: {} | lm loss PPL: {} | ", sci(loss), sci(ppl));
    for (name, v) in extra {
        line += &format!("{name} value: {} | {name} PPL: {} | ", sci(*v), sci(v.min(20.0).exp()));
    }
    let dashes = "-".repeat(line.len() + 1);
    format!("{dashes}\n{line}\n{dashes}")
}

/// Local time as `YYYY-MM-DD HH:MM:SS` (UTC; no timezone database needed).
pub fn timestamp() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86400, secs % 86400);
    let (y, m, d) = civil_from_days(days as i64);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", rem / 3600, (rem % 3600) / 60, rem % 60)
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// A one-line progress bar on stderr, only when stderr is a terminal (logs stay clean).
pub struct Progress {
    enabled: bool,
    start: std::time::Instant,
    first_iter: u64,
}

impl Progress {
    pub fn new(first_iter: u64) -> Progress {
        Progress { enabled: std::io::stderr().is_terminal(), start: std::time::Instant::now(), first_iter }
    }

    pub fn update(&self, iteration: u64, total: u64) {
        if !self.enabled || total == 0 {
            return;
        }
        let done = iteration.saturating_sub(self.first_iter).max(1) as f64;
        let per_iter = self.start.elapsed().as_secs_f64() / done;
        let eta = per_iter * total.saturating_sub(iteration) as f64;
        let width = 30usize;
        let filled = ((iteration as f64 / total as f64) * width as f64) as usize;
        let bar = format!("{}{}", "#".repeat(filled.min(width)), ".".repeat(width - filled.min(width)));
        let _ =
            write!(std::io::stderr(), "\r[{bar}] {iteration}/{total} iters, {:.2} s/iter, ETA {:.0} s ", per_iter, eta);
        let _ = std::io::stderr().flush();
    }

    pub fn clear(&self) {
        if self.enabled {
            let _ = write!(std::io::stderr(), "\r{}\r", " ".repeat(90));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_style_scientific() {
        assert_eq!(sci(5e-5), "5.000000E-05");
        assert_eq!(sci(6.123456), "6.123456E+00");
        assert_eq!(sci(228.6546), "2.286546E+02");
    }

    #[test]
    fn log_line_matches_megatron_fields() {
        let l = LogLine {
            iteration: 100,
            train_iters: 1000,
            consumed_samples: 25600,
            elapsed_ms_per_iter: 512.3,
            tflops: 1.25,
            lr: 5e-5,
            global_batch_size: 256,
            lm_loss: 6.123456,
            loss_scale: 1.0,
            grad_norm: Some(1.2344),
            skipped_iters: 0,
            nan_iters: 0,
        };
        let s = l.render("2025-01-01 12:00:00");
        assert!(s.starts_with(" [2025-01-01 12:00:00] iteration      100/    1000 | consumed samples:        25600 |"));
        assert!(s.contains(" learning rate: 5.000000E-05 | global batch size:   256 | lm loss: 6.123456E+00 |"));
        assert!(s.ends_with(" grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |"));
    }

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20089), (2025, 1, 1));
    }

    #[test]
    fn validation_frame() {
        let b = validation_block("iteration 1000", 5.4321);
        let lines: Vec<&str> = b.lines().collect();
        assert_eq!(lines[0].len(), lines[1].len() + 1);
        // exp(5.4321) = 228.6289 (Python: `%.6E` % math.exp(5.4321)).
        assert!(lines[1].contains("lm loss PPL: 2.286289E+02"), "{}", lines[1]);
    }
}
