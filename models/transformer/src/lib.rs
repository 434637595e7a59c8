//! Transformer building blocks: parallel linears, vocab-parallel embedding and cross entropy, attention, MLP, norms, layers
