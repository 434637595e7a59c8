//! Text generation: sampling ([`sampling`]), the static-batching generation loop over the GPT
//! kv cache ([`engine`]), rebuilding a model from a checkpoint ([`loader`]) and the
//! `megatron generate` command ([`cli`]).

pub mod chat;
pub mod cli;
pub mod engine;
pub mod loader;
#[cfg(feature = "t5")]
pub mod t5;
/// Sampling lives in the serving crate (the continuous-batching engine uses it too).
pub use megatron_serving::sampling;

pub use engine::{Generated, GenerationParams, Generator};
pub use loader::{load_model, load_model_on, LoadArgs, LoadedModel};
pub use sampling::SamplingParams;
