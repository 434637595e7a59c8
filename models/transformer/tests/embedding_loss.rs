//! Vocab-parallel cross entropy and the language-model embedding (tp = 1) against naive host
//! computations and finite differences.

mod common;

use common::*;
use megatron_core::{HostBuffer, ParallelContext, Param};
use megatron_transformer::grad_check::{check_params, worst};
use megatron_transformer::{LanguageModelEmbedding, StepInfo, VocabParallelCrossEntropy};

#[test]
fn cross_entropy_matches_log_softmax_and_its_backward_matches_finite_differences() {
    let b = backend();
    let bk = b.as_ref();
    let (n, v) = (6, 11);
    let lv = random_vec(n * v, 1, 4.0);
    let targets: Vec<i32> = (0..n as i32).map(|i| (i * 7) % v as i32).collect();
    let d_loss: Vec<f32> = (0..n).map(|i| 0.5 + i as f32 * 0.25).collect();
    let t = bk.from_host(HostBuffer::I32(targets.clone()), &[n]).unwrap();
    let mut ce = VocabParallelCrossEntropy::new(b.clone(), ParallelContext::single()).unwrap();
    let loss_of =
        |ce: &mut VocabParallelCrossEntropy, lv: &[f32]| ce.forward(&tensor(bk, lv.to_vec(), &[n, v]), &t, 0).unwrap();
    let losses = loss_of(&mut ce, &lv);
    for i in 0..n {
        let row = &lv[i * v..(i + 1) * v];
        let m = row.iter().cloned().fold(f32::MIN, f32::max) as f64;
        let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
        let want = lse - row[targets[i] as usize] as f64;
        assert!((losses[i] - want).abs() < 1e-5 * want.abs().max(1.0), "row {i}: {} vs {want}", losses[i]);
    }

    let mut logits = tensor(bk, lv.clone(), &[n, v]);
    ce.forward(&logits, &t, 0).unwrap();
    let dl = tensor(bk, d_loss.clone(), &[n]);
    ce.backward_inplace(&mut logits, &t, 0, &dl).unwrap();
    let grad = host(bk, &logits);
    let idx: Vec<usize> = (0..n * v).step_by(5).chain([targets[2] as usize + 2 * v]).collect();
    let numeric =
        fd_input(&lv, &idx, 1e-2, |x| loss_of(&mut ce, x).iter().zip(&d_loss).map(|(l, &d)| l * d as f64).sum());
    let analytic: Vec<f64> = idx.iter().map(|&i| grad[i] as f64).collect();
    assert_close("d_logits", &analytic, &numeric, 5e-3, 1e-3);
}

#[test]
fn embedding_adds_positions_and_its_backward_matches_finite_differences() {
    let bld = builder(3);
    let bk = bld.backend.clone();
    let bk = bk.as_ref();
    let (batch, seq, c, vocab, max_pos) = (2, 3, 4, 10, 5);
    let mut emb = LanguageModelEmbedding::new(&bld, "embedding", vocab, max_pos, c, 0.5, 0.0).unwrap();
    assert_eq!(emb.word_embeddings.weight.name, "embedding.word_embeddings.weight");
    assert_eq!(emb.position_embeddings.as_ref().unwrap().name, "embedding.position_embeddings.weight");
    let ids_v = vec![3, 9, 3, 0, 1, 7];
    let ids = bk.from_host(HostBuffer::I32(ids_v.clone()), &[6]).unwrap();
    let step = StepInfo { batch, seq, train: true, seed: 5 };
    let mut out = zeros(bk, &[batch, seq, c]);
    emb.forward(&ids, &mut out, &step).unwrap();
    let (w, p, got) = (
        host(bk, &emb.word_embeddings.weight.value),
        host(bk, &emb.position_embeddings.as_ref().unwrap().value),
        host(bk, &out),
    );
    for (i, &id) in ids_v.iter().enumerate() {
        for k in 0..c {
            let want = w[id as usize * c + k] + p[(i % seq) * c + k];
            assert!((got[i * c + k] - want).abs() < 1e-6);
        }
    }

    let r = random_vec(batch * seq * c, 8, 1.0);
    emb.backward(&ids, &tensor(bk, r.clone(), &[batch, seq, c]), &step).unwrap();
    fn params(m: &mut LanguageModelEmbedding) -> Vec<&mut Param> {
        m.params_mut()
    }
    let mut loss = |m: &mut LanguageModelEmbedding| {
        let mut out = zeros(bk, &[batch, seq, c]);
        m.forward(&ids, &mut out, &step)?;
        Ok(probe(bk, &out, &r))
    };
    // 40 word-table elements cover used (repeated id 3) and unused rows (zero gradient).
    let samples = check_params(&mut emb, bk, params, &|_| true, &mut loss, 40, 1e-2, 1e-3).unwrap();
    let worst = worst(&samples).unwrap();
    assert!(worst.rel_err < 1e-3, "{worst:?}");
    assert!(samples.iter().any(|s| s.analytic == 0.0) && samples.iter().any(|s| s.analytic != 0.0));
}
