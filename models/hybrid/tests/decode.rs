//! Recurrent decoding (cached conv/SSM states + the attention KV cache) gives the logits of
//! the full training-path forward at every position (tolerance 1e-4 of the logit scale).

use megatron_core::{Backend, Model, ParallelContext};
use megatron_cpu::CpuBackend;
use megatron_hybrid::{HybridConfig, HybridModel};
use std::sync::Arc;

#[test]
fn recurrent_decoding_matches_the_full_forward() {
    let (vocab, seq, batch) = (40, 9, 2);
    let mut c = HybridConfig::new("M*-M", 16, 2, seq, vocab);
    c.mamba_head_dim = 4;
    c.mamba_num_groups = 2;
    c.mamba_state_dim = 4;
    c.mamba_chunk_size = 4;
    c.init_method_std = 0.2;
    c.make_vocab_size_divisible_by = 16;
    c.seed = 5;
    let be: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut m = HybridModel::new(c, "hybrid", be.clone(), ParallelContext::single()).unwrap();
    let tokens: Vec<i32> = (0..batch * seq).map(|i| ((i * 11 + 2) % vocab) as i32).collect();
    let full = be.to_host(&m.logits(&tokens, batch, seq).unwrap()).unwrap().to_f32_vec(); // (B, T, V)
    let v = m.padded_vocab_size();
    let mut cache = m.new_cache(batch, seq).unwrap();
    let mut worst = 0.0f32;
    for t in 0..seq {
        let step: Vec<i32> = (0..batch).map(|b| tokens[b * seq + t]).collect();
        let logits = m.decode_step(&step, &mut cache).unwrap(); // (B, V)
        for b in 0..batch {
            for k in 0..vocab {
                let want = full[(b * seq + t) * v + k];
                worst = worst.max((logits[b * v + k] - want).abs() / want.abs().max(1.0));
            }
        }
    }
    assert!(worst < 1e-4, "worst relative logit difference {worst}");
    assert!(m.decode_step(&[0, 0], &mut cache).is_err(), "a full KV cache is an error");
}
