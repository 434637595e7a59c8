//! fp16 loss scaling (SPEC §6.7): the constant scaler (`--loss-scale X`) and the dynamic one
//! (`--initial-loss-scale --min-loss-scale --loss-scale-window --hysteresis`, growth 2.0,
//! back-off 0.5), with Megatron's state-dict keys (`scale`, `growth_tracker`,
//! `hysteresis_tracker`) so a resumed run continues the scaler exactly.
//!
//! The driver multiplies the loss by [`LossScaler::scale`] before backward, divides the
//! gradients by it afterwards (`inv_scale`), checks them for inf/NaN (all-reduced MAX over the
//! model-parallel group) and calls [`LossScaler::update`] with the result: when it returns
//! `true` the iteration is skipped (no optimizer step, LR not stepped, counted in the log
//! line's skipped iterations).

use anyhow::{bail, Result};
use serde_json::{json, Value};

/// The mixed-precision flags that decide whether and how the loss is scaled.
#[derive(Clone, Debug, PartialEq)]
pub struct LossScaleFlags {
    pub fp16: bool,
    pub bf16: bool,
    /// `--loss-scale`: a constant scale; `None` = dynamic for fp16, none for bf16.
    pub loss_scale: Option<f64>,
    pub initial_loss_scale: f64,
    pub min_loss_scale: f64,
    pub loss_scale_window: u64,
    pub hysteresis: u64,
}

impl Default for LossScaleFlags {
    /// SPEC §11.6 defaults.
    fn default() -> Self {
        LossScaleFlags {
            fp16: false,
            bf16: false,
            loss_scale: None,
            initial_loss_scale: 4294967296.0, // 2^32
            min_loss_scale: 1.0,
            loss_scale_window: 1000,
            hysteresis: 2,
        }
    }
}

/// Configuration of the dynamic scaler.
#[derive(Clone, Debug, PartialEq)]
pub struct DynamicScalerConfig {
    pub initial_scale: f64,
    pub min_scale: f64,
    pub growth_factor: f64,
    pub backoff_factor: f64,
    /// Clean iterations before the scale grows (`--loss-scale-window`).
    pub growth_interval: u64,
    /// Overflows tolerated before the scale backs off (`--hysteresis`).
    pub hysteresis: u64,
}

impl DynamicScalerConfig {
    fn validate(&self) -> Result<()> {
        let c = self;
        if !(c.initial_scale.is_finite() && c.initial_scale > 0.0) {
            bail!("--initial-loss-scale must be a finite number > 0, got {}", c.initial_scale);
        }
        if !(c.min_scale.is_finite() && c.min_scale > 0.0) {
            bail!("--min-loss-scale must be a finite number > 0, got {}", c.min_scale);
        }
        if c.min_scale > c.initial_scale {
            bail!(
                "--min-loss-scale ({}) is larger than --initial-loss-scale ({}); lower the minimum",
                c.min_scale,
                c.initial_scale
            );
        }
        let growth_ok = c.growth_factor > 1.0;
        let backoff_ok = c.backoff_factor > 0.0 && c.backoff_factor < 1.0;
        if !(growth_ok && backoff_ok) {
            bail!("loss-scale growth factor must be > 1 and back-off factor in (0, 1)");
        }
        if c.growth_interval == 0 {
            bail!("--loss-scale-window must be >= 1");
        }
        if c.hysteresis == 0 {
            bail!("--hysteresis must be >= 1");
        }
        Ok(())
    }
}

/// A loss scaler: constant or dynamic.
#[derive(Clone, Debug, PartialEq)]
pub enum LossScaler {
    Constant { scale: f64 },
    Dynamic { config: DynamicScalerConfig, scale: f64, growth_tracker: u64, hysteresis_tracker: i64 },
}

impl LossScaler {
    /// The scaler the flags ask for: `None` for fp32, and for bf16 without `--loss-scale`.
    pub fn from_flags(f: &LossScaleFlags) -> Result<Option<LossScaler>> {
        if f.fp16 && f.bf16 {
            bail!("--fp16 and --bf16 are mutually exclusive; pick one");
        }
        if !(f.fp16 || f.bf16) {
            return Ok(None);
        }
        if let Some(s) = f.loss_scale {
            return Ok(Some(LossScaler::constant(s)?));
        }
        if f.bf16 {
            return Ok(None);
        }
        Ok(Some(LossScaler::dynamic(DynamicScalerConfig {
            initial_scale: f.initial_loss_scale,
            min_scale: f.min_loss_scale,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: f.loss_scale_window,
            hysteresis: f.hysteresis,
        })?))
    }

