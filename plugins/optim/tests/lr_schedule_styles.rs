//! The LR and weight-decay formulas of SPEC §6.3/§6.4, checked at hand-picked sample counts
//! against values worked out in closed form here (not through the scheduler's code path).

use megatron_core::LrSchedule;
use megatron_optim::{DecayStyle, LrScheduleConfig, MegatronLrScheduler, WdIncrStyle, WsdDecayStyle};
use std::f64::consts::PI;

const TOL: f64 = 1e-12;

fn config(style: DecayStyle, warmup: f64, decay: u64) -> LrScheduleConfig {
    LrScheduleConfig {
        max_lr: 1e-3,
        min_lr: 1e-4,
        init_lr: 0.0,
        warmup_steps: warmup,
        decay_steps: decay,
        decay_style: style,
        wsd_decay_steps: None,
        wsd_decay_style: WsdDecayStyle::Exponential,
        start_wd: 0.01,
        end_wd: 0.01,
        wd_incr_steps: decay,
        wd_incr_style: WdIncrStyle::Constant,
        use_checkpoint_opt_param_scheduler: false,
    }
}

fn sched(c: LrScheduleConfig) -> MegatronLrScheduler {
    MegatronLrScheduler::new(c).unwrap()
}

fn close(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() <= TOL * want.abs().max(1e-6), "{what}: got {got}, want {want}");
}

#[test]
fn spec_worked_example_cosine_after_iterations_50_and_550() {
    // --lr 1e-4 --min-lr 1e-5 cosine, gbs 256, 1000 iters, 100 warmup iters.
    let mut c = config(DecayStyle::Cosine, 25_600.0, 256_000);
    c.max_lr = 1e-4;
    c.min_lr = 1e-5;
    let mut s = sched(c);
    assert_eq!(s.lr(), 0.0, "evaluated at n = 0 before the first step: the warmup init");
    for _ in 0..50 {
        s.step(256);
    }
    assert_eq!(s.num_steps(), 12_800);
    close(s.lr(), 5e-5, "after iteration 50");
    for _ in 50..550 {
        s.step(256);
    }
    close(s.lr(), 5.5e-5, "after iteration 550");
}

#[test]
fn warmup_ramps_from_init_lr_and_ends_at_max() {
    let mut c = config(DecayStyle::Linear, 100.0, 1000);
    c.init_lr = 1e-5;
    let s = sched(c);
    close(s.lr_at(0), 1e-5, "n=0");
    close(s.lr_at(50), 1e-5 + 0.5 * (1e-3 - 1e-5), "n=50");
    close(s.lr_at(100), 1e-3, "n=W is still warmup and reaches max");
}

#[test]
fn linear_decay_points() {
    let s = sched(config(DecayStyle::Linear, 100.0, 1100));
    close(s.lr_at(100), 1e-3, "end of warmup");
    close(s.lr_at(600), 0.5 * (1e-3 + 1e-4), "half way: the mean of max and min");
    close(s.lr_at(350), 1e-4 + 0.75 * 9e-4, "a quarter of the way");
    close(s.lr_at(1100), 1e-4, "n = D");
    close(s.lr_at(1101), 1e-4, "past D");
    close(s.lr_at(1_000_000), 1e-4, "far past D");
}

#[test]
fn cosine_decay_points() {
    let s = sched(config(DecayStyle::Cosine, 0.0, 1000));
    close(s.lr_at(0), 1e-3, "no warmup: n=0 is max");
    let quarter = 1e-4 + 9e-4 * 0.5 * (1.0 + (PI / 4.0).cos());
    close(s.lr_at(250), quarter, "r = 1/4");
    close(s.lr_at(500), 5.5e-4, "r = 1/2");
    close(s.lr_at(750), 1e-4 + 9e-4 * 0.5 * (1.0 - (PI / 4.0).cos()), "r = 3/4");
    close(s.lr_at(1000), 1e-4, "r = 1");
    close(s.lr_at(5000), 1e-4, "past D");
}

#[test]
fn constant_style_ignores_decay_steps() {
    let s = sched(config(DecayStyle::Constant, 10.0, 100));
    close(s.lr_at(5), 5e-4, "warmup still applies");
    close(s.lr_at(11), 1e-3, "after warmup");
    close(s.lr_at(10_000), 1e-3, "past D stays max");
}

#[test]
fn inverse_square_root_points() {
    let mut c = config(DecayStyle::InverseSquareRoot, 100.0, 1_000_000);
    c.max_lr = 1.0;
    c.min_lr = 0.05;
    let s = sched(c.clone());
    close(s.lr_at(100), 1.0, "end of warmup");
    close(s.lr_at(400), 0.5, "sqrt(100)/sqrt(400)");
    close(s.lr_at(10_000), 0.1, "sqrt(100)/sqrt(10000)");
    close(s.lr_at(250_000), 0.05, "0.02 is floored at min_lr");
    close(s.lr_at(1_000_001), 0.05, "past D: min_lr");
    c.warmup_steps = 0.0;
    let s = sched(c);
    close(s.lr_at(0), 1.0, "W = 0 and n = 0 both count as 1");
    close(s.lr_at(4), 0.5, "1/sqrt(4)");
}

