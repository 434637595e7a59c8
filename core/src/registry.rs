//! The plugin registry: every implementation is registered by name through `inventory`
//! (one [`PluginCrate`] record per crate) or handed over by a dynamically loaded library.
//!
//! Factories take their configuration as an erased-serde deserializer, so the same config
//! comes from CLI flags (the driver builds JSON), a JSON/TOML/YAML file, or a test. Configs
//! use `#[serde(deny_unknown_fields)]`: an unknown field is an error listing the known ones.
//! Plugins of a dynamically loaded library ([`crate::plugin_loader`]) run under its panic guard.

use crate::guarded_model::GuardedModel;
use crate::mlp_slot::{MlpFactory, MlpProvider};
use crate::plugin_loader::{LoadedLibrary, PanicGuard};
use crate::LrSchedule;
use crate::{
    Backend, Communicator, DatasetSplits, MetricsSink, Model, Optimizer, ParallelContext, ParallelStrategy, Result,
    Schedule, Tokenizer,
};
use anyhow::{anyhow, bail, Context};
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The erased deserializer a factory reads its config from.
pub type ConfigDe<'a, 'de> = &'a mut dyn erased_serde::Deserializer<'de>;

/// What a model factory gets besides its config.
#[derive(Clone)]
pub struct ModelEnv {
    pub backend: Arc<dyn Backend>,
    pub ctx: ParallelContext,
    /// Fills the MLP slots of transformer layers (`--num-experts` with the `moe` plugin);
    /// `None`: dense MLPs.
    pub mlp: Option<MlpProvider>,
}

/// What a dataset factory gets besides its config.
#[derive(Clone, Default)]
pub struct DatasetEnv {
    pub tokenizer: Option<Arc<dyn Tokenizer>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PluginKind {
    Backend,
    Communicator,
    ParallelStrategy,
    Model,
    Schedule,
    Optimizer,
    LrSchedule,
    Dataset,
    Tokenizer,
    MetricsSink,
    /// A module for the MLP slot of transformer layers (see [`crate::mlp_slot`]).
    Mlp,
}

impl PluginKind {
    pub const ALL: [PluginKind; 11] = [
        PluginKind::Backend,
        PluginKind::Communicator,
        PluginKind::ParallelStrategy,
        PluginKind::Model,
        PluginKind::Schedule,
        PluginKind::Optimizer,
        PluginKind::LrSchedule,
        PluginKind::Dataset,
        PluginKind::Tokenizer,
        PluginKind::MetricsSink,
        PluginKind::Mlp,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PluginKind::Backend => "backend",
            PluginKind::Communicator => "communicator",
            PluginKind::ParallelStrategy => "parallel-strategy",
            PluginKind::Model => "model",
            PluginKind::Schedule => "schedule",
            PluginKind::Optimizer => "optimizer",
            PluginKind::LrSchedule => "lr-schedule",
            PluginKind::Dataset => "dataset",
            PluginKind::Tokenizer => "tokenizer",
            PluginKind::MetricsSink => "metrics",
            PluginKind::Mlp => "mlp",
        }
    }

    pub fn parse(s: &str) -> Result<PluginKind> {
        PluginKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| anyhow!("unknown plugin kind `{s}`: expected one of {}", Self::names()))
    }

    fn names() -> String {
        PluginKind::ALL.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
    }
}

impl std::fmt::Display for PluginKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A communicator factory: one endpoint per rank of a world of `world_size` ranks.
pub type CommunicatorFactory = fn(ConfigDe, usize) -> Result<Vec<Arc<dyn Communicator>>>;

