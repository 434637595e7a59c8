//! Glue between the trainer and the checkpoint plugin: what a checkpoint stores (weights,
//! optimizer moments, LR-schedule state, counters, args, RNG seed) and Megatron's loading
//! semantics (SPEC §7.3): `--finetune` loads weights only and restarts at iteration 0,
//! `--no-load-optim` / `--no-load-rng` skip those parts, model-shape args must match.

use super::Trainer;
use crate::config::TrainConfig;
use anyhow::{bail, Context, Result};
use megatron_optim::LrFlags;
use serde_json::{json, Value};

/// The LR flags of `cfg` in the optimizer crate's terms.
pub fn lr_flags(cfg: &TrainConfig) -> LrFlags {
    let a = &cfg.args;
    LrFlags {
        lr: Some(a.lr),
        min_lr: a.min_lr,
        lr_warmup_init: a.lr_warmup_init,
        lr_decay_style: a.lr_decay_style.clone(),
        lr_wsd_decay_style: a.lr_wsd_decay_style.clone(),
        global_batch_size: cfg.global_batch_size as u64,
        train_iters: Some(a.train_iters),
        train_samples: None,
        lr_decay_iters: a.lr_decay_iters,
        lr_decay_samples: None,
        lr_warmup_fraction: a.lr_warmup_fraction,
        lr_warmup_iters: a.lr_warmup_iters,
        lr_warmup_samples: 0,
        lr_wsd_decay_iters: a.lr_wsd_decay_iters,
        lr_wsd_decay_samples: None,
        weight_decay: a.weight_decay,
        start_weight_decay: a.start_weight_decay,
        end_weight_decay: a.end_weight_decay,
        weight_decay_incr_style: a.weight_decay_incr_style.clone(),
        use_checkpoint_opt_param_scheduler: a.use_checkpoint_opt_param_scheduler,
    }
}

/// Model-shape args that must match between a checkpoint and the run loading it (SPEC §7.3).
const SHAPE_ARGS: [&str; 10] = [
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "ffn_hidden_size",
    "max_position_embeddings",
    "make_vocab_size_divisible_by",
    "swiglu",
    "position_embedding_type",
    "num_query_groups",
    "kv_channels",
];

impl Trainer {
    /// The mixed-precision parts of a loaded optimizer state (SPEC §6.7), so checkpoints move
    /// between fp32, bf16 and fp16 runs:
    /// * the loss scaler resumes from the stored `grad_scaler` (a run without a stored one, e.g.
    ///   from fp32 or bf16, starts from the configured initial scale);
    /// * a half run gets the fp32 main parameters: the stored ones (`{param}.main_param`), or,
    ///   from an fp32 checkpoint, its fp32 weights (not the rounded model values);
    /// * an fp32 run continuing a half run takes the stored fp32 main parameters as its weights
    ///   (they are exact; the stored weights are their rounding).
    fn load_precision_state(
        &mut self,
        ckpt: &megatron_checkpoint::LoadedCheckpoint,
        state: &mut megatron_core::OptimizerState,
    ) -> Result<()> {
        let bk = self.backend.clone();
        let main = megatron_optim::take_main_params(state);
        if let (Some(scaler), Some(stored)) = (self.loss_scaler.as_mut(), state.scalars.get("grad_scaler")) {
            scaler.load_state_dict(stored)?;
        }
        if self.cfg.params_dtype().is_some() {
            let main = if main.is_empty() { self.checkpoint_weights_f32(ckpt)? } else { main };
            let suffix = megatron_optim::MAIN_PARAM;
            state.tensors.extend(main.into_iter().map(|(name, t)| (format!("{name}.{suffix}"), t)));
        } else if !main.is_empty() {
            for p in self.model.params_mut() {
                if let Some(t) = main.get(&p.name) {
                    let r =
                        if t.dtype() == p.value.dtype() { bk.copy(t, &mut p.value) } else { bk.cast(t, &mut p.value) };
                    r.with_context(|| format!("loading the fp32 main parameter of `{}`", p.name))?;
                }
            }
        }
        Ok(())
    }

    /// This rank's slices of the checkpoint's weights, read as fp32.
    fn checkpoint_weights_f32(
        &self,
        ckpt: &megatron_checkpoint::LoadedCheckpoint,
    ) -> Result<std::collections::BTreeMap<String, megatron_core::DeviceTensor>> {
        let bk = self.backend.as_ref();
        let mut temps = Vec::new();
        for p in self.model.params() {
            temps.push(megatron_core::Param {
                name: p.name.clone(),
                value: bk.zeros(p.value.shape(), megatron_core::DType::F32)?,
                grad: bk.zeros(&[0], megatron_core::DType::F32)?,
                layout: p.layout.clone(),
            });
        }
        let mut refs: Vec<&mut megatron_core::Param> = temps.iter_mut().collect();
        ckpt.load_params(&mut refs, bk)?;
        Ok(temps.into_iter().map(|p| (p.name, p.value)).collect())
    }

