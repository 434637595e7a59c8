//! `megatron-optim`: optimizers (Adam/AdamW, SGD), gradient-norm clipping and Megatron's
//! learning-rate / weight-decay schedule (SPEC §6.3–§6.6), the fp16 loss scaler and the
//! mixed-precision wrapper that keeps fp32 main parameters for bf16/fp16 models (§6.7).
//!
//! Registers the optimizer plugins `adam` ([`AdamConfig`]) and `sgd` ([`SgdConfig`]) and the
//! lr-schedule plugin `megatron` ([`LrScheduleConfig`], counts in samples; build it from
//! Megatron's flags with [`lr_schedule_config_from_flags`]).

mod adam;
mod clip;
mod dist_opt;
mod loss_scaler;
mod lr_flags;
mod lr_schedule;
mod lr_state;
mod lr_styles;
mod mixed_precision;
mod param_gather;
mod sgd;
mod state_tensors;

pub use adam::{Adam, AdamConfig};
pub use clip::{
    clip_grad_norm, clip_grad_norm_sharded, grad_norm, grad_norm_sharded, grads_have_inf_or_nan, is_finite_norm,
};
pub use dist_opt::{DistributedOptimizer, ShardedBucket};
pub use loss_scaler::{DynamicScalerConfig, LossScaleFlags, LossScaler};
pub use lr_flags::{lr_schedule_config_from_flags, LrFlags};
pub use lr_schedule::{LrScheduleConfig, MegatronLrScheduler};
pub use lr_styles::{DecayStyle, WdIncrStyle, WsdDecayStyle};
pub use mixed_precision::{take_main_params, MixedPrecisionOptimizer, MAIN_PARAM};
pub use param_gather::ParamGather;
pub use sgd::{Sgd, SgdConfig};

/// The name the driver was first promised; it converts sample-based flags too.
pub use lr_flags::lr_schedule_config_from_flags as lr_schedule_config_from_iters;

use megatron_core::registry::{parse_config, ConfigDe};
use megatron_core::{Factory, LrSchedule, Optimizer, Plugin, PluginCrate, Result};

fn adam_factory(de: ConfigDe) -> Result<Box<dyn Optimizer>> {
    Ok(Box::new(Adam::new(parse_config(de, "adam")?)?))
}

fn sgd_factory(de: ConfigDe) -> Result<Box<dyn Optimizer>> {
    Ok(Box::new(Sgd::new(parse_config(de, "sgd")?)?))
}

fn megatron_schedule_factory(de: ConfigDe) -> Result<Box<dyn LrSchedule>> {
    Ok(Box::new(MegatronLrScheduler::new(parse_config(de, "megatron")?)?))
}

fn plugins() -> Vec<Plugin> {
    vec![
        Plugin {
            name: "adam",
            description: "AdamW (decoupled weight decay, bias correction); config: beta1, beta2, eps",
            factory: Factory::Optimizer(adam_factory),
        },
        Plugin {
            name: "sgd",
            description: "SGD with momentum and coupled weight decay; config: momentum",
            factory: Factory::Optimizer(sgd_factory),
        },
        Plugin {
            name: "megatron",
            description: "Megatron's OptimizerParamScheduler: warmup, constant/linear/cosine/inverse-square-root/WSD \
                          decay and the weight-decay increment, counted in samples",
            factory: Factory::LrSchedule(megatron_schedule_factory),
        },
    ]
}

megatron_core::inventory::submit! {
    PluginCrate { crate_name: env!("CARGO_PKG_NAME"), version: env!("CARGO_PKG_VERSION"), plugins }
}

#[cfg(test)]
mod tests {
    use megatron_core::{PluginKind, Registry};
    use serde_json::json;

    #[test]
    fn plugins_are_registered_and_reject_unknown_fields() {
        let reg = Registry::builtin().unwrap();
        assert!(reg.names(PluginKind::Optimizer).contains(&"adam"));
        assert!(reg.names(PluginKind::Optimizer).contains(&"sgd"));
        assert!(reg.names(PluginKind::LrSchedule).contains(&"megatron"));
        assert_eq!(reg.optimizer("adam", json!({})).unwrap().name(), "adam");
        assert_eq!(reg.optimizer("sgd", json!({"momentum": 0.5})).unwrap().name(), "sgd");
        let err = reg.optimizer("adam", json!({"beta3": 0.5})).err().unwrap().to_string();
        assert!(err.contains("beta3") && err.contains("adam"), "{err}");
        let err = reg.optimizer("adam", json!({"beta2": 1.5})).err().unwrap().to_string();
        assert!(err.contains("--adam-beta2"), "{err}");
        let sched = reg.lr_schedule("megatron", json!({"max_lr": 1e-3, "decay_steps": 100})).unwrap();
        assert_eq!(sched.lr(), 1e-3); // linear decay, n = 0, no warmup
        let err = reg.lr_schedule("megatron", json!({"max_lr": 1e-3, "decay_steps": 100, "decay_style": "WSD"}));
        assert!(err.err().unwrap().to_string().contains("--lr-wsd-decay-iters"));
    }
}