/// The constructor of a plugin, typed by kind.
#[derive(Clone, Copy)]
pub enum Factory {
    Backend(fn(ConfigDe) -> Result<Arc<dyn Backend>>),
    Communicator(CommunicatorFactory),
    ParallelStrategy(fn(ConfigDe) -> Result<Box<dyn ParallelStrategy>>),
    Model(fn(ConfigDe, &ModelEnv) -> Result<Box<dyn Model>>),
    Schedule(fn(ConfigDe) -> Result<Box<dyn Schedule>>),
    Optimizer(fn(ConfigDe) -> Result<Box<dyn Optimizer>>),
    LrSchedule(fn(ConfigDe) -> Result<Box<dyn LrSchedule>>),
    Dataset(fn(ConfigDe, &DatasetEnv) -> Result<DatasetSplits>),
    Tokenizer(fn(ConfigDe) -> Result<Arc<dyn Tokenizer>>),
    MetricsSink(fn(ConfigDe) -> Result<Box<dyn MetricsSink>>),
    Mlp(MlpFactory),
}

impl Factory {
    pub fn kind(&self) -> PluginKind {
        match self {
            Factory::Backend(_) => PluginKind::Backend,
            Factory::Communicator(_) => PluginKind::Communicator,
            Factory::ParallelStrategy(_) => PluginKind::ParallelStrategy,
            Factory::Model(_) => PluginKind::Model,
            Factory::Schedule(_) => PluginKind::Schedule,
            Factory::Optimizer(_) => PluginKind::Optimizer,
            Factory::LrSchedule(_) => PluginKind::LrSchedule,
            Factory::Dataset(_) => PluginKind::Dataset,
            Factory::Tokenizer(_) => PluginKind::Tokenizer,
            Factory::MetricsSink(_) => PluginKind::MetricsSink,
            Factory::Mlp(_) => PluginKind::Mlp,
        }
    }
}

/// One registered implementation.
#[derive(Clone, Copy)]
pub struct Plugin {
    pub name: &'static str,
    pub description: &'static str,
    pub factory: Factory,
}

/// The single `inventory` record of a plugin crate.
pub struct PluginCrate {
    pub crate_name: &'static str,
    pub version: &'static str,
    pub plugins: fn() -> Vec<Plugin>,
}

inventory::collect!(PluginCrate);

/// Where a registered plugin came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    BuiltIn,
    Library(String),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::BuiltIn => f.write_str("built-in"),
            Origin::Library(p) => f.write_str(p),
        }
    }
}

/// A registry entry.
#[derive(Clone)]
pub struct Entry {
    pub plugin: Plugin,
    pub crate_name: String,
    pub version: String,
    pub origin: Origin,
    /// Set for plugins of a dynamically loaded library: calls into them run under it.
    pub guard: Option<PanicGuard>,
}

/// Configuration fields that replace (merge over) what the caller passes to a kind's
/// factories, e.g. one section of `megatron pretrain --config FILE`.
#[derive(Clone, Debug, Default)]
pub struct ConfigOverride {
    /// Where the fields come from, for messages (`section `model` of `run.yaml``).
    pub source: String,
    /// The plugin the section is meant for; building another plugin of the kind is an error.
    pub name: Option<String>,
    pub fields: serde_json::Map<String, serde_json::Value>,
}

/// All plugins by `(kind, name)`.
#[derive(Clone, Default)]
pub struct Registry {
    entries: BTreeMap<(PluginKind, String), Entry>,
    overrides: BTreeMap<PluginKind, ConfigOverride>,
    /// What to do to get a plugin that is not registered (e.g. the Cargo feature to enable).
    hints: BTreeMap<(PluginKind, String), String>,
}

impl Registry {
    /// The plugins linked into this binary. Duplicate names are an error naming both crates.
    pub fn builtin() -> Result<Registry> {
        let mut reg = Registry::default();
        for krate in inventory::iter::<PluginCrate> {
            reg.add_crate(krate, Origin::BuiltIn)?;
        }
        Ok(reg)
    }

    /// Registers every plugin of `krate`.
    pub fn add_crate(&mut self, krate: &PluginCrate, origin: Origin) -> Result<()> {
        self.add_plugins(krate.crate_name, krate.version, (krate.plugins)(), origin, None)
    }