    /// Saves a checkpoint of the current state under `--save`.
    pub fn save(&mut self) -> Result<()> {
        let Some(dir) = self.cfg.args.save.clone() else { return Ok(()) };
        self.finish_param_gather()?; // --overlap-param-gather: save the updated parameters
        let a = &self.cfg.args;
        let optimizer = if a.no_save_optim {
            None
        } else {
            let mut state = self.optimizer.state(self.backend.as_ref())?;
            // Megatron keeps the loss scaler's state in the optimizer's state dict.
            if let (Some(scaler), Some(m)) = (&self.loss_scaler, state.scalars.as_object_mut()) {
                m.insert("grad_scaler".into(), scaler.state_dict());
            }
            Some(state)
        };
        let meta = megatron_checkpoint::CheckpointMeta {
            consumed_train_samples: self.state.consumed_train_samples,
            consumed_valid_samples: self.state.consumed_valid_samples,
            args: serde_json::to_value(a)?,
            lr_scheduler: self.lr_schedule.state_dict(),
            rng: if a.no_save_rng { Value::Null } else { json!({ "seed": a.seed }) },
            tokenizer_fingerprint: Some(self.tokenizer_fingerprint.clone()),
            num_floating_point_operations_so_far: self.state.num_floating_point_operations_so_far,
            ..Default::default()
        };
        // Buffers (e.g. the MoE expert bias) are stored like parameters; the optimizer state
        // covers the parameters only.
        let mut params = self.model.params();
        params.extend(self.model.buffers());
        let t = std::time::Instant::now();
        let path = megatron_checkpoint::save(
            &dir,
            self.state.iteration,
            &params,
            optimizer,
            meta,
            self.backend.as_ref(),
            &self.ctx,
        )
        .with_context(|| format!("saving checkpoint at iteration {} to {}", self.state.iteration, dir.display()))?;
        if self.is_rank0() {
            println!(
                "  successfully saved checkpoint at iteration {:7} to {} [ t {:.2}s ]",
                self.state.iteration,
                path.display(),
                t.elapsed().as_secs_f64()
            );
        }
        Ok(())
    }

    /// Loads `--load` if it holds a checkpoint (SPEC §7.3).
    pub fn maybe_load(&mut self) -> Result<()> {
        let Some(dir) = self.cfg.args.load.clone() else { return Ok(()) };
        // --overlap-param-gather: a gather landing after the load would overwrite it.
        self.finish_param_gather()?;
        // A Megatron-LM checkpoint is converted to a temporary native one first (its vocabulary
        // padded to this model's), which is removed once loaded.
        #[cfg(all(feature = "gpt", feature = "tokenizers"))]
        let _converted = {
            let padded = self
                .model
                .params()
                .iter()
                .find(|p| p.name == "embedding.word_embeddings.weight")
                .map(|p| p.layout.global_shape[0]);
            crate::checkpoint_tools::resolve_load_dir(&dir, padded, self.ctx.rank)?
        };
        #[cfg(all(feature = "gpt", feature = "tokenizers"))]
        let dir = _converted.as_ref().map_or(dir, |t| t.0.clone());
        let a = self.cfg.args.clone();
        let Some(iteration) = megatron_checkpoint::read_tracker(&dir)? else {
            if a.exit_on_missing_checkpoint {
                bail!(
                    "--load {}: no latest_checkpointed_iteration.txt and --exit-on-missing-checkpoint is set",
                    dir.display()
                );
            }
            println!("WARNING: could not find a checkpoint in {}; training from scratch", dir.display());
            return Ok(());
        };
        let ckpt = megatron_checkpoint::load(&dir, Some(iteration))?;
        let meta = ckpt.metadata.meta.clone();
        if !a.finetune {
            let ours_all = serde_json::to_value(&a)?;
            for key in SHAPE_ARGS {
                let (stored, ours) = (&meta.args[key], &ours_all[key]);
                if !stored.is_null() && stored != ours {
                    bail!(
                        "checkpoint {} was saved with --{} {stored}, this run has {ours}; use the same model shape \
                         (or --finetune to load weights into a compatible model)",
                        dir.display(),
                        key.replace('_', "-")
                    );
                }
            }
        }
        {
            let mut params = self.model.params_mut();
            ckpt.load_params(&mut params, self.backend.as_ref())
                .with_context(|| format!("loading weights from {}", dir.display()))?;
        }
        let missing = ckpt
            .load_buffers(self.model.buffers_mut(), self.backend.as_ref())
            .with_context(|| format!("loading buffers from {}", dir.display()))?;
        if !missing.is_empty() && self.is_rank0() {
            println!(
                "WARNING: {} does not store {} (e.g. `{}`); they start from their initial values",
                dir.display(),
                missing.len(),
                missing[0]
            );
        }
        if a.finetune {
            println!(
                " loaded weights of iteration {iteration} from {} for finetuning (iteration reset to 0)",
                dir.display()
            );
            return Ok(());
        }
        self.guard_merge_skip_list(&meta.args);
        self.state.iteration = ckpt.iteration();
        self.state.consumed_train_samples = meta.consumed_train_samples;
        self.state.consumed_valid_samples = meta.consumed_valid_samples;
        self.state.num_floating_point_operations_so_far = meta.num_floating_point_operations_so_far;
        if !a.no_load_optim {
            let mut state = {
                let params = self.model.params();
                ckpt.optimizer_state(&params, self.backend.as_ref())?
            };
            self.load_precision_state(&ckpt, &mut state)?;
            let params = self.model.params();
            self.optimizer.load_state(state, &params, self.backend.as_ref())?;
            self.lr_schedule.load_state_dict(&meta.lr_scheduler, a.override_opt_param_scheduler)?;
        } else {
            // As Megatron: --no-load-optim skips the optimizer *and* the LR scheduler state.
            println!(" --no-load-optim: optimizer and LR-scheduler state not loaded (fresh schedule)");
        }
        if !a.no_load_rng && meta.rng["seed"].as_u64().is_some_and(|s| s != a.seed) {
            println!(
                "WARNING: checkpoint was trained with --seed {}, this run uses --seed {}",
                meta.rng["seed"], a.seed
            );
        }
        if self.is_rank0() {
            println!(" successfully loaded checkpoint from {} at iteration {}", dir.display(), ckpt.iteration());
        }
        Ok(())
    }
}
