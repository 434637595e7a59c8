//! Conversion of Megatron's iteration- and sample-based flags to sample counts (SPEC §6.3).

use megatron_core::LrSchedule;
use megatron_optim::{
    lr_schedule_config_from_flags, DecayStyle, LrFlags, MegatronLrScheduler, WdIncrStyle, WsdDecayStyle,
};

fn spec_example() -> LrFlags {
    LrFlags {
        lr: Some(1e-4),
        min_lr: 1e-5,
        lr_decay_style: "cosine".into(),
        global_batch_size: 256,
        train_iters: Some(1000),
        lr_warmup_iters: 100,
        ..LrFlags::default()
    }
}

#[test]
fn iteration_flags_become_samples() {
    let c = lr_schedule_config_from_flags(&spec_example()).unwrap();
    assert_eq!(c.warmup_steps, 25_600.0);
    assert_eq!(c.decay_steps, 256_000);
    assert_eq!(c.wd_incr_steps, 256_000);
    assert_eq!(c.decay_style, DecayStyle::Cosine);
    assert_eq!((c.start_wd, c.end_wd, c.wd_incr_style), (0.01, 0.01, WdIncrStyle::Constant));
    let mut s = MegatronLrScheduler::new(c).unwrap();
    s.step(550 * 256);
    assert!((s.lr() - 5.5e-5).abs() < 1e-15, "{}", s.lr());
}

#[test]
fn decay_iters_fraction_and_wsd_iters() {
    let flags = LrFlags {
        lr_decay_iters: Some(800),
        lr_warmup_iters: 0,
        lr_warmup_fraction: Some(0.01),
        lr_decay_style: "WSD".into(),
        lr_wsd_decay_style: "minus_sqrt".into(),
        lr_wsd_decay_iters: Some(80),
        weight_decay_incr_style: "cosine".into(),
        start_weight_decay: Some(0.0),
        end_weight_decay: Some(0.1),
        ..spec_example()
    };
    let c = lr_schedule_config_from_flags(&flags).unwrap();
    assert_eq!(c.decay_steps, 800 * 256);
    assert_eq!(c.warmup_steps, 0.01 * (800.0 * 256.0));
    assert_eq!(c.wsd_decay_steps, Some(80 * 256));
    assert_eq!(c.wsd_decay_style, WsdDecayStyle::MinusSqrt);
    assert_eq!(c.wd_incr_steps, 1000 * 256, "weight decay spans the whole run, not the LR decay");
    assert_eq!((c.start_wd, c.end_wd), (0.0, 0.1));
}

#[test]
fn sample_flags_are_taken_as_they_are() {
    let flags = LrFlags {
        train_iters: None,
        lr_warmup_iters: 0,
        train_samples: Some(10_000),
        lr_warmup_samples: 500,
        ..spec_example()
    };
    let c = lr_schedule_config_from_flags(&flags).unwrap();
    assert_eq!((c.warmup_steps, c.decay_steps, c.wd_incr_steps), (500.0, 10_000, 10_000));
    let c = lr_schedule_config_from_flags(&LrFlags { lr_decay_samples: Some(8000), ..flags }).unwrap();
    assert_eq!(c.decay_steps, 8000);
}

#[test]
fn inconsistent_flags_are_errors_naming_them() {
    let cases: Vec<(LrFlags, &str)> = vec![
        (LrFlags { lr: None, ..spec_example() }, "--lr"),
        (LrFlags { train_samples: Some(5), ..spec_example() }, "--train-samples"),
        (LrFlags { train_iters: None, ..spec_example() }, "--train-iters"),
        (LrFlags { lr_decay_samples: Some(5), ..spec_example() }, "--lr-decay-samples"),
        (LrFlags { lr_warmup_fraction: Some(0.1), ..spec_example() }, "--lr-warmup-fraction"),
        (LrFlags { train_iters: None, train_samples: Some(1000), ..spec_example() }, "--lr-warmup-iters"),
        (LrFlags { lr_decay_style: "WSD".into(), ..spec_example() }, "--lr-wsd-decay-iters"),
        (LrFlags { lr_decay_style: "exp".into(), ..spec_example() }, "--lr-decay-style"),
        (LrFlags { start_weight_decay: Some(0.0), ..spec_example() }, "--weight-decay-incr-style"),
        (LrFlags { weight_decay_incr_style: "linear".into(), ..spec_example() }, "--end-weight-decay"),
        (LrFlags { lr_warmup_iters: 1000, ..spec_example() }, "--lr-warmup-iters"),
        (LrFlags { min_lr: 1.0, ..spec_example() }, "--min-lr"),
    ];
    for (flags, flag) in cases {
        let err = lr_schedule_config_from_flags(&flags).expect_err("inconsistent flags accepted").to_string();
        assert!(err.contains(flag), "error `{err}` does not name {flag}");
    }
}
