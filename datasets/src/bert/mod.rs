//! Megatron's `BERTMaskedWordPieceDataset` (SPEC §2.11): the sample index of the C++
//! `build_mapping` ([`sample_index`], `std::mt19937` target lengths, `std::mt19937_64`
//! shuffle), the masked-LM predictions ([`masking`]) and `__getitem__` ([`dataset`]), with the
//! random draws of both languages in [`rng`]. For the same sentence-split `.bin/.idx`, seed,
//! sequence length and sample count, the samples equal Megatron's
//! (`datasets/tests/bert_dataset.rs`, fixtures made by `scripts/bert_dataset_oracle.py`).

pub mod dataset;
pub mod glue;
pub mod masking;
pub mod plugin;
pub mod race;
pub mod rng;
pub mod sample_index;

pub use dataset::{masking_vocab, masking_vocab_from_file, BertDatasetConfig, BertMaskedDataset, BertSample};
pub use masking::{create_masked_lm_predictions, MaskingConfig, MaskingVocab};
pub use sample_index::{build_sample_index, SampleIndexSpec};
