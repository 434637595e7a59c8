//! `metadata.json`: what the driver knows about the run ([`CheckpointMeta`]) plus the tensor
//! index (global shape and shard slices of every tensor), format name and version.

use anyhow::{anyhow, bail, Context, Result};
use megatron_core::DType;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// The `format` field of every megatron-rs checkpoint.
pub const FORMAT: &str = "megatron-rs";
/// The only version this build writes and reads. Bump on any incompatible change.
pub const FORMAT_VERSION: u64 = 1;
/// Name of the metadata file inside an iteration directory.
pub const METADATA_FILE: &str = "metadata.json";
/// Prefix of optimizer-state tensor names: `optimizer.{param}.{state}`.
pub const OPTIMIZER_PREFIX: &str = "optimizer.";

/// Run state the driver fills in before saving and reads back after loading; stored verbatim
/// at the top level of `metadata.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    pub consumed_train_samples: u64,
    #[serde(default)]
    pub skipped_train_samples: u64,
    pub consumed_valid_samples: u64,
    /// The run's configuration (Megatron's `args`), for shape checks and `--use-checkpoint-args`.
    #[serde(default)]
    pub args: Value,
    /// [`megatron_core::LrSchedule::state_dict`].
    #[serde(default)]
    pub lr_scheduler: Value,
    /// RNG states (seeds, stream positions) of the run.
    #[serde(default)]
    pub rng: Value,
    #[serde(default)]
    pub tokenizer_fingerprint: Option<String>,
    #[serde(default)]
    pub num_floating_point_operations_so_far: f64,
}

/// One stored slice of a tensor: `shape` elements starting at `offset` of the global tensor,
/// held under the tensor's name in the safetensors file `file` (or under `key`: the blocks of
/// a chunked parameter, `{name}#{block}`, several slices of one tensor in one file).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    pub file: String,
    pub offset: Vec<usize>,
    pub shape: Vec<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl ShardEntry {
    /// The safetensors key of this slice of tensor `name`.
    pub fn key<'a>(&'a self, name: &'a str) -> &'a str {
        self.key.as_deref().unwrap_or(name)
    }
}

/// A tensor of the checkpoint: its element type (safetensors name), global shape and shards.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorEntry {
    pub dtype: String,
    pub global_shape: Vec<usize>,
    pub shards: Vec<ShardEntry>,
}

/// The parallel layout the checkpoint was saved with (informational: any layout can load it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedParallel {
    pub tp: usize,
    pub pp: usize,
    pub dp: usize,
    #[serde(default = "one")]
    pub cp: usize,
}

fn one() -> usize {
    1
}

/// The whole `metadata.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMetadata {
    pub format: String,
    pub format_version: u64,
    pub iteration: u64,
    #[serde(flatten)]
    pub meta: CheckpointMeta,
    /// Optimizer scalars ([`megatron_core::OptimizerState::scalars`]).
    pub optimizer: Value,
    /// False when saved without optimizer state (`--no-save-optim`); then `optimizer` is null
    /// and there are no `optimizer.*` tensors.
    pub optimizer_saved: bool,
    pub tensors: BTreeMap<String, TensorEntry>,
    pub parallel: SavedParallel,
}