    /// Loads a plugin library (see [`crate::plugin_loader`]) and registers its plugins with the
    /// library path as origin. A name already registered (built in or by another library) is
    /// an error naming both crates.
    pub fn load_library(&mut self, path: &std::path::Path) -> Result<()> {
        let lib = crate::plugin_loader::load_plugin_library(path)?;
        self.add_library(&lib)
    }

    /// Registers the plugins of an already loaded library.
    pub fn add_library(&mut self, lib: &LoadedLibrary) -> Result<()> {
        for c in &lib.crates {
            let origin = Origin::Library(lib.path.clone());
            self.add_plugins(&c.crate_name, &c.version, c.plugins.clone(), origin, Some(lib.guard))?;
        }
        Ok(())
    }

    fn add_plugins(
        &mut self,
        crate_name: &str,
        version: &str,
        plugins: Vec<Plugin>,
        origin: Origin,
        guard: Option<PanicGuard>,
    ) -> Result<()> {
        for plugin in plugins {
            let key = (plugin.factory.kind(), plugin.name.to_string());
            if let Some(prev) = self.entries.get(&key) {
                bail!(
                    "duplicate {} plugin `{}`: registered by crate `{}` ({}) and by crate `{}` ({}); \
                     plugin names must be unique — rename one or disable its Cargo feature",
                    key.0,
                    plugin.name,
                    prev.crate_name,
                    prev.origin,
                    crate_name,
                    origin
                );
            }
            let entry = Entry {
                plugin,
                crate_name: crate_name.to_string(),
                version: version.to_string(),
                origin: origin.clone(),
                guard,
            };
            self.entries.insert(key, entry);
        }
        Ok(())
    }

    /// Fields merged over the config of every plugin of `kind` built from now on.
    pub fn set_override(&mut self, kind: PluginKind, config: ConfigOverride) {
        self.overrides.insert(kind, config);
    }

    /// Tells [`Registry::get`] how to obtain `name` when it is not registered.
    pub fn add_hint(&mut self, kind: PluginKind, name: &str, hint: impl Into<String>) {
        self.hints.insert((kind, name.to_string()), hint.into());
    }

    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    pub fn names(&self, kind: PluginKind) -> Vec<&str> {
        self.entries.keys().filter(|(k, _)| *k == kind).map(|(_, n)| n.as_str()).collect()
    }

    /// Looks up a plugin; the error lists what is registered and how to get more.
    pub fn get(&self, kind: PluginKind, name: &str) -> Result<&Entry> {
        self.entries.get(&(kind, name.to_string())).ok_or_else(|| {
            if let Some(hint) = self.hints.get(&(kind, name.to_string())) {
                return anyhow!("{kind} plugin `{name}` is not compiled into this build: {hint}");
            }
            let known = self.names(kind);
            anyhow!(
                "no {kind} plugin named `{name}` is registered (registered: {}); it may need a Cargo \
                 feature of the `megatron` package (rebuild with `--features ...`) or `--plugin LIB.so`",
                if known.is_empty() { "none".to_string() } else { known.join(", ") }
            )
        })
    }

    /// Looks `name` up, applies the kind's override to `config` and runs `build` on the
    /// factory (under the library's panic guard for a dynamically loaded plugin).
    fn build<T>(
        &self,
        kind: PluginKind,
        name: &str,
        config: serde_json::Value,
        build: impl FnOnce(Factory, ConfigDe) -> Result<T>,
    ) -> Result<T> {
        let entry = self.get(kind, name)?;
        let (config, source) = match self.overrides.get(&kind) {
            Some(o) => (apply_override(kind, name, config, o)?, Some(o.source.as_str())),
            None => (config, None),
        };
        let factory = entry.plugin.factory;
        let result = match entry.guard {
            None => with_config(config, |de| build(factory, de)),
            Some(guard) => guard
                .call(|| with_config(config, |de| build(factory, de)))
                .map_err(|m| anyhow!("plugin {kind} `{name}` from `{}` panicked in its factory: {m}", entry.origin))?,
        };
        match source {
            Some(src) => result.with_context(|| format!("with {src} applied")),
            None => result,
        }
    }

