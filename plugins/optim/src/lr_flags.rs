//! Conversion of Megatron's LR and weight-decay flags (iteration- or sample-based) into the
//! sample counts of [`LrScheduleConfig`] (SPEC §6.3, §6.4, the argument checks of §11.10).

use crate::lr_schedule::LrScheduleConfig;
use crate::lr_styles::{DecayStyle, WdIncrStyle, WsdDecayStyle};
use anyhow::{bail, Result};

/// The training flags the schedule depends on, named after Megatron's (`--lr-decay-iters` is
/// `lr_decay_iters`). [`Default`] holds Megatron's defaults except for the required `lr`
/// and the training length.
#[derive(Clone, Debug, PartialEq)]
pub struct LrFlags {
    pub lr: Option<f64>,
    pub min_lr: f64,
    pub lr_warmup_init: f64,
    pub lr_decay_style: String,
    pub lr_wsd_decay_style: String,
    pub global_batch_size: u64,
    pub train_iters: Option<u64>,
    pub train_samples: Option<u64>,
    pub lr_decay_iters: Option<u64>,
    pub lr_decay_samples: Option<u64>,
    pub lr_warmup_fraction: Option<f64>,
    pub lr_warmup_iters: u64,
    pub lr_warmup_samples: u64,
    pub lr_wsd_decay_iters: Option<u64>,
    pub lr_wsd_decay_samples: Option<u64>,
    pub weight_decay: f64,
    pub start_weight_decay: Option<f64>,
    pub end_weight_decay: Option<f64>,
    pub weight_decay_incr_style: String,
    pub use_checkpoint_opt_param_scheduler: bool,
}

impl Default for LrFlags {
    fn default() -> LrFlags {
        LrFlags {
            lr: None,
            min_lr: 0.0,
            lr_warmup_init: 0.0,
            lr_decay_style: "linear".into(),
            lr_wsd_decay_style: "exponential".into(),
            global_batch_size: 1,
            train_iters: None,
            train_samples: None,
            lr_decay_iters: None,
            lr_decay_samples: None,
            lr_warmup_fraction: None,
            lr_warmup_iters: 0,
            lr_warmup_samples: 0,
            lr_wsd_decay_iters: None,
            lr_wsd_decay_samples: None,
            weight_decay: 0.01,
            start_weight_decay: None,
            end_weight_decay: None,
            weight_decay_incr_style: "constant".into(),
            use_checkpoint_opt_param_scheduler: false,
        }
    }
}

/// Megatron's `get_optimizer_param_scheduler` plus the related argument checks: counts become
/// samples (`iters × global batch size` for iteration-based training), and the result is
/// validated.
pub fn lr_schedule_config_from_flags(f: &LrFlags) -> Result<LrScheduleConfig> {
    let Some(max_lr) = f.lr else { bail!("--lr is required for training") };
    let decay_style = DecayStyle::parse(&f.lr_decay_style, "--lr-decay-style")?;
    let wsd_decay_style = WsdDecayStyle::parse(&f.lr_wsd_decay_style, "--lr-wsd-decay-style")?;
    let wd_incr_style = WdIncrStyle::parse(&f.weight_decay_incr_style, "--weight-decay-incr-style")?;
    let (start_wd, end_wd) = match (wd_incr_style, f.start_weight_decay, f.end_weight_decay) {
        (WdIncrStyle::Constant, None, None) => (f.weight_decay, f.weight_decay),
        (WdIncrStyle::Constant, _, _) => bail!(
            "--start-weight-decay/--end-weight-decay need --weight-decay-incr-style linear or cosine; with the \
             constant style use --weight-decay"
        ),
        (_, Some(s), Some(e)) => (s, e),
        (style, _, _) => {
            bail!("--weight-decay-incr-style {} needs both --start-weight-decay and --end-weight-decay", style.as_str())
        }
    };
    if f.lr_warmup_fraction.is_some() && (f.lr_warmup_iters != 0 || f.lr_warmup_samples != 0) {
        bail!("give only one of --lr-warmup-fraction, --lr-warmup-iters and --lr-warmup-samples");
    }
    let gbs = f.global_batch_size;
    let (decay_steps, wd_incr_steps, wsd_decay_steps, warmup_direct) = match (f.train_iters, f.train_samples) {
        (Some(_), Some(_)) => bail!("give only one of --train-iters and --train-samples"),
        (None, None) => bail!("either --train-iters or --train-samples must be given"),
        (Some(iters), None) => {
            for (given, flag) in [
                (f.lr_decay_samples.is_some(), "--lr-decay-samples"),
                (f.lr_warmup_samples != 0, "--lr-warmup-samples"),
                (f.lr_wsd_decay_samples.is_some(), "--lr-wsd-decay-samples"),
            ] {
                if given {
                    bail!(
                        "{flag} is sample-based but training is iteration-based (--train-iters): use the -iters flag"
                    );
                }
            }
            if gbs == 0 {
                bail!("--global-batch-size must be >= 1");
            }
            let decay = f.lr_decay_iters.unwrap_or(iters) * gbs;
            (decay, iters * gbs, f.lr_wsd_decay_iters.map(|i| i * gbs), (f.lr_warmup_iters * gbs) as f64)
        }
        (None, Some(samples)) => {
            for (given, flag) in [
                (f.lr_decay_iters.is_some(), "--lr-decay-iters"),
                (f.lr_warmup_iters != 0, "--lr-warmup-iters"),
                (f.lr_wsd_decay_iters.is_some(), "--lr-wsd-decay-iters"),
            ] {
                if given {
                    bail!(
                        "{flag} is iteration-based but training is sample-based (--train-samples): use the -samples flag"
                    );
                }
            }
            let decay = f.lr_decay_samples.unwrap_or(samples);
            (decay, samples, f.lr_wsd_decay_samples, f.lr_warmup_samples as f64)
        }
    };
    // Megatron multiplies the fraction in floating point, so warmup may be fractional.
    let warmup_steps = match f.lr_warmup_fraction {
        Some(frac) => frac * decay_steps as f64,
        None => warmup_direct,
    };
    let config = LrScheduleConfig {
        max_lr,
        min_lr: f.min_lr,
        init_lr: f.lr_warmup_init,
        warmup_steps,
        decay_steps,
        decay_style,
        wsd_decay_steps,
        wsd_decay_style,
        start_wd,
        end_wd,
        wd_incr_steps,
        wd_incr_style,
        use_checkpoint_opt_param_scheduler: f.use_checkpoint_opt_param_scheduler,
    };
    config.validate()?;
    Ok(config)
}
