//! The `tensorboard` metrics sink: a TensorBoard event file written without TensorFlow.
//!
//! The file is `DIR/events.out.tfevents.{unix_secs}.{hostname}.megatron-rs`, a TFRecord
//! stream of `Event` protos: first the `brain.Event:2` file version, then one event per
//! scalar. Like Megatron (SPEC §6.14) every scalar is also written as "`{tag} vs samples`"
//! with the consumed-samples count as its step (except timers: [`MetricsSink::scalar_at_step`]).
//! Text summaries (the run's arguments) are written as torch's `add_text` writes them.

use crate::event_proto::{Event, EventKind, ScalarValue, TextValue};
use crate::tfrecord::write_record;
use anyhow::{Context, Result};
use megatron_core::MetricsSink;
use serde::Deserialize;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// Config of the `tensorboard` plugin.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorBoardConfig {
    /// Log directory (`--tensorboard-dir`); created if missing.
    pub dir: PathBuf,
}

pub struct TensorBoardSink {
    path: PathBuf,
    out: BufWriter<File>,
}

impl TensorBoardSink {
    pub fn new(config: TensorBoardConfig) -> Result<TensorBoardSink> {
        let dir = config.dir;
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("tensorboard: cannot create log directory {}", dir.display()))?;
        let now = wall_time();
        let base = format!("events.out.tfevents.{}.{}.megatron-rs", now as u64, hostname());
        let (path, file) = create_unique(&dir, &base)?;
        let mut sink = TensorBoardSink { path, out: BufWriter::new(file) };
        sink.write_event(&Event { wall_time: now, step: 0, kind: EventKind::FileVersion("brain.Event:2".into()) })?;
        sink.flush()?;
        Ok(sink)
    }

    /// The event file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write_event(&mut self, event: &Event) -> Result<()> {
        write_record(&mut self.out, &event.encode())
            .with_context(|| format!("tensorboard: cannot write to {}", self.path.display()))
    }

    fn write_scalar(&mut self, tag: String, value: f64, step: u64) -> Result<()> {
        // The proto field is a float: TensorBoard scalars are f32.
        let value = ScalarValue { tag, simple_value: value as f32 };
        let step = i64::try_from(step).unwrap_or(i64::MAX);
        self.write_event(&Event { wall_time: wall_time(), step, kind: EventKind::Summary(vec![value]) })
    }
}

impl MetricsSink for TensorBoardSink {
    fn name(&self) -> &str {
        "tensorboard"
    }

    fn scalar(&mut self, tag: &str, value: f64, step: u64, samples: u64) -> Result<()> {
        self.write_scalar(tag.to_string(), value, step)?;
        self.write_scalar(format!("{tag} vs samples"), value, samples)
    }

    fn scalar_at_step(&mut self, tag: &str, value: f64, step: u64) -> Result<()> {
        self.write_scalar(tag.to_string(), value, step)
    }

    fn text(&mut self, tag: &str, text: &str, step: u64) -> Result<()> {
        // torch's `SummaryWriter.add_text` stores the tag as `{tag}/text_summary`.
        let value = TextValue { tag: format!("{tag}/text_summary"), text: text.to_string() };
        let step = i64::try_from(step).unwrap_or(i64::MAX);
        self.write_event(&Event { wall_time: wall_time(), step, kind: EventKind::Text(value) })
    }

    fn flush(&mut self) -> Result<()> {
        self.out.flush().with_context(|| format!("tensorboard: cannot write to {}", self.path.display()))?;
        self.out.get_ref().sync_data().with_context(|| format!("tensorboard: cannot sync {}", self.path.display()))
    }
}

/// Creates `dir/base`, or `dir/base.1`, ... when two writers start in the same second (the
/// name still contains `tfevents`, which is all TensorBoard looks for).
fn create_unique(dir: &Path, base: &str) -> Result<(PathBuf, File)> {
    for n in 0..1000 {
        let name = if n == 0 { base.to_string() } else { format!("{base}.{n}") };
        let path = dir.join(name);
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(f) => return Ok((path, f)),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("tensorboard: cannot create {}", path.display())),
        }
    }
    anyhow::bail!("tensorboard: 1000 event files named {base}.* already exist in {}", dir.display())
}

fn wall_time() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// The host name (TensorBoard's file naming convention), restricted to file-name-safe
/// characters. std has no hostname call, so read it from the kernel.
fn hostname() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let clean: String =
        raw.trim().chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')).collect();
    if clean.is_empty() {
        "localhost".to_string()
    } else {
        clean
    }
}