    pub fn backend(&self, name: &str, config: serde_json::Value) -> Result<Arc<dyn Backend>> {
        self.build(PluginKind::Backend, name, config, |f, de| match f {
            Factory::Backend(f) => f(de),
            _ => unreachable!("registry keys are kind-checked"),
        })
    }

    pub fn communicators(
        &self,
        name: &str,
        config: serde_json::Value,
        world: usize,
    ) -> Result<Vec<Arc<dyn Communicator>>> {
        self.build(PluginKind::Communicator, name, config, |f, de| match f {
            Factory::Communicator(f) => f(de, world),
            _ => unreachable!("registry keys are kind-checked"),
        })
    }

    pub fn strategy(&self, name: &str, config: serde_json::Value) -> Result<Box<dyn ParallelStrategy>> {
        self.build(PluginKind::ParallelStrategy, name, config, |f, de| match f {
            Factory::ParallelStrategy(f) => f(de),
            _ => unreachable!("registry keys are kind-checked"),
        })
    }

    /// Builds a model; one from a plugin library comes wrapped in a [`GuardedModel`].
    pub fn model(&self, name: &str, config: serde_json::Value, env: &ModelEnv) -> Result<Box<dyn Model>> {
        let model = self.build(PluginKind::Model, name, config, |f, de| match f {
            Factory::Model(f) => f(de, env),
            _ => unreachable!("registry keys are kind-checked"),
        })?;
        let entry = self.get(PluginKind::Model, name)?;
        Ok(match entry.guard {
            Some(guard) => Box::new(GuardedModel::new(model, guard, format!("model `{name}` from `{}`", entry.origin))),
            None => model,
        })
    }

    pub fn schedule(&self, name: &str, config: serde_json::Value) -> Result<Box<dyn Schedule>> {
        self.build(PluginKind::Schedule, name, config, |f, de| match f {
            Factory::Schedule(f) => f(de),
            _ => unreachable!("registry keys are kind-checked"),
        })
    }

    pub fn optimizer(&self, name: &str, config: serde_json::Value) -> Result<Box<dyn Optimizer>> {
        self.build(PluginKind::Optimizer, name, config, |f, de| match f {
            Factory::Optimizer(f) => f(de),
            _ => unreachable!("registry keys are kind-checked"),
        })
    }

    pub fn lr_schedule(&self, name: &str, config: serde_json::Value) -> Result<Box<dyn LrSchedule>> {
        self.build(PluginKind::LrSchedule, name, config, |f, de| match f {
            Factory::LrSchedule(f) => f(de),
            _ => unreachable!("registry keys are kind-checked"),
        })
    }

    pub fn dataset(&self, name: &str, config: serde_json::Value, env: &DatasetEnv) -> Result<DatasetSplits> {
        self.build(PluginKind::Dataset, name, config, |f, de| match f {
            Factory::Dataset(f) => f(de, env),
            _ => unreachable!("registry keys are kind-checked"),
        })
    }

    pub fn tokenizer(&self, name: &str, config: serde_json::Value) -> Result<Arc<dyn Tokenizer>> {
        self.build(PluginKind::Tokenizer, name, config, |f, de| match f {
            Factory::Tokenizer(f) => f(de),
            _ => unreachable!("registry keys are kind-checked"),
        })
    }

    pub fn metrics_sink(&self, name: &str, config: serde_json::Value) -> Result<Box<dyn MetricsSink>> {
        self.build(PluginKind::MetricsSink, name, config, |f, de| match f {
            Factory::MetricsSink(f) => f(de),
            _ => unreachable!("registry keys are kind-checked"),
        })
    }
}

