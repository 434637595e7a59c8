//! Offline tools of the `megatron` CLI (Megatron-LM's `tools/` scripts).

#[cfg(feature = "datasets")]
pub mod bert_inspect;
#[cfg(feature = "datasets")]
pub mod data_inspect;
#[cfg(feature = "datasets")]
pub mod data_inspect_t5;
#[cfg(feature = "datasets")]
pub mod preprocess;
#[cfg(feature = "tokenizers")]
pub mod tokenizer_train;
