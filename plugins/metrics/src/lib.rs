//! Metrics sinks (SPEC §6.14): `jsonl` (one JSON line per scalar) and `tensorboard` (event
//! files in TFRecord framing, hand-encoded protobuf, no TensorFlow dependency).
//!
//! The console log line is the driver's (SPEC §6.10); these sinks receive the same scalars.

pub mod crc32c;
pub mod event_proto;
pub mod jsonl;
pub mod tensorboard;
pub mod tfrecord;

pub use jsonl::{JsonlConfig, JsonlSink};
pub use tensorboard::{TensorBoardConfig, TensorBoardSink};

use megatron_core::registry::{parse_config, ConfigDe};
use megatron_core::{Factory, MetricsSink, Plugin, Result};

fn make_jsonl(de: ConfigDe) -> Result<Box<dyn MetricsSink>> {
    Ok(Box::new(JsonlSink::new(parse_config(de, "jsonl")?)?))
}

fn make_tensorboard(de: ConfigDe) -> Result<Box<dyn MetricsSink>> {
    Ok(Box::new(TensorBoardSink::new(parse_config(de, "tensorboard")?)?))
}

/// Every plugin of this crate.
pub fn plugins() -> Vec<Plugin> {
    vec![
        Plugin {
            name: "jsonl",
            description: "appends {iteration, consumed_samples, tag, value} lines to a JSONL file (config: path)",
            factory: Factory::MetricsSink(make_jsonl),
        },
        Plugin {
            name: "tensorboard",
            description: "TensorBoard event file with every scalar and its `vs samples` series (config: dir)",
            factory: Factory::MetricsSink(make_tensorboard),
        },
    ]
}

megatron_core::inventory::submit! {
    megatron_core::PluginCrate { crate_name: env!("CARGO_PKG_NAME"), version: env!("CARGO_PKG_VERSION"), plugins }
}
