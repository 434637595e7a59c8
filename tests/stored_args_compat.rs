//! The `args` a checkpoint stores keep their flat keys now that the tokenizer flags are one
//! flattened group (`TokenizerArgs`, src/tokenizer_flags.rs), so checkpoints saved before the
//! change still load.
//!
//! `tests/fixtures/pretrain_args_main_c8a6cf0.json` is the `args` object of the metadata.json
//! written by main at c8a6cf0 (before the change), made with
//!
//! ```text
//! megatron pretrain --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 \
//!   --micro-batch-size 2 --lr 1e-3 --lr-warmup-iters 0 --mock-data --tokenizer-type NullTokenizer \
//!   --vocab-size 100 --train-iters 2 --save fx --save-interval 2 --seed 7
//! python3 -c "import json; m = json.load(open('fx/iter_0000002/metadata.json')); \
//!   print(json.dumps(m['args'], indent=1, sort_keys=True))"
//! ```
#![cfg(all(feature = "gpt", feature = "checkpoint", feature = "tokenizers"))]

use clap::Parser;
use megatron::cli::{Cli, Command};
use megatron::generate::loader::{gpt_config_from_args, tokenizer_for, LoadArgs};
use megatron_core::Registry;
use serde_json::Value;
use std::path::Path;

const FIXTURE: &str = include_str!("fixtures/pretrain_args_main_c8a6cf0.json");
const FLAGS: &str = "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2 \
     --lr 1e-3 --lr-warmup-iters 0 --mock-data --tokenizer-type NullTokenizer --vocab-size 100 --train-iters 2 \
     --save fx --save-interval 2 --seed 7";

#[test]
fn todays_args_serialise_with_the_keys_and_values_old_checkpoints_hold() {
    let old: Value = serde_json::from_str(FIXTURE).unwrap();
    let argv = ["megatron", "pretrain"].into_iter().chain(FLAGS.split_whitespace());
    let Command::Pretrain(args) = Cli::try_parse_from(argv).unwrap().command else { panic!("pretrain") };
    let new = serde_json::to_value(&*args).unwrap();
    let (old, new) = (old.as_object().unwrap(), new.as_object().unwrap());
    for (key, value) in old {
        assert_eq!(new.get(key), Some(value), "stored arg `{key}` changed");
    }
    // The tokenizer flags sit at the top level, not under a `tokenizer` key.
    assert!(!new.contains_key("tokenizer"));
    for key in ["tokenizer_type", "vocab_file", "merge_file", "tokenizer_model", "vocab_size", "vocab_extra_ids"] {
        assert!(new.contains_key(key), "{key}");
    }
}

#[test]
fn an_old_checkpoints_args_still_build_its_model_config_and_tokenizer() {
    let old: Value = serde_json::from_str(FIXTURE).unwrap();
    let dir = Path::new("old-checkpoint");
    let config = gpt_config_from_args(&old, 100, 128, dir).unwrap();
    assert_eq!((config.num_layers, config.hidden_size, config.seq_length), (2, 32, 16));
    let tokenizer = tokenizer_for(&Registry::builtin().unwrap(), &LoadArgs::default(), &old).unwrap();
    assert_eq!(tokenizer.name(), "NullTokenizer");
    assert_eq!(tokenizer.vocab_size(), 101, "NullTokenizer adds its eod to --vocab-size 100");
}