    pub fn constant(scale: f64) -> Result<LossScaler> {
        if !(scale.is_finite() && scale > 0.0) {
            bail!("--loss-scale must be a finite number > 0, got {scale}");
        }
        Ok(LossScaler::Constant { scale })
    }

    pub fn dynamic(config: DynamicScalerConfig) -> Result<LossScaler> {
        config.validate()?;
        Ok(LossScaler::Dynamic {
            scale: config.initial_scale,
            growth_tracker: 0,
            hysteresis_tracker: config.hysteresis as i64,
            config,
        })
    }

    /// The live scale (the log line's `loss scale`).
    pub fn scale(&self) -> f64 {
        match self {
            LossScaler::Constant { scale } | LossScaler::Dynamic { scale, .. } => *scale,
        }
    }

    /// The factor the gradients are multiplied by after backward.
    pub fn inv_scale(&self) -> f64 {
        1.0 / self.scale()
    }

    /// Advances the scaler after an iteration; returns `true` when the update must be skipped
    /// (inf/NaN found). A constant scaler never changes but still skips on overflow.
    pub fn update(&mut self, found_inf: bool) -> bool {
        if let LossScaler::Dynamic { config, scale, growth_tracker, hysteresis_tracker } = self {
            if found_inf {
                *growth_tracker = 0;
                *hysteresis_tracker -= 1;
                if *hysteresis_tracker <= 0 {
                    *scale = (*scale * config.backoff_factor).max(config.min_scale);
                }
            } else {
                *growth_tracker += 1;
                if *growth_tracker == config.growth_interval {
                    *growth_tracker = 0;
                    *hysteresis_tracker = config.hysteresis as i64;
                    *scale *= config.growth_factor;
                }
            }
        }
        found_inf
    }

    /// Megatron's `grad_scaler` state dict.
    pub fn state_dict(&self) -> Value {
        match self {
            LossScaler::Constant { scale } => json!({ "scale": scale }),
            LossScaler::Dynamic { scale, growth_tracker, hysteresis_tracker, .. } => json!({
                "scale": scale,
                "growth_tracker": growth_tracker,
                "hysteresis_tracker": hysteresis_tracker,
            }),
        }
    }

