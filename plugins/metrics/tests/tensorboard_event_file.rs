//! The TensorBoard sink's file read back with this crate's own TFRecord/protobuf reader, and
//! the sinks built through the plugin registry.

use megatron_core::{MetricsSink, PluginKind, Registry};
use megatron_metrics::event_proto::{Event, EventKind};
use megatron_metrics::tfrecord::read_records;
use megatron_metrics::{TensorBoardConfig, TensorBoardSink};

fn events_of(path: &std::path::Path) -> Vec<Event> {
    let bytes = std::fs::read(path).unwrap();
    read_records(&bytes).unwrap().iter().map(|r| Event::decode(r).unwrap()).collect()
}

/// `(tag, step, value)` of every scalar event.
fn scalars(events: &[Event]) -> Vec<(String, i64, f32)> {
    let mut out = Vec::new();
    for e in events {
        if let EventKind::Summary(values) = &e.kind {
            for v in values {
                out.push((v.tag.clone(), e.step, v.simple_value));
            }
        }
    }
    out
}

#[test]
fn event_file_holds_file_version_and_both_series() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tb");
    let mut sink = TensorBoardSink::new(TensorBoardConfig { dir: dir.clone() }).unwrap();
    let name = sink.path().file_name().unwrap().to_string_lossy().to_string();
    assert!(name.starts_with("events.out.tfevents.") && name.ends_with(".megatron-rs"), "{name}");
    assert_eq!(sink.path().parent().unwrap(), dir);

    let logged = [(1u64, 32u64, 10.5f64), (2, 64, 9.25), (3, 96, 8.0)];
    for &(step, samples, loss) in &logged {
        sink.scalar("lm loss", loss, step, samples).unwrap();
        sink.scalar("learning-rate", 1e-4 * step as f64, step, samples).unwrap();
    }
    sink.flush().unwrap();

    let events = events_of(sink.path());
    assert_eq!(events[0].kind, EventKind::FileVersion("brain.Event:2".into()));
    assert!(events[0].wall_time > 1.0e9, "wall time is unix seconds");
    let got = scalars(&events);
    assert_eq!(got.len(), logged.len() * 4, "two tags, each with its `vs samples` series");
    for &(step, samples, loss) in &logged {
        let find = |tag: &str, s: u64| got.iter().find(|(t, st, _)| t == tag && *st == s as i64).map(|x| x.2);
        assert_eq!(find("lm loss", step), Some(loss as f32));
        assert_eq!(find("lm loss vs samples", samples), Some(loss as f32));
        assert_eq!(find("learning-rate", step), Some((1e-4 * step as f64) as f32));
        assert_eq!(find("learning-rate vs samples", samples), Some((1e-4 * step as f64) as f32));
    }
}

#[test]
fn two_sinks_in_one_directory_get_distinct_files() {
    let tmp = tempfile::tempdir().unwrap();
    let a = TensorBoardSink::new(TensorBoardConfig { dir: tmp.path().to_path_buf() }).unwrap();
    let b = TensorBoardSink::new(TensorBoardConfig { dir: tmp.path().to_path_buf() }).unwrap();
    assert_ne!(a.path(), b.path());
}

#[test]
fn registry_builds_both_sinks_and_rejects_unknown_fields() {
    let reg = Registry::builtin().unwrap();
    let names = reg.names(PluginKind::MetricsSink);
    assert!(names.contains(&"jsonl") && names.contains(&"tensorboard"), "{names:?}");

    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("m.jsonl");
    let mut sink = reg.metrics_sink("jsonl", serde_json::json!({ "path": path })).unwrap();
    sink.scalar("x", 1.0, 1, 8).unwrap();
    sink.flush().unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 1);

    let mut tb = reg.metrics_sink("tensorboard", serde_json::json!({ "dir": tmp.path().join("tb") })).unwrap();
    tb.scalar("x", 1.0, 1, 8).unwrap();
    tb.flush().unwrap();

    let err = reg.metrics_sink("jsonl", serde_json::json!({ "path": path, "colour": 1 })).err().unwrap().to_string();
    assert!(err.contains("jsonl") && err.contains("colour"), "{err}");
    let err = reg.metrics_sink("tensorboard", serde_json::json!({})).err().unwrap().to_string();
    assert!(err.contains("dir"), "{err}");
}
