//! What `pretrain --tensorboard-dir` writes, read back from the event file (issue 10):
//! Megatron's tags and flags, the learning rate after the scheduler step, `loss-scale`, the
//! arguments as text summaries, and the flag-gated tags.

mod common;

use megatron_metrics::event_proto::{Event, EventKind};
use megatron_metrics::tfrecord::read_records;
use std::collections::BTreeMap;
use std::path::Path;

/// `tag -> [(step, value)]` of the scalars and `tag -> text` of the text summaries.
type Logged = (BTreeMap<String, Vec<(i64, f32)>>, BTreeMap<String, String>);

fn read_dir(dir: &Path) -> Logged {
    let mut scalars: BTreeMap<String, Vec<(i64, f32)>> = BTreeMap::new();
    let mut texts = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        for record in read_records(&bytes).unwrap() {
            let e = Event::decode(&record).unwrap();
            match e.kind {
                EventKind::Summary(values) => {
                    for v in values {
                        scalars.entry(v.tag).or_default().push((e.step, v.simple_value));
                    }
                }
                EventKind::Text(t) => {
                    texts.insert(t.tag, t.text);
                }
                EventKind::FileVersion(_) => {}
            }
        }
    }
    (scalars, texts)
}

fn run(extra: &str) -> Logged {
    let dir = tempfile::tempdir().unwrap();
    let tb = dir.path().join("tb");
    let flags = common::tiny_with(&format!(
        "--train-iters 6 --eval-interval 3 --eval-iters 1 --log-interval 3 --tensorboard-dir {} {extra}",
        tb.display()
    ));
    common::pretrain(&flags).unwrap();
    read_dir(&tb)
}

#[test]
fn default_tags_follow_megatron() {
    let (scalars, texts) = run("");
    // Warmup over 3 iterations to --lr 3e-3: after the scheduler's step k the LR is k·1e-3.
    // Iteration 1 logs the LR after its step (1e-3, as the console does), not the 0 it used.
    let lr = &scalars["learning-rate"];
    assert_eq!(lr[0], (1, 1e-3f32), "{lr:?}");
    assert_eq!(lr[1], (2, 2e-3f32), "{lr:?}");
    assert_eq!(scalars["learning-rate vs samples"][0], (4, 1e-3f32));
    assert_eq!(scalars["loss-scale"], (1..=6).map(|i| (i, 1.0)).collect::<Vec<_>>());
    assert_eq!(scalars["loss-scale vs samples"].len(), 6);
    for tag in ["lm loss", "lm loss vs samples", "batch-size", "grad-norm", "lm loss validation"] {
        assert!(scalars.contains_key(tag), "missing {tag}: {:?}", scalars.keys());
    }
    // Behind flags in Megatron, so absent by default.
    for tag in ["lm loss validation ppl", "iteration-time", "throughput", "world-size"] {
        assert!(!scalars.contains_key(tag), "{tag} written without its flag");
    }
    // Every argument as text, Python's str() of the value.
    assert_eq!(texts["lr/text_summary"], "0.003");
    assert_eq!(texts["seed/text_summary"], "7");
    assert_eq!(texts["lr_decay_style/text_summary"], "cosine");
    assert_eq!(texts["log_validation_ppl_to_tensorboard/text_summary"], "False");
    assert!(texts.len() > 50, "{} text summaries", texts.len());
}

#[test]
fn flags_gate_the_optional_tags() {
    let (scalars, _) = run("--log-validation-ppl-to-tensorboard --log-timers-to-tensorboard --log-throughput \
         --log-world-size-to-tensorboard --no-log-loss-scale-to-tensorboard --tensorboard-log-interval 2");
    assert_eq!(scalars["lm loss validation ppl"].len(), 3, "{:?}", scalars["lm loss validation ppl"]);
    assert!(scalars.contains_key("lm loss validation ppl vs samples"));
    // Timers: at log intervals, against the iteration only.
    assert_eq!(scalars["iteration-time"].iter().map(|x| x.0).collect::<Vec<_>>(), [3, 6]);
    assert!(scalars.contains_key("throughput"));
    assert!(!scalars.contains_key("iteration-time vs samples"));
    assert_eq!(scalars["world-size"], [(2, 1.0), (4, 1.0), (6, 1.0)]);
    assert!(!scalars.contains_key("loss-scale"));
    // --tensorboard-log-interval 2: the per-iteration tags every 2nd iteration.
    assert_eq!(scalars["lm loss"].iter().map(|x| x.0).collect::<Vec<_>>(), [2, 4, 6]);
}