#[test]
fn wsd_variants_hold_then_anneal_over_the_last_steps() {
    // D = 1000, W = 100, anneal over the last 200 samples (from n = 800).
    let sqrt_half = 0.5f64.sqrt();
    for (style, mid_coeff) in [
        (WsdDecayStyle::Linear, 0.5),
        (WsdDecayStyle::Cosine, 0.5),
        (WsdDecayStyle::Exponential, 2.0 * sqrt_half - 1.0),
        (WsdDecayStyle::MinusSqrt, 1.0 - sqrt_half),
    ] {
        let mut c = config(DecayStyle::Wsd, 100.0, 1000);
        c.wsd_decay_steps = Some(200);
        c.wsd_decay_style = style;
        let s = sched(c);
        let what = style.as_str();
        close(s.lr_at(50), 5e-4, what);
        close(s.lr_at(101), 1e-3, what);
        close(s.lr_at(800), 1e-3, what);
        close(s.lr_at(900), 1e-4 + mid_coeff * 9e-4, what);
        close(s.lr_at(1000), 1e-4, what);
        close(s.lr_at(1001), 1e-4, what);
    }
    let mut c = config(DecayStyle::Wsd, 0.0, 1000);
    c.wsd_decay_steps = Some(400);
    c.wsd_decay_style = WsdDecayStyle::Cosine;
    let s = sched(c);
    close(s.lr_at(700), 1e-4 + 9e-4 * 0.5 * (1.0 + (PI * 0.25).cos()), "cosine at w = 1/4");
}

#[test]
fn weight_decay_increment_styles() {
    let mut c = config(DecayStyle::Linear, 0.0, 1000);
    c.start_wd = 0.1;
    c.end_wd = 0.1;
    let s = sched(c.clone());
    for n in [0, 500, 5000] {
        close(s.weight_decay_at(n), 0.1, "constant");
    }
    c.start_wd = 0.0;
    c.wd_incr_style = WdIncrStyle::Linear;
    let s = sched(c.clone());
    close(s.weight_decay_at(0), 0.0, "linear start");
    close(s.weight_decay_at(250), 0.025, "linear quarter");
    close(s.weight_decay_at(1000), 0.1, "linear end");
    close(s.weight_decay_at(2000), 0.1, "linear past end");
    c.start_wd = 0.02;
    c.wd_incr_style = WdIncrStyle::Cosine;
    let s = sched(c);
    close(s.weight_decay_at(0), 0.02, "cosine start");
    close(s.weight_decay_at(250), 0.02 + 0.08 * 0.5 * (1.0 - (PI / 4.0).cos()), "cosine quarter");
    close(s.weight_decay_at(500), 0.06, "cosine half");
    close(s.weight_decay_at(1000), 0.1, "cosine end");
}

#[test]
fn trait_view_follows_the_step_count() {
    let mut c = config(DecayStyle::Linear, 0.0, 1000);
    c.start_wd = 0.0;
    c.end_wd = 0.1;
    c.wd_incr_style = WdIncrStyle::Linear;
    let mut s = sched(c);
    s.step(300);
    s.step(200);
    assert_eq!(s.num_steps(), 500);
    close(s.lr(), s.lr_at(500), "lr()");
    close(s.lr(), 5.5e-4, "lr() value");
    close(s.weight_decay(), 0.05, "weight_decay()");
}

#[test]
fn invalid_configurations_name_the_flags() {
    let cases: Vec<(Edit, &str)> = vec![
        (|c| c.min_lr = 2e-3, "--min-lr"),
        (|c| c.min_lr = -1.0, "--min-lr"),
        (|c| c.init_lr = 1.0, "--lr-warmup-init"),
        (|c| c.warmup_steps = 1000.0, "--lr-warmup-iters"),
        (|c| c.decay_steps = 0, "--lr-decay-iters"),
        (|c| c.decay_style = DecayStyle::Wsd, "--lr-wsd-decay-iters"),
        (|c| c.end_wd = 0.0, "--end-weight-decay"),
        (|c| c.start_wd = 0.0, "--weight-decay-incr-style"),
        (|c| c.max_lr = f64::NAN, "--lr"),
    ];
    for (edit, flag) in cases {
        let mut c = config(DecayStyle::Linear, 10.0, 1000);
        edit(&mut c);
        let err = MegatronLrScheduler::new(c).expect_err("invalid config accepted").to_string();
        assert!(err.contains(flag), "error `{err}` does not name {flag}");
    }
}

/// An edit of a valid configuration.
type Edit = fn(&mut LrScheduleConfig);
