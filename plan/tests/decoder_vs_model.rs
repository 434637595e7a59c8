//! The planner's decoder activation term against the bytes a real GPT keeps for backward
//! (`TransformerBlock::saved_activations_mut` after one training forward, ranks as threads, as
//! models/gpt/examples/activation_memory.rs counts them): exact, per rank, for tensor
//! parallelism with and without `--sequence-parallel` in fp32 and bf16, and context parallelism
//! in fp32.

use megatron_comm_local::LocalCommunicator;
use megatron_core::{Backend, Batch, DType, Mode, Model, RankGrid};
use megatron_cpu::CpuBackend;
use megatron_gpt::{GptConfig, GptModel};
use megatron_plan::*;
use std::sync::Arc;

const LAYERS: usize = 2;
const HIDDEN: usize = 64;
const HEADS: usize = 4;
const SEQ: usize = 32;
const MBS: usize = 2;
const VOCAB: usize = 128;

/// Each rank's decoder saved-activation bytes after one training forward.
fn measure(tp: usize, cp: usize, sp: bool, dtype: DType) -> Vec<u128> {
    let mut c = GptConfig::new(LAYERS, HIDDEN, HEADS, SEQ, VOCAB);
    c.max_position_embeddings = SEQ;
    c.hidden_dropout = 0.0;
    c.attention_dropout = 0.0;
    c.sequence_parallel = sp;
    c.params_dtype = dtype;
    let n = MBS * SEQ;
    let tokens: Vec<i32> = (0..n).map(|i| (i * 31 % VOCAB) as i32).collect();
    let batch = Batch {
        micro_batch_size: MBS,
        seq_length: SEQ,
        labels: tokens.iter().map(|t| (t + 1) % VOCAB as i32).collect(),
        tokens,
        loss_mask: vec![1.0; n],
        seed: 1,
    };
    let world = tp * cp;
    let grid = RankGrid::new(world, tp, cp, 1).unwrap();
    let comms = LocalCommunicator::world(world, std::time::Duration::from_secs(60));
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|r| {
                let (c, ctx, batch) = (c.clone(), grid.context(r, comms[r].clone()), &batch);
                s.spawn(move || {
                    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
                    let mut model = GptModel::new(c, backend, ctx).unwrap();
                    model.forward_stage(0, batch, None, Mode::Train).unwrap();
                    let saved = model.decoder.saved_activations_mut();
                    saved.iter().map(|t| (t.numel() * t.dtype().size()) as u128).sum::<u128>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn input(tp: usize, cp: usize, sp: bool, precision: Precision) -> PlanInput {
    PlanInput {
        num_layers: LAYERS,
        hidden: HIDDEN,
        heads: HEADS,
        query_groups: HEADS,
        kv_channels: HIDDEN / HEADS,
        ffn: 4 * HIDDEN,
        swiglu: false,
        padded_vocab: VOCAB,
        max_position_embeddings: SEQ,
        learned_positions: true,
        untied: false,
        seq: SEQ,
        micro_batch: MBS,
        num_microbatches: 1,
        tp,
        pp: 1,
        dp: 1,
        virtual_pp: 1,
        optimizer_floats: 2,
        distributed_optimizer: false,
        precision,
        recompute: Recompute::None,
        bucket_elems: None,
        fp32_residual: false,
        rms_norm: false,
        sequence_parallel: sp,
        cp,
    }
}

#[test]
fn decoder_activations_match_the_model_under_tp_sp_and_cp() {
    for (dtype, precision) in [(DType::F32, Precision::Fp32), (DType::BF16, Precision::Half)] {
        let mut by_layout = Vec::new();
        // Context parallelism in both precisions: the half ring keeps `context` in the model dtype
        // and its lse in fp32, as the unsplit attention does.
        let cps: &[(usize, usize, bool)] = &[(1, 2, false), (2, 2, true)];
        let tp_sp = [(1, 1, false), (2, 1, false), (2, 1, true)];
        for &(tp, cp, sp) in tp_sp.iter().chain(cps) {
            let x = input(tp, cp, sp, precision);
            let planned = decoder_activation_bytes(&x, LAYERS, true);
            for (rank, got) in measure(tp, cp, sp, dtype).into_iter().enumerate() {
                assert_eq!(
                    planned, got,
                    "{dtype:?} tp{tp} cp{cp} sp {sp}: rank {rank} keeps {got} B, plan says {planned}"
                );
            }
            // The stage total adds the logits of every token of the rank (SP gathers them).
            let stage = plan(&x).stages[0].activation_bytes;
            let n = (MBS * SEQ / cp) as u128;
            let e = if precision == Precision::Half { 2 } else { 4 };
            assert_eq!(stage, planned + n * (VOCAB / tp) as u128 * e + 3 * n * 4);
            by_layout.push(planned);
        }
        // SP saves at tp2, CP halves every per-token tensor.
        assert!(by_layout[2] < by_layout[1], "{dtype:?}: SP must shrink the tp2 activations");
        if dtype == DType::F32 {
            assert_eq!(by_layout[3] * 2, by_layout[0], "cp2 keeps half of cp1");
        }
    }
}
