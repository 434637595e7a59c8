//! GPT model (GPT-2/GPT-3 style) built from transformer specs
