//! The plugin registry: every implementation is registered by name through `inventory`
//! (one [`PluginCrate`] record per crate) or handed over by a dynamically loaded library.
//!
//! Factories take their configuration as an erased-serde deserializer, so the same config
//! comes from CLI flags (the driver builds JSON), a JSON/TOML/YAML file, or a test. Configs
//! use `#[serde(deny_unknown_fields)]`: an unknown field is an error listing the known ones.

use crate::LrSchedule;
use crate::{
    Backend, Communicator, DatasetSplits, MetricsSink, Model, Optimizer, ParallelContext, ParallelStrategy, Result,
    Schedule, Tokenizer,
};
use anyhow::{anyhow, bail};
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
}

impl PluginKind {
    pub const ALL: [PluginKind; 10] = [
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
}

/// All plugins by `(kind, name)`.
#[derive(Clone, Default)]
pub struct Registry {
    entries: BTreeMap<(PluginKind, String), Entry>,
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
        for plugin in (krate.plugins)() {
            let key = (plugin.factory.kind(), plugin.name.to_string());
            if let Some(prev) = self.entries.get(&key) {
                bail!(
                    "duplicate {} plugin `{}`: registered by crate `{}` ({}) and by crate `{}` ({}); \
                     plugin names must be unique — rename one or disable its Cargo feature",
                    key.0,
                    plugin.name,
                    prev.crate_name,
                    prev.origin,
                    krate.crate_name,
                    origin
                );
            }
            let entry = Entry {
                plugin,
                crate_name: krate.crate_name.to_string(),
                version: krate.version.to_string(),
                origin: origin.clone(),
            };
            self.entries.insert(key, entry);
        }
        Ok(())
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
            let known = self.names(kind);
            anyhow!(
                "no {kind} plugin named `{name}` is registered (registered: {}); it may need a Cargo \
                 feature of the `megatron` package (rebuild with `--features ...`) or `--plugin LIB.so`",
                if known.is_empty() { "none".to_string() } else { known.join(", ") }
            )
        })
    }

    pub fn backend(&self, name: &str, config: serde_json::Value) -> Result<Arc<dyn Backend>> {
        match self.get(PluginKind::Backend, name)?.plugin.factory {
            Factory::Backend(f) => with_config(config, |de| f(de)),
            _ => unreachable!("registry keys are kind-checked"),
        }
    }

    pub fn communicators(
        &self,
        name: &str,
        config: serde_json::Value,
        world: usize,
    ) -> Result<Vec<Arc<dyn Communicator>>> {
        match self.get(PluginKind::Communicator, name)?.plugin.factory {
            Factory::Communicator(f) => with_config(config, |de| f(de, world)),
            _ => unreachable!("registry keys are kind-checked"),
        }
    }

    pub fn strategy(&self, name: &str, config: serde_json::Value) -> Result<Box<dyn ParallelStrategy>> {
        match self.get(PluginKind::ParallelStrategy, name)?.plugin.factory {
            Factory::ParallelStrategy(f) => with_config(config, |de| f(de)),
            _ => unreachable!("registry keys are kind-checked"),
        }
    }

    pub fn model(&self, name: &str, config: serde_json::Value, env: &ModelEnv) -> Result<Box<dyn Model>> {
        match self.get(PluginKind::Model, name)?.plugin.factory {
            Factory::Model(f) => with_config(config, |de| f(de, env)),
            _ => unreachable!("registry keys are kind-checked"),
        }
    }

    pub fn schedule(&self, name: &str, config: serde_json::Value) -> Result<Box<dyn Schedule>> {
        match self.get(PluginKind::Schedule, name)?.plugin.factory {
            Factory::Schedule(f) => with_config(config, |de| f(de)),
            _ => unreachable!("registry keys are kind-checked"),
        }
    }

    pub fn optimizer(&self, name: &str, config: serde_json::Value) -> Result<Box<dyn Optimizer>> {
        match self.get(PluginKind::Optimizer, name)?.plugin.factory {
            Factory::Optimizer(f) => with_config(config, |de| f(de)),
            _ => unreachable!("registry keys are kind-checked"),
        }
    }

    pub fn lr_schedule(&self, name: &str, config: serde_json::Value) -> Result<Box<dyn LrSchedule>> {
        match self.get(PluginKind::LrSchedule, name)?.plugin.factory {
            Factory::LrSchedule(f) => with_config(config, |de| f(de)),
            _ => unreachable!("registry keys are kind-checked"),
        }
    }

    pub fn dataset(&self, name: &str, config: serde_json::Value, env: &DatasetEnv) -> Result<DatasetSplits> {
        match self.get(PluginKind::Dataset, name)?.plugin.factory {
            Factory::Dataset(f) => with_config(config, |de| f(de, env)),
            _ => unreachable!("registry keys are kind-checked"),
        }
    }

    pub fn tokenizer(&self, name: &str, config: serde_json::Value) -> Result<Arc<dyn Tokenizer>> {
        match self.get(PluginKind::Tokenizer, name)?.plugin.factory {
            Factory::Tokenizer(f) => with_config(config, |de| f(de)),
            _ => unreachable!("registry keys are kind-checked"),
        }
    }

    pub fn metrics_sink(&self, name: &str, config: serde_json::Value) -> Result<Box<dyn MetricsSink>> {
        match self.get(PluginKind::MetricsSink, name)?.plugin.factory {
            Factory::MetricsSink(f) => with_config(config, |de| f(de)),
            _ => unreachable!("registry keys are kind-checked"),
        }
    }
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
