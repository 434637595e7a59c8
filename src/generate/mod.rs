//! Text generation: sampling ([`sampling`]), the static-batching generation loop over the GPT
//! kv cache ([`engine`]), rebuilding a model from a checkpoint ([`loader`]), model-parallel
//! generation ([`ranks`]) and the `megatron generate` command ([`cli`]).

pub mod chat;
pub mod cli;
pub mod engine;
#[cfg(feature = "hybrid")]
pub mod hybrid;
pub mod loader;
pub mod ranks;
#[cfg(feature = "t5")]
pub mod t5;
/// Sampling lives in the serving crate (the continuous-batching engine uses it too).
pub use megatron_serving::sampling;

pub use engine::{Generated, GenerationParams, Generator};
pub use loader::{load_model, load_model_on, LoadArgs, LoadedModel};
pub use sampling::SamplingParams;
