//! Megatron's `OptimizerParamScheduler` (SPEC §6.3, §6.4): learning rate and weight decay as
//! functions of the number of samples consumed by successful steps, with its state dict.

use crate::lr_styles::{DecayStyle, WdIncrStyle, WsdDecayStyle};
use anyhow::{bail, Result};
use megatron_core::LrSchedule;
use serde::{Deserialize, Serialize};
use std::f64::consts::PI;

/// Configuration of the `megatron` lr-schedule plugin. Every count is in **samples**; see
/// [`crate::lr_schedule_config_from_flags`] for the conversion from Megatron's flags.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LrScheduleConfig {
    /// `--lr`.
    pub max_lr: f64,
    /// `--min-lr`.
    #[serde(default)]
    pub min_lr: f64,
    /// `--lr-warmup-init`.
    #[serde(default)]
    pub init_lr: f64,
    /// Warmup samples. A float because `--lr-warmup-fraction × decay_steps` is one in Megatron.
    #[serde(default)]
    pub warmup_steps: f64,
    pub decay_steps: u64,
    #[serde(default = "default_decay_style")]
    pub decay_style: DecayStyle,
    /// Required by the `WSD` style: the samples of the final anneal.
    #[serde(default)]
    pub wsd_decay_steps: Option<u64>,
    #[serde(default = "default_wsd_decay_style")]
    pub wsd_decay_style: WsdDecayStyle,
    #[serde(default = "default_weight_decay")]
    pub start_wd: f64,
    #[serde(default = "default_weight_decay")]
    pub end_wd: f64,
    /// Samples over which weight decay goes from `start_wd` to `end_wd` (train samples).
    #[serde(default)]
    pub wd_incr_steps: u64,
    #[serde(default = "default_wd_incr_style")]
    pub wd_incr_style: WdIncrStyle,
    /// `--use-checkpoint-opt_param-scheduler`: on load take the checkpoint's values.
    #[serde(default)]
    pub use_checkpoint_opt_param_scheduler: bool,
}

fn default_decay_style() -> DecayStyle {
    DecayStyle::Linear
}
fn default_wsd_decay_style() -> WsdDecayStyle {
    WsdDecayStyle::Exponential
}
fn default_weight_decay() -> f64 {
    0.01
}
fn default_wd_incr_style() -> WdIncrStyle {
    WdIncrStyle::Constant
}

impl LrScheduleConfig {
    /// Megatron's constructor assertions, as errors naming the flags to fix.
    pub fn validate(&self) -> Result<()> {
        for (v, flag) in [
            (self.max_lr, "--lr"),
            (self.min_lr, "--min-lr"),
            (self.init_lr, "--lr-warmup-init"),
            (self.warmup_steps, "--lr-warmup-iters/--lr-warmup-fraction/--lr-warmup-samples"),
            (self.start_wd, "--start-weight-decay (or --weight-decay)"),
            (self.end_wd, "--end-weight-decay (or --weight-decay)"),
        ] {
            if !v.is_finite() {
                bail!("{flag} must be a finite number, got {v}");
            }
        }
        if self.min_lr < 0.0 {
            bail!("--min-lr {} must be >= 0", self.min_lr);
        }
        if self.max_lr < self.min_lr {
            bail!("--min-lr {} must be <= --lr {}", self.min_lr, self.max_lr);
        }
        if self.init_lr > self.max_lr {
            bail!("--lr-warmup-init {} must be <= --lr {}", self.init_lr, self.max_lr);
        }
        if self.decay_steps == 0 {
            bail!(
                "the LR decay spans 0 samples: set --lr-decay-iters/--lr-decay-samples (or --train-iters/--train-samples) > 0"
            );
        }
        if self.warmup_steps < 0.0 || self.warmup_steps >= self.decay_steps as f64 {
            bail!(
                "LR warmup of {} samples (--lr-warmup-iters/--lr-warmup-fraction/--lr-warmup-samples) must be >= 0 and \
                 < the {} decay samples (--lr-decay-iters/--lr-decay-samples)",
                self.warmup_steps,
                self.decay_steps
            );
        }
        if self.decay_style == DecayStyle::Wsd && self.wsd_decay_steps.is_none() {
            bail!("--lr-decay-style WSD needs --lr-wsd-decay-iters (or --lr-wsd-decay-samples)");
        }
        if self.start_wd < 0.0 {
            bail!("--start-weight-decay {} must be >= 0", self.start_wd);
        }
        if self.end_wd < self.start_wd {
            bail!("--end-weight-decay {} must be >= --start-weight-decay {}", self.end_wd, self.start_wd);
        }
        match self.wd_incr_style {
            WdIncrStyle::Constant if self.start_wd != self.end_wd => bail!(
                "--weight-decay-incr-style constant needs start weight decay {} == end weight decay {}: use \
                 --weight-decay alone, or --weight-decay-incr-style linear/cosine with --start-weight-decay and \
                 --end-weight-decay",
                self.start_wd,
                self.end_wd
            ),
            WdIncrStyle::Linear | WdIncrStyle::Cosine if self.wd_incr_steps == 0 => bail!(
                "--weight-decay-incr-style {} increments over the training run, which is 0 samples: set \
                 --train-iters/--train-samples > 0",
                self.wd_incr_style.as_str()
            ),
            _ => Ok(()),
        }
    }
}

