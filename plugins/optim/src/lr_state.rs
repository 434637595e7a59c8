//! The LR scheduler's state dict with Megatron's keys, and its loading rules (SPEC §6.3):
//! stored hyper-parameters must equal the configured ones unless
//! `--override-opt_param-scheduler` (configured win) or `--use-checkpoint-opt_param-scheduler`
//! (stored win); `num_steps` is always restored; legacy key names are accepted.

use crate::lr_schedule::LrScheduleConfig;
use crate::lr_styles::{DecayStyle, WdIncrStyle};
use anyhow::{anyhow, bail, Result};
use serde_json::{json, Value};

/// Megatron's `OptimizerParamScheduler.state_dict()`.
pub(crate) fn state_dict(c: &LrScheduleConfig, num_steps: u64) -> Value {
    json!({
        "max_lr": c.max_lr,
        "lr_warmup_steps": count_json(c.warmup_steps),
        "num_steps": num_steps,
        "lr_decay_style": c.decay_style.as_str(),
        "lr_decay_steps": c.decay_steps,
        "min_lr": c.min_lr,
        "start_wd": c.start_wd,
        "end_wd": c.end_wd,
        "wd_incr_style": c.wd_incr_style.as_str(),
        "wd_incr_steps": c.wd_incr_steps,
    })
}

/// Integral sample counts are written as integers, as Megatron's int arithmetic does; a
/// fractional warmup (from `--lr-warmup-fraction`) stays a float.
fn count_json(v: f64) -> Value {
    if v.fract() == 0.0 && (0.0..9.0e15).contains(&v) {
        json!(v as u64)
    } else {
        json!(v)
    }
}

/// Returns the configuration to continue with and the restored `num_steps`.
pub(crate) fn load_state_dict(
    configured: &LrScheduleConfig,
    state: &Value,
    override_config: bool,
) -> Result<(LrScheduleConfig, u64)> {
    if !state.is_object() {
        bail!("the LR scheduler state in the checkpoint is not a JSON object: {state}");
    }
    if override_config && configured.use_checkpoint_opt_param_scheduler {
        bail!("--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler are mutually exclusive");
    }
    let rule = Rule { override_config, use_checkpoint: configured.use_checkpoint_opt_param_scheduler };
    let mut c = configured.clone();
    c.max_lr = rule.pick(c.max_lr, number(state, &["start_lr", "max_lr"])?, "max_lr")?;
    c.min_lr = rule.pick(c.min_lr, number(state, &["min_lr"])?, "min_lr")?;
    c.warmup_steps = rule.pick(
        c.warmup_steps,
        number(state, &["warmup_iter", "warmup_steps", "lr_warmup_steps"])?,
        "lr_warmup_steps",
    )?;
    let decay_steps = number(state, &["end_iter", "decay_steps", "lr_decay_steps"])?;
    c.decay_steps = count(rule.pick(c.decay_steps as f64, decay_steps, "lr_decay_steps")?, "lr_decay_steps")?;
    let style = string(state, &["decay_style", "lr_decay_style"])?;
    let style = rule.pick_str(c.decay_style.as_str(), &style, "lr_decay_style")?;
    c.decay_style = DecayStyle::parse(&style, "lr_decay_style of the checkpoint's LR scheduler state")?;
    let num_steps = count(number(state, &["num_iters", "num_steps"])?, "num_steps")?;

    // Checkpoints older than the weight-decay schedule have none of its keys.
    if state.get("start_wd").is_some() {
        c.start_wd = rule.pick(c.start_wd, number(state, &["start_wd"])?, "start_wd")?;
        c.end_wd = rule.pick(c.end_wd, number(state, &["end_wd"])?, "end_wd")?;
        let incr = number(state, &["wd_incr_steps"])?;
        c.wd_incr_steps = count(rule.pick(c.wd_incr_steps as f64, incr, "wd_incr_steps")?, "wd_incr_steps")?;
        let style = string(state, &["wd_incr_style"])?;
        let style = rule.pick_str(c.wd_incr_style.as_str(), &style, "wd_incr_style")?;
        c.wd_incr_style = WdIncrStyle::parse(&style, "wd_incr_style of the checkpoint's LR scheduler state")?;
    }
    Ok((c, num_steps))
}

/// Megatron's `_check_and_set`.
struct Rule {
    override_config: bool,
    use_checkpoint: bool,
}

impl Rule {
    fn pick(&self, configured: f64, stored: f64, field: &str) -> Result<f64> {
        if self.override_config {
            return Ok(configured);
        }
        if !self.use_checkpoint && configured != stored {
            bail!(mismatch(field, &configured.to_string(), &stored.to_string()));
        }
        Ok(stored)
    }

    fn pick_str(&self, configured: &str, stored: &str, field: &str) -> Result<String> {
        if self.override_config {
            return Ok(configured.to_string());
        }
        if !self.use_checkpoint && configured != stored {
            bail!(mismatch(field, configured, stored));
        }
        Ok(stored.to_string())
    }
}

fn mismatch(field: &str, configured: &str, stored: &str) -> String {
    format!(
        "LR scheduler state mismatch for `{field}`: the checkpoint has {stored} but the command line gives \
         {configured}; pass --override-opt_param-scheduler to use the command line's values, or \
         --use-checkpoint-opt_param-scheduler to use the checkpoint's"
    )
}

/// The first of `keys` present in `state` (legacy names first, as Megatron checks them).
fn lookup<'a>(state: &'a Value, keys: &[&str]) -> Result<&'a Value> {
    keys.iter().find_map(|k| state.get(*k)).ok_or_else(|| {
        anyhow!(
            "the checkpoint's LR scheduler state has no `{}`{}",
            keys[keys.len() - 1],
            if keys.len() > 1 { format!(" (nor legacy {})", keys[..keys.len() - 1].join(", ")) } else { String::new() }
        )
    })
}

fn number(state: &Value, keys: &[&str]) -> Result<f64> {
    let v = lookup(state, keys)?;
    v.as_f64().ok_or_else(|| anyhow!("the checkpoint's LR scheduler `{}` is {v}, not a number", keys[keys.len() - 1]))
}

fn string(state: &Value, keys: &[&str]) -> Result<String> {
    let v = lookup(state, keys)?;
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("the checkpoint's LR scheduler `{}` is {v}, not a string", keys[keys.len() - 1]))
}

fn count(v: f64, field: &str) -> Result<u64> {
    if v < 0.0 || v.fract() != 0.0 || !v.is_finite() {
        bail!("the checkpoint's LR scheduler `{field}` is {v}, not a whole number of samples");
    }
    Ok(v as u64)
}
