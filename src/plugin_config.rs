//! `megatron pretrain --config FILE`: plugin configurations from a JSON, TOML or YAML file
//! (chosen by extension), one section per plugin kind:
//!
//! ```yaml
//! model: {name: gpt, num_layers: 2, hidden_size: 64}
//! optimizer: {name: adam, beta2: 0.95}
//! ```
//!
//! A section's fields are merged over the config the driver derives from the flags, and the
//! file wins (clap cannot tell a flag's default from a value the user typed, so "flags win"
//! would let every default override the file). A section's `name` picks the plugin: for
//! `model`, `optimizer`, `backend` and `tokenizer` it replaces `--model`, `--optimizer`,
//! `--backend` and `--tokenizer-type`; for the other kinds it must equal the plugin the
//! driver builds. The merged config goes through the plugin's `deny_unknown_fields` struct,
//! so an unknown field fails with serde's "expected one of" list, the file and the section.
//! Driver flags (batch sizes, iterations, and the model-shape flags clap requires) still come
//! from the command line.

use crate::args::PretrainArgs;
use anyhow::{anyhow, bail, Context, Result};
use megatron_core::registry::ConfigOverride;
use megatron_core::{PluginKind, Registry};
use serde_json::{Map, Value};
use std::path::Path;

/// The kinds a file may configure (metrics sinks come from `--tensorboard-dir` and
/// `--metrics-jsonl`, several at a time, so they have no single section).
const SECTION_KINDS: [PluginKind; 9] = [
    PluginKind::Backend,
    PluginKind::Communicator,
    PluginKind::ParallelStrategy,
    PluginKind::Model,
    PluginKind::Schedule,
    PluginKind::Optimizer,
    PluginKind::LrSchedule,
    PluginKind::Dataset,
    PluginKind::Tokenizer,
];

/// Reads a config file into its top-level sections.
pub fn read_config_file(path: &Path) -> Result<Map<String, Value>> {
    let shown = path.display();
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read --config file `{shown}`"))?;
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    let value: Value = match ext.as_str() {
        "json" => serde_json::from_str(&text).map_err(|e| anyhow!("--config file `{shown}` is not valid JSON: {e}"))?,
        "toml" => toml::from_str(&text).map_err(|e| anyhow!("--config file `{shown}` is not valid TOML: {e}"))?,
        "yaml" | "yml" => {
            serde_yaml_ng::from_str(&text).map_err(|e| anyhow!("--config file `{shown}` is not valid YAML: {e}"))?
        }
        _ => bail!("--config file `{shown}`: unknown extension; use .json, .toml, .yaml or .yml"),
    };
    match value {
        Value::Object(map) => Ok(map),
        Value::Null => Ok(Map::new()),
        other => bail!("--config file `{shown}` must be a mapping of sections (model, optimizer, ...), got {other}"),
    }
}

/// The section's kind (`lr_schedule` and `lr-schedule` both work).
fn section_kind(section: &str, path: &Path) -> Result<PluginKind> {
    let kind = PluginKind::parse(&section.replace('_', "-")).ok().filter(|k| SECTION_KINDS.contains(k));
    kind.ok_or_else(|| {
        let known: Vec<&str> = SECTION_KINDS.iter().map(|k| k.as_str()).collect();
        anyhow!("--config file `{}`: unknown section `{section}`; expected one of {}", path.display(), known.join(", "))
    })
}

/// Applies `args.config` (if any): returns the flags with the sections' plugin names applied
/// and a registry that merges the sections' fields into the factories' configs.
pub fn apply_config_file(args: &PretrainArgs, registry: &Registry) -> Result<(PretrainArgs, Registry)> {
    let (mut args, mut registry) = (args.clone(), registry.clone());
    let Some(path) = args.config.clone() else { return Ok((args, registry)) };
    for (section, value) in read_config_file(&path)? {
        let kind = section_kind(&section, &path)?;
        let source = format!("section `{section}` of --config file `{}`", path.display());
        let Value::Object(mut fields) = value else {
            bail!("{source} must be a mapping of config fields, got {value}");
        };
        let name = match fields.remove("name") {
            None => None,
            Some(Value::String(n)) => Some(n),
            Some(other) => bail!("{source}: `name` must be a string (a plugin name), got {other}"),
        };
        if let Some(n) = &name {
            match kind {
                PluginKind::Model => args.model = n.clone(),
                PluginKind::Optimizer => args.optimizer = n.clone(),
                PluginKind::Backend => args.backend = n.clone(),
                PluginKind::Tokenizer => args.tokenizer.tokenizer_type = Some(n.clone()),
                _ => {}
            }
        }
        let keys: Vec<&str> = fields.keys().map(String::as_str).collect();
        println!(" > {source}: {} {}", name.as_deref().unwrap_or("(plugin from flags)"), keys.join(", "));
        registry.set_override(kind, ConfigOverride { source, name, fields });
    }
    Ok((args, registry))
}