impl CheckpointMetadata {
    /// Parses `text` read from `path`, checking format and version before anything else so
    /// a checkpoint from another tool or a newer release gets a clear error.
    pub fn parse(text: &str, path: &Path) -> Result<CheckpointMetadata> {
        let value: Value = serde_json::from_str(text)
            .with_context(|| format!("{} is not valid JSON (corrupted checkpoint metadata)", path.display()))?;
        let format = value.get("format").and_then(Value::as_str);
        if format != Some(FORMAT) {
            bail!(
                "{} is not a megatron-rs checkpoint: field `format` is {}, expected \"{FORMAT}\" \
                 (Megatron-LM torch/torch_dist checkpoints must be converted first)",
                path.display(),
                value.get("format").map_or("missing".to_string(), |f| f.to_string())
            );
        }
        match value.get("format_version").and_then(Value::as_u64) {
            Some(FORMAT_VERSION) => {}
            Some(v) if v > FORMAT_VERSION => bail!(
                "{} has checkpoint format version {v}, but this build of megatron-rs reads only version \
                 {FORMAT_VERSION}: load it with the newer megatron-rs that wrote it",
                path.display()
            ),
            other => bail!(
                "{}: unknown checkpoint format version {} (this build reads version {FORMAT_VERSION})",
                path.display(),
                other.map_or("(missing)".to_string(), |v| v.to_string())
            ),
        }
        serde_json::from_value(value).with_context(|| format!("{}: malformed checkpoint metadata", path.display()))
    }
}

/// Every dtype a checkpoint may hold.
const ALL_DTYPES: [DType; 7] = [DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8, DType::U16];

/// The [`DType`] whose [`DType::safetensors_name`] is `name`.
pub fn dtype_from_safetensors_name(name: &str) -> Result<DType> {
    ALL_DTYPES.into_iter().find(|d| d.safetensors_name() == name).ok_or_else(|| {
        let known: Vec<&str> = ALL_DTYPES.iter().map(|d| d.safetensors_name()).collect();
        anyhow!("unsupported tensor dtype `{name}` (megatron-rs stores {})", known.join(", "))
    })
}

/// The safetensors crate's enum for `d`.
pub fn to_safetensors_dtype(d: DType) -> safetensors::Dtype {
    match d {
        DType::F32 => safetensors::Dtype::F32,
        DType::BF16 => safetensors::Dtype::BF16,
        DType::F16 => safetensors::Dtype::F16,
        DType::I32 => safetensors::Dtype::I32,
        DType::I64 => safetensors::Dtype::I64,
        DType::U8 => safetensors::Dtype::U8,
        DType::U16 => safetensors::Dtype::U16,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CheckpointMetadata {
        CheckpointMetadata {
            format: FORMAT.into(),
            format_version: FORMAT_VERSION,
            iteration: 7,
            meta: CheckpointMeta { consumed_train_samples: 56, ..Default::default() },
            optimizer: serde_json::json!({"steps": 7}),
            optimizer_saved: true,
            tensors: BTreeMap::new(),
            parallel: SavedParallel { tp: 1, pp: 1, dp: 1, cp: 1 },
        }
    }

    #[test]
    fn round_trips_with_flat_layout() {
        let m = sample();
        let text = serde_json::to_string(&m).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        // The driver's fields sit at the top level, as documented.
        assert_eq!(v["consumed_train_samples"], 56);
        assert_eq!(CheckpointMetadata::parse(&text, Path::new("m.json")).unwrap(), m);
    }

    #[test]
    fn rejects_other_formats_and_versions() {
        let mut v = serde_json::to_value(sample()).unwrap();
        v["format_version"] = 2.into();
        let err = CheckpointMetadata::parse(&v.to_string(), Path::new("x/metadata.json")).unwrap_err().to_string();
        assert!(err.contains("version 2") && err.contains("x/metadata.json"), "{err}");
        v["format"] = "torch_dist".into();
        let err = CheckpointMetadata::parse(&v.to_string(), Path::new("m")).unwrap_err().to_string();
        assert!(err.contains("not a megatron-rs checkpoint"), "{err}");
        let err = CheckpointMetadata::parse("{", Path::new("m")).unwrap_err().to_string();
        assert!(err.contains("not valid JSON"), "{err}");
    }

    #[test]
    fn dtype_names_round_trip() {
        for d in ALL_DTYPES {
            assert_eq!(dtype_from_safetensors_name(d.safetensors_name()).unwrap(), d);
            assert_eq!(format!("{:?}", to_safetensors_dtype(d)), d.safetensors_name());
        }
        assert!(dtype_from_safetensors_name("F64").is_err());
    }
}
