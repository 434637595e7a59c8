//! Tensor parallelism: the tiny BERT of the finite-difference test run with tp = 2 (two ranks
//! as threads over the `local` communicator) matches tp = 1: the same initial weights, the
//! same lm and sop losses, the same gradients once the shards are put back together (pre-LN
//! with the binary head and hidden dropout; post-LN without the head).

use megatron_bert::{BertBatch, BertConfig, BertLosses, BertModel, LayerNormPlacement};
use megatron_comm_local::LocalCommunicator;
use megatron_core::{Backend, Mode, ParallelContext, RankGrid};
use megatron_cpu::CpuBackend;
use std::sync::Arc;

type Shards = (BertLosses, Vec<(String, Vec<usize>, Option<usize>, Vec<f32>, Vec<f32>)>);

fn config(placement: LayerNormPlacement, binary: bool, dropout: f32) -> BertConfig {
    BertConfig {
        num_layers: 2,
        hidden_size: 16,
        num_attention_heads: 2,
        ffn_hidden_size: Some(24),
        max_position_embeddings: 16,
        vocab_size: 50,
        make_vocab_size_divisible_by: 32,
        bert_binary_head: binary,
        layernorm: placement,
        hidden_dropout: dropout,
        attention_dropout: 0.0,
        init_method_std: 0.3,
        seed: 5,
        ..Default::default()
    }
}

fn batch() -> BertBatch {
    let (b, s) = (3, 8);
    let lengths = vec![8, 5, 3];
    let mut x = BertBatch {
        batch: b,
        seq: s,
        tokens: vec![0; b * s],
        types: vec![0; b * s],
        lengths: lengths.clone(),
        labels: vec![0; b * s],
        loss_mask: vec![0.0; b * s],
        is_random: vec![0, 1, 1],
        seed: 9,
    };
    for (r, &len) in lengths.iter().enumerate() {
        for t in 0..len {
            let i = r * s + t;
            x.tokens[i] = ((r * 17 + t * 7) % 50) as i32;
            x.types[i] = (2 * t >= len) as i32;
            if (t + 2 * r) % 3 == 0 {
                x.labels[i] = ((r * 3 + t * 11 + 1) % 50) as i32;
                x.loss_mask[i] = 1.0;
            }
        }
    }
    x
}

fn run(cfg: BertConfig, ctx: ParallelContext) -> Shards {
    let bk: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut m = BertModel::new(cfg, bk.clone(), ctx).unwrap();
    let x = batch();
    let l = m.forward_bert(&x, Mode::Train).unwrap();
    let sop = if l.sop_rows > 0.0 { 1.0 / l.sop_rows as f32 } else { 0.0 };
    m.backward_bert(1.0 / l.lm_tokens as f32, sop).unwrap();
    let host = |t| bk.to_host(t).unwrap().to_f32_vec();
    let params = m
        .params()
        .iter()
        .map(|p| (p.name.clone(), p.value.shape().to_vec(), p.layout.tp_axis, host(&p.value), host(&p.grad)))
        .collect();
    (l, params)
}

fn assemble(shards: [&[f32]; 2], shape: &[usize], axis: Option<usize>) -> Vec<f32> {
    match axis {
        None => shards[0].to_vec(),
        Some(0) => shards.concat(),
        Some(_) => {
            let cols = shape[1];
            (0..shape[0]).flat_map(|r| shards.iter().flat_map(move |s| s[r * cols..(r + 1) * cols].to_vec())).collect()
        }
    }
}

fn rel(a: &[f32], b: &[f32]) -> f64 {
    let max = b.iter().fold(1e-12f64, |m, &x| m.max(x.abs() as f64));
    a.iter().zip(b).fold(0f64, |m, (&x, &y)| m.max((x as f64 - y as f64).abs())) / max
}

fn check(cfg: BertConfig) {
    let (ref_loss, ref_params) = run(cfg.clone(), ParallelContext::single());
    let grid = RankGrid::new(2, 2, 1, 1).unwrap();
    let comms = LocalCommunicator::world(2, std::time::Duration::from_secs(60));
    let results: Vec<Shards> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, comm)| {
                let (cfg, ctx) = (cfg.clone(), grid.context(r, comm.clone()));
                s.spawn(move || run(cfg, ctx))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (l, _) in &results {
        let lm = (l.lm_loss_sum - ref_loss.lm_loss_sum).abs() / ref_loss.lm_loss_sum;
        let sop = (l.sop_loss_sum - ref_loss.sop_loss_sum).abs() / ref_loss.sop_loss_sum.max(1e-12);
        assert!(lm < 1e-5 && sop < 1e-5, "tp=2 losses {l:?} vs tp=1 {ref_loss:?}");
    }
    let mut worst = (String::new(), 0f64);
    for (i, (name, _, _, value, grad)) in ref_params.iter().enumerate() {
        let (a, b) = (&results[0].1[i], &results[1].1[i]);
        assert_eq!(&a.0, name);
        assert_eq!(&assemble([&a.3, &b.3], &a.1, a.2), value, "initial {name} must not depend on the TP size");
        let err = rel(&assemble([&a.4, &b.4], &a.1, a.2), grad);
        if err > worst.1 {
            worst = (name.clone(), err);
        }
        assert!(err < 1e-4, "gradient of {name}: tp=2 vs tp=1 relative error {err:.3e}");
    }
    println!("tp=2 vs tp=1 worst gradient: {} {:.3e}", worst.0, worst.1);
}

#[test]
fn tp2_matches_tp1_pre_ln_binary_head_with_hidden_dropout() {
    check(config(LayerNormPlacement::Pre, true, 0.1));
}

#[test]
fn tp2_matches_tp1_post_ln_without_binary_head() {
    check(config(LayerNormPlacement::Post, false, 0.0));
}
