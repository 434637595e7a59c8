//! The `jsonl` metrics sink: one JSON object per line and per scalar, appended to a file.
//!
//! Line format: `{"iteration": 10, "consumed_samples": 320, "tag": "lm loss", "value": 2.5}`.
//! Appending (never truncating) keeps the history of a resumed run in the same file.

use anyhow::{Context, Result};
use megatron_core::MetricsSink;
use serde::Deserialize;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Config of the `jsonl` plugin.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonlConfig {
    /// File to append to; parent directories are created.
    pub path: PathBuf,
}

pub struct JsonlSink {
    path: PathBuf,
    out: BufWriter<File>,
}

impl JsonlSink {
    pub fn new(config: JsonlConfig) -> Result<JsonlSink> {
        let path = config.path;
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("jsonl metrics: cannot create directory {}", parent.display()))?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("jsonl metrics: cannot open {} for appending", path.display()))?;
        Ok(JsonlSink { path, out: BufWriter::new(file) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// JSON has no NaN or infinity; write them as the strings JavaScript and Python's `float()`
/// parse, so a diverged loss stays visible instead of becoming `null`.
fn json_number(v: f64) -> serde_json::Value {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        v.into()
    }
}

impl MetricsSink for JsonlSink {
    fn name(&self) -> &str {
        "jsonl"
    }

    fn scalar(&mut self, tag: &str, value: f64, step: u64, samples: u64) -> Result<()> {
        let line = serde_json::json!({
            "iteration": step,
            "consumed_samples": samples,
            "tag": tag,
            "value": json_number(value),
        });
        writeln!(self.out, "{line}").with_context(|| format!("jsonl metrics: cannot write to {}", self.path.display()))
    }

    fn scalar_at_step(&mut self, tag: &str, value: f64, step: u64) -> Result<()> {
        let line = serde_json::json!({ "iteration": step, "tag": tag, "value": json_number(value) });
        writeln!(self.out, "{line}").with_context(|| format!("jsonl metrics: cannot write to {}", self.path.display()))
    }

    fn flush(&mut self) -> Result<()> {
        self.out.flush().with_context(|| format!("jsonl metrics: cannot write to {}", self.path.display()))?;
        self.out.get_ref().sync_data().with_context(|| format!("jsonl metrics: cannot sync {}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_one_line_per_scalar_and_creates_parents() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("a/b/metrics.jsonl");
        let mut sink = JsonlSink::new(JsonlConfig { path: path.clone() }).unwrap();
        sink.scalar("lm loss", 2.5, 10, 320).unwrap();
        sink.scalar("grad-norm", f64::NAN, 10, 320).unwrap();
        sink.flush().unwrap();
        drop(sink);
        // A second sink (a resumed run) appends.
        let mut sink = JsonlSink::new(JsonlConfig { path: path.clone() }).unwrap();
        sink.scalar("lm loss", 2.25, 11, 352).unwrap();
        sink.flush().unwrap();

        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[0],
            serde_json::json!({"iteration": 10, "consumed_samples": 320, "tag": "lm loss", "value": 2.5})
        );
        assert_eq!(lines[1]["value"], "NaN");
        assert_eq!(lines[2]["iteration"], 11);
        assert_eq!(lines[2]["value"], 2.25);
    }
}
