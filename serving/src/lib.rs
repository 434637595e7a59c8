//! `megatron-serving`: what `megatron serve` runs besides loading a checkpoint.
//!
//! - [`sampling`]: Megatron's token sampling (greedy, temperature, top-k/top-p) and log-probs;
//! - [`engine`]: continuous (in-flight) batching — one decode loop over a slotted kv cache that
//!   admits queued sequences between steps and retires finished or cancelled ones, each with
//!   its own sampling settings and seeded generator;
//! - [`api`]: the OpenAI endpoints (JSON and server-sent events) over the engine;
//! - [`ranks`]: tensor/pipeline-parallel serving — rank 0 drives, the other ranks follow;
//! - [`openai`]: the OpenAI-compatible request/response protocol (completions, chat, errors);
//! - [`text`]: incremental detokenization and stop sequences for streamed choices;
//! - [`http`]: the bounded HTTP/1.1 request reader shared by every endpoint;
//! - [`bench`]: the loopback load generator of `megatron bench serve`.

pub mod api;
pub mod bench;
pub mod engine;
pub mod http;
pub mod openai;
pub mod ranks;
pub mod sampling;
pub mod text;

pub use engine::{engine, Engine, EngineConfig, EngineHandle, Event, Finish, SeqRequest, Submit, SubmitError};
