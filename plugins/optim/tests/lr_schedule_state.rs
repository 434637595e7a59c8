//! The LR scheduler's state dict: Megatron's keys, round trip, the match-or-override rule and
//! legacy key names (SPEC §6.3).

use megatron_core::LrSchedule;
use megatron_optim::{DecayStyle, LrScheduleConfig, MegatronLrScheduler, WdIncrStyle, WsdDecayStyle};
use serde_json::json;

fn config() -> LrScheduleConfig {
    LrScheduleConfig {
        max_lr: 3e-4,
        min_lr: 3e-5,
        init_lr: 0.0,
        warmup_steps: 640.0,
        decay_steps: 64_000,
        decay_style: DecayStyle::Cosine,
        wsd_decay_steps: None,
        wsd_decay_style: WsdDecayStyle::Exponential,
        start_wd: 0.0,
        end_wd: 0.1,
        wd_incr_steps: 64_000,
        wd_incr_style: WdIncrStyle::Linear,
        use_checkpoint_opt_param_scheduler: false,
    }
}

fn stepped(c: LrScheduleConfig, samples: u64) -> MegatronLrScheduler {
    let mut s = MegatronLrScheduler::new(c).unwrap();
    s.step(samples);
    s
}

#[test]
fn state_dict_has_megatron_keys_and_round_trips() {
    let s = stepped(config(), 12_345);
    let state = s.state_dict();
    let mut keys: Vec<&str> = state.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "end_wd",
            "lr_decay_steps",
            "lr_decay_style",
            "lr_warmup_steps",
            "max_lr",
            "min_lr",
            "num_steps",
            "start_wd",
            "wd_incr_steps",
            "wd_incr_style"
        ]
    );
    assert_eq!(state["lr_decay_style"], json!("cosine"));
    assert_eq!(state["lr_warmup_steps"], json!(640), "integral counts are written as integers");
    assert_eq!(state["num_steps"], json!(12_345));

    // Through text, as a checkpoint stores it.
    let text = serde_json::to_string(&state).unwrap();
    let mut fresh = MegatronLrScheduler::new(config()).unwrap();
    fresh.load_state_dict(&serde_json::from_str(&text).unwrap(), false).unwrap();
    assert_eq!(fresh.num_steps(), 12_345);
    assert_eq!(fresh.lr(), s.lr());
    assert_eq!(fresh.weight_decay(), s.weight_decay());
}

#[test]
fn fractional_warmup_round_trips_as_a_float() {
    let mut c = config();
    c.warmup_steps = 0.01 * 64_001.0;
    let s = stepped(c.clone(), 7);
    let state = s.state_dict();
    assert!(state["lr_warmup_steps"].is_f64());
    let mut fresh = MegatronLrScheduler::new(c).unwrap();
    fresh.load_state_dict(&state, false).unwrap();
    assert_eq!(fresh.num_steps(), 7);
}

#[test]
fn mismatch_errors_name_the_field_and_the_override_flag() {
    let state = stepped(config(), 100).state_dict();
    let edits: Vec<(Edit, &str)> = vec![
        (|c| c.max_lr = 1e-4, "max_lr"),
        (|c| c.min_lr = 0.0, "min_lr"),
        (|c| c.warmup_steps = 0.0, "lr_warmup_steps"),
        (|c| c.decay_steps = 32_000, "lr_decay_steps"),
        (|c| c.decay_style = DecayStyle::Linear, "lr_decay_style"),
        (|c| c.end_wd = 0.2, "end_wd"),
        (|c| c.wd_incr_steps = 1000, "wd_incr_steps"),
        (|c| c.wd_incr_style = WdIncrStyle::Cosine, "wd_incr_style"),
    ];
    for (edit, field) in edits {
        let mut c = config();
        edit(&mut c);
        let mut s = MegatronLrScheduler::new(c.clone()).unwrap();
        let err = s.load_state_dict(&state, false).unwrap_err().to_string();
        assert!(err.contains(field) && err.contains("--override-opt_param-scheduler"), "{err}");
        assert_eq!(s.num_steps(), 0, "a failed load leaves the scheduler untouched");

        // With the override the configured values win and num_steps is still restored.
        s.load_state_dict(&state, true).unwrap();
        assert_eq!(s.num_steps(), 100);
        assert_eq!(s.config(), &c);
    }
}

#[test]
fn use_checkpoint_takes_the_stored_values() {
    let state = stepped(config(), 100).state_dict();
    let mut c = config();
    c.max_lr = 1e-3;
    c.decay_style = DecayStyle::Linear;
    c.use_checkpoint_opt_param_scheduler = true;
    let mut s = MegatronLrScheduler::new(c).unwrap();
    s.load_state_dict(&state, false).unwrap();
    assert_eq!(s.config().max_lr, 3e-4);
    assert_eq!(s.config().decay_style, DecayStyle::Cosine);
    assert_eq!(s.num_steps(), 100);
    let err = s.load_state_dict(&state, true).unwrap_err().to_string();
    assert!(err.contains("mutually exclusive"), "{err}");
}

#[test]
fn legacy_keys_are_accepted() {
    let mut c = config();
    c.wd_incr_style = WdIncrStyle::Constant;
    c.start_wd = 0.1;
    let legacy = json!({
        "start_lr": 3e-4, "min_lr": 3e-5, "warmup_iter": 640, "end_iter": 64_000,
        "decay_style": "cosine", "num_iters": 2048
    });
    let mut s = MegatronLrScheduler::new(c).unwrap();
    s.load_state_dict(&legacy, false).unwrap();
    assert_eq!(s.num_steps(), 2048);
}

#[test]
fn malformed_state_is_an_error_naming_the_key() {
    let mut state = stepped(config(), 1).state_dict();
    state.as_object_mut().unwrap().remove("num_steps");
    let err = MegatronLrScheduler::new(config()).unwrap().load_state_dict(&state, false).unwrap_err().to_string();
    assert!(err.contains("num_steps"), "{err}");
    let mut state = stepped(config(), 1).state_dict();
    state["num_steps"] = json!(-3);
    let err = MegatronLrScheduler::new(config()).unwrap().load_state_dict(&state, false).unwrap_err().to_string();
    assert!(err.contains("num_steps"), "{err}");
}

/// An edit of a valid configuration.
type Edit = fn(&mut LrScheduleConfig);
