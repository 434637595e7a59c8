//! `megatron finetune --dump-first-step FILE`: the first training step written out for a
//! comparison with another implementation (`scripts/bert_finetune_step_check.py` runs the same
//! step in transformers): the batch, the logits and mean loss, every parameter before the step,
//! every gradient before clipping, the gradient norm, the learning rate and every parameter
//! after the optimizer step, as f32 safetensors (ids and lengths stored as exact f32 integers).

use crate::hf::export::safetensors_bytes;
use crate::hf::files::write_synced;
use anyhow::{Context, Result};
use megatron_core::{Backend, Param};
use std::path::Path;

/// Tensors collected over one step: `(name, shape, values)`.
#[derive(Default)]
pub struct StepDump {
    tensors: Vec<(String, Vec<usize>, Vec<f32>)>,
}

impl StepDump {
    pub fn add(&mut self, name: &str, shape: &[usize], values: Vec<f32>) {
        self.tensors.push((name.to_string(), shape.to_vec(), values));
    }

    pub fn add_ints(&mut self, name: &str, shape: &[usize], values: impl IntoIterator<Item = i64>) {
        self.add(name, shape, values.into_iter().map(|v| v as f32).collect());
    }

    /// Every parameter's value (`grad = false`) or gradient under `prefix.<name>`.
    pub fn add_params(&mut self, prefix: &str, params: &[&Param], grad: bool, bk: &dyn Backend) -> Result<()> {
        for p in params {
            let t = if grad { &p.grad } else { &p.value };
            let v = bk.to_host(t)?.to_f32_vec();
            self.add(&format!("{prefix}.{}", p.name), t.shape(), v);
        }
        Ok(())
    }

    pub fn write(mut self, path: &Path) -> Result<()> {
        self.tensors.sort_by(|a, b| a.0.cmp(&b.0));
        let bytes = safetensors_bytes(&self.tensors)?;
        // Temp file + rename: a reader never sees half a dump.
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        write_synced(&tmp, &bytes).with_context(|| format!("writing the first-step dump {}", path.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
        println!("wrote the first training step to {} ({} tensors)", path.display(), self.tensors.len());
        Ok(())
    }
}
