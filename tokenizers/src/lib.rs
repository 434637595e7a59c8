//! Tokenizers: GPT-2 byte-level BPE, null tokenizer
