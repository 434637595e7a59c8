//! End-to-end check of the event-file format with TensorBoard's own reader
//! (`EventAccumulator`). Skips with a message when the `tensorboard` Python package is absent.

use megatron_core::MetricsSink;
use megatron_metrics::{TensorBoardConfig, TensorBoardSink};
use std::process::Command;

const READER: &str = r#"
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1])
acc.Reload()
out = {}
for tag in acc.Tags()["scalars"]:
    out[tag] = [[e.step, e.value] for e in acc.Scalars(tag)]
print(json.dumps(out))
"#;

fn have_tensorboard() -> bool {
    Command::new("python3").args(["-c", "import tensorboard"]).output().map(|o| o.status.success()).unwrap_or(false)
}

#[test]
fn tensorboard_event_accumulator_reads_our_file() {
    if !have_tensorboard() {
        println!("SKIP: python3 with the `tensorboard` package is not available");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut sink = TensorBoardSink::new(TensorBoardConfig { dir: tmp.path().to_path_buf() }).unwrap();
    for step in 1..=3u64 {
        sink.scalar("lm loss", 10.0 / step as f64, step, step * 16).unwrap();
    }
    sink.flush().unwrap();
    drop(sink);

    let out = Command::new("python3").args(["-c", READER]).arg(tmp.path()).output().unwrap();
    assert!(out.status.success(), "python reader failed: {}", String::from_utf8_lossy(&out.stderr));
    let parsed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for step in 1..=3u64 {
        let v = (10.0 / step as f64) as f32 as f64;
        let i = (step - 1) as usize;
        assert_eq!(parsed["lm loss"][i], serde_json::json!([step, v]), "{parsed}");
        assert_eq!(parsed["lm loss vs samples"][i], serde_json::json!([step * 16, v]), "{parsed}");
    }
}