impl Registry {
    /// Resolves the `mlp` plugin `name` with `config` (the override of kind `mlp` applied);
    /// the model factory builds one module per layer from it ([`MlpProvider::build`]).
    pub fn mlp_provider(&self, name: &str, config: serde_json::Value) -> Result<MlpProvider> {
        let entry = self.get(PluginKind::Mlp, name)?;
        let config = match self.overrides.get(&PluginKind::Mlp) {
            Some(o) => apply_override(PluginKind::Mlp, name, config, o)?,
            None => config,
        };
        let Factory::Mlp(factory) = entry.plugin.factory else { unreachable!("registry keys are kind-checked") };
        Ok(MlpProvider { name: name.to_string(), origin: entry.origin.clone(), config, factory, guard: entry.guard })
    }
}

/// `config` with the override's fields merged over it (the override wins).
fn apply_override(
    kind: PluginKind,
    name: &str,
    config: serde_json::Value,
    o: &ConfigOverride,
) -> Result<serde_json::Value> {
    if let Some(want) = o.name.as_deref().filter(|w| *w != name) {
        bail!("{} is for {kind} plugin `{want}`, but this run builds `{name}`: make them agree", o.source);
    }
    let mut map = match config {
        serde_json::Value::Object(map) => map,
        serde_json::Value::Null => serde_json::Map::new(),
        other => bail!("{kind} plugin `{name}` takes a non-object config ({other}); {} cannot apply", o.source),
    };
    for (k, v) in &o.fields {
        map.insert(k.clone(), v.clone());
    }
    Ok(serde_json::Value::Object(map))
}

/// Runs `f` with an erased deserializer over a JSON config.
pub fn with_config<T>(config: serde_json::Value, f: impl FnOnce(ConfigDe) -> Result<T>) -> Result<T> {
    let mut de = <dyn erased_serde::Deserializer>::erase(config);
    f(&mut de)
}

/// Deserializes a plugin's config; the error names the plugin (and, with
/// `deny_unknown_fields`, the unknown field and the known ones).
pub fn parse_config<T: DeserializeOwned>(de: ConfigDe, plugin: &str) -> Result<T> {
    erased_serde::deserialize(de).map_err(|e| anyhow!("invalid configuration for plugin `{plugin}`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_override(name: Option<&str>) -> ConfigOverride {
        let fields = serde_json::json!({ "b": 20, "c": 3 }).as_object().cloned().unwrap_or_default();
        ConfigOverride {
            source: "section `model` of --config file `x.yaml`".into(),
            name: name.map(Into::into),
            fields,
        }
    }

    #[test]
    fn an_override_is_merged_over_the_config_and_wins() -> Result<()> {
        let merged =
            apply_override(PluginKind::Model, "gpt", serde_json::json!({ "a": 1, "b": 2 }), &config_override(None))?;
        assert_eq!(merged, serde_json::json!({ "a": 1, "b": 20, "c": 3 }));
        let merged = apply_override(PluginKind::Model, "gpt", serde_json::Value::Null, &config_override(Some("gpt")))?;
        assert_eq!(merged, serde_json::json!({ "b": 20, "c": 3 }));
        Ok(())
    }

    #[test]
    fn an_override_for_another_plugin_is_an_error() {
        let err = apply_override(PluginKind::Model, "gpt", serde_json::json!({}), &config_override(Some("other")));
        let msg = err.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("is for model plugin `other`, but this run builds `gpt`"), "{msg}");
    }

    #[test]
    fn a_hint_replaces_the_generic_not_found_message() {
        let mut reg = Registry::default();
        reg.add_hint(PluginKind::Model, "gpt", "rebuild with --features gpt");
        let msg = reg.get(PluginKind::Model, "gpt").err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(msg, "model plugin `gpt` is not compiled into this build: rebuild with --features gpt");
        let msg = reg.get(PluginKind::Model, "bert").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("no model plugin named `bert`") && msg.contains("registered: none"), "{msg}");
    }
}