    /// Restores a dynamic scaler's state; a constant scaler keeps its configured scale (as
    /// Megatron's does). The configuration (window, hysteresis, minimum) stays the configured one.
    pub fn load_state_dict(&mut self, state: &Value) -> Result<()> {
        let LossScaler::Dynamic { scale, growth_tracker, hysteresis_tracker, .. } = self else {
            return Ok(());
        };
        let field = |k: &str| {
            state.get(k).ok_or_else(|| {
                anyhow::anyhow!("the checkpoint's grad_scaler state lacks `{k}`: {state}; was it saved by an fp16 run?")
            })
        };
        let s = field("scale")?.as_f64().filter(|s| s.is_finite() && *s > 0.0);
        let g = field("growth_tracker")?.as_u64();
        let h = field("hysteresis_tracker")?.as_i64();
        match (s, g, h) {
            (Some(s), Some(g), Some(h)) => {
                *scale = s;
                *growth_tracker = g;
                *hysteresis_tracker = h;
                Ok(())
            }
            _ => bail!(
                "the checkpoint's grad_scaler state has a malformed field (scale > 0, trackers integers): {state}"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dyn_scaler(initial: f64, min: f64, window: u64, hysteresis: u64) -> LossScaler {
        LossScaler::dynamic(DynamicScalerConfig {
            initial_scale: initial,
            min_scale: min,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: window,
            hysteresis,
        })
        .unwrap()
    }

    /// A naive transcription of SPEC §6.7's update rule, to check the state machine against.
    fn spec_rule(s: &mut (f64, u64, i64), inf: bool, min: f64, window: u64, hysteresis: u64) {
        if inf {
            s.1 = 0;
            s.2 -= 1;
            if s.2 <= 0 {
                s.0 = f64::max(s.0 * 0.5, min);
            }
        } else {
            s.1 += 1;
            if s.1 == window {
                s.1 = 0;
                s.2 = hysteresis as i64;
                s.0 *= 2.0;
            }
        }
    }

    #[test]
    fn hysteresis_delays_backoff_then_every_overflow_halves() {
        let mut s = dyn_scaler(1024.0, 1.0, 3, 2);
        assert!(s.update(true));
        assert_eq!(s.scale(), 1024.0, "first overflow is absorbed by hysteresis 2");
        assert!(s.update(true));
        assert_eq!(s.scale(), 512.0);
        assert!(s.update(true));
        assert_eq!(s.scale(), 256.0, "budget spent: each further overflow halves");
        assert!(!s.update(false));
        assert!(!s.update(false));
        assert_eq!(s.scale(), 256.0);
        assert!(!s.update(false));
        assert_eq!(s.scale(), 512.0, "a clean window doubles and refills hysteresis");
        assert!(s.update(true));
        assert_eq!(s.scale(), 512.0, "hysteresis refilled by the growth");
    }

    #[test]
    fn overflow_resets_growth_window_and_min_is_a_floor() {
        let mut s = dyn_scaler(4.0, 2.0, 2, 1);
        s.update(false);
        s.update(true); // resets growth and halves (hysteresis 1)
        assert_eq!(s.scale(), 2.0);
        s.update(false);
        assert_eq!(s.scale(), 2.0, "the window restarted at the overflow");
        s.update(false);
        assert_eq!(s.scale(), 4.0);
        for _ in 0..5 {
            s.update(true);
        }
        assert_eq!(s.scale(), 2.0, "never below --min-loss-scale");
    }

    #[test]
    fn matches_spec_rule_on_a_pseudo_random_overflow_sequence() {
        let (min, window, hyst) = (0.25, 5, 3);
        let mut s = dyn_scaler(65536.0, min, window, hyst);
        let mut r = (65536.0, 0u64, hyst as i64);
        let mut x: u64 = 0x2545F4914F6CDD1D;
        for _ in 0..5000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let inf = x.is_multiple_of(4);
            assert_eq!(s.update(inf), inf);
            spec_rule(&mut r, inf, min, window, hyst);
            let LossScaler::Dynamic { scale, growth_tracker, hysteresis_tracker, .. } = &s else { unreachable!() };
            assert_eq!((*scale, *growth_tracker, *hysteresis_tracker), r);
        }
    }

    #[test]
    fn state_round_trip_resumes_exactly() {
        let mut a = dyn_scaler(2f64.powi(32), 1.0, 4, 2);
        let pattern = [true, false, true, true, false, false, false, false, true, false];
        for &inf in &pattern {
            a.update(inf);
        }
        let saved = serde_json::to_string(&a.state_dict()).unwrap();
        let mut b = dyn_scaler(2f64.powi(32), 1.0, 4, 2);
        b.load_state_dict(&serde_json::from_str(&saved).unwrap()).unwrap();
        assert_eq!(a, b);
        for &inf in pattern.iter().rev() {
            assert_eq!(a.update(inf), b.update(inf));
            assert_eq!(a, b);
        }
        let bad = json!({"scale": 2.0, "growth_tracker": 1});
        let err = b.load_state_dict(&bad).unwrap_err().to_string();
        assert!(err.contains("hysteresis_tracker"), "{err}");
    }

    #[test]
    fn flags_pick_the_scaler() {
        let f = LossScaleFlags::default();
        assert_eq!(LossScaler::from_flags(&f).unwrap(), None, "fp32: no scaler");
        let bf16 = LossScaleFlags { bf16: true, ..f.clone() };
        assert_eq!(LossScaler::from_flags(&bf16).unwrap(), None, "bf16: no scaler by default");
        let fp16 = LossScaleFlags { fp16: true, ..f.clone() };
        let s = LossScaler::from_flags(&fp16).unwrap().unwrap();
        assert_eq!(s.scale(), 2f64.powi(32));
        assert!(matches!(s, LossScaler::Dynamic { hysteresis_tracker: 2, .. }));
        let mut c =
            LossScaler::from_flags(&LossScaleFlags { loss_scale: Some(128.0), ..fp16.clone() }).unwrap().unwrap();
        assert!(c.update(true), "a constant scaler still skips on overflow");
        assert_eq!(c.scale(), 128.0);
        assert_eq!(c.inv_scale(), 1.0 / 128.0);
        let both = LossScaleFlags { fp16: true, bf16: true, ..f.clone() };
        assert!(LossScaler::from_flags(&both).is_err());
        let bad_min = LossScaleFlags { fp16: true, min_loss_scale: 1e40, ..f.clone() };
        assert!(LossScaler::from_flags(&bad_min).unwrap_err().to_string().contains("--min-loss-scale"));
        let bad_window = LossScaleFlags { fp16: true, loss_scale_window: 0, ..f };
        assert!(LossScaler::from_flags(&bad_window).is_err());
    }
}