/// The `megatron` LR schedule.
#[derive(Clone, Debug)]
pub struct MegatronLrScheduler {
    config: LrScheduleConfig,
    num_steps: u64,
}

impl MegatronLrScheduler {
    pub fn new(config: LrScheduleConfig) -> Result<MegatronLrScheduler> {
        config.validate()?;
        Ok(MegatronLrScheduler { config, num_steps: 0 })
    }

    pub fn config(&self) -> &LrScheduleConfig {
        &self.config
    }

    /// `lr(n)` of SPEC §6.3 at `n` samples.
    pub fn lr_at(&self, n: u64) -> f64 {
        let c = &self.config;
        let n = n as f64;
        let (w, d) = (c.warmup_steps, c.decay_steps as f64);
        if w > 0.0 && n <= w {
            return c.init_lr + (c.max_lr - c.init_lr) * n / w;
        }
        if c.decay_style == DecayStyle::Constant {
            return c.max_lr;
        }
        if n > d {
            return c.min_lr;
        }
        if c.decay_style == DecayStyle::InverseSquareRoot {
            return c.min_lr.max(c.max_lr * w.max(1.0).sqrt() / n.max(1.0).sqrt());
        }
        let r = (n - w) / (d - w);
        let coeff = match c.decay_style {
            DecayStyle::Linear => 1.0 - r,
            DecayStyle::Cosine => 0.5 * ((PI * r).cos() + 1.0),
            DecayStyle::Wsd => {
                // Validation guarantees the WSD length; 0 only anneals past `d`, handled above.
                let wsd = c.wsd_decay_steps.unwrap_or(0) as f64;
                let anneal_start = d - wsd;
                if n <= anneal_start {
                    1.0
                } else {
                    c.wsd_decay_style.coeff((n - anneal_start) / wsd)
                }
            }
            DecayStyle::Constant | DecayStyle::InverseSquareRoot => unreachable!("returned above"),
        };
        c.min_lr + coeff * (c.max_lr - c.min_lr)
    }

    /// `wd(n)` of SPEC §6.4 at `n` samples (before the per-parameter `wd_mult`).
    pub fn weight_decay_at(&self, n: u64) -> f64 {
        let c = &self.config;
        if n > c.wd_incr_steps || c.wd_incr_style == WdIncrStyle::Constant {
            return c.end_wd;
        }
        let r = n as f64 / c.wd_incr_steps as f64;
        let coeff = match c.wd_incr_style {
            WdIncrStyle::Linear => r,
            WdIncrStyle::Cosine => 0.5 * ((PI * (1.0 - r)).cos() + 1.0),
            WdIncrStyle::Constant => unreachable!("returned above"),
        };
        c.start_wd + coeff * (c.end_wd - c.start_wd)
    }
}

impl LrSchedule for MegatronLrScheduler {
    fn name(&self) -> &str {
        "megatron"
    }

    fn lr(&self) -> f64 {
        self.lr_at(self.num_steps)
    }

    fn weight_decay(&self) -> f64 {
        self.weight_decay_at(self.num_steps)
    }

    fn step(&mut self, increment: u64) {
        self.num_steps += increment;
    }

    fn num_steps(&self) -> u64 {
        self.num_steps
    }

    fn state_dict(&self) -> serde_json::Value {
        crate::lr_state::state_dict(&self.config, self.num_steps)
    }

    fn load_state_dict(&mut self, state: &serde_json::Value, override_config: bool) -> Result<()> {
        let (config, num_steps) = crate::lr_state::load_state_dict(&self.config, state, override_config)?;
        config.validate()?;
        self.config = config;
        self.num_steps = num_steps;
        Ok(())
    }
}
