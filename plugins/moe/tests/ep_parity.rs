//! Expert parallelism with ranks as threads (`local` communicator): ep = 2 against ep = 1 on
//! the same tokens — outputs, input gradients, router and expert gradients within 1e-5
//! relative — for the alltoall and allgather dispatchers, dropless and with capacity dropping;
//! and expert TP 2 over two ranks (each rank's expert weight slices get the slices of the
//! summed gradient), also with capacity padding.
//! Each EP rank routes its own tokens (as data-parallel ranks do); the ep = 1 reference runs
//! the same two token sets through two full copies of the layer (identical initial weights:
//! every tensor is drawn from its name).

mod common;

use common::*;
use megatron_comm_local::LocalCommunicator;
use megatron_core::{MlpModule, MlpStep, ParallelContext, RankGrid};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

const B: usize = 2;
const T: usize = 6;

struct Run {
    out: Vec<f32>,
    dx: Vec<f32>,
    grads: BTreeMap<String, Vec<f32>>,
}

fn run(layer: &mut megatron_moe::MoeLayer, rank: usize) -> Run {
    let bk = backend();
    let x = tensor(bk.as_ref(), rand(B * T * C, 10 + rank as u64, 1.0), &[B, T, C]);
    let mut out = tensor(bk.as_ref(), vec![0.0; B * T * C], &[B, T, C]);
    layer.forward(&x, &mut out, MlpStep { batch: B, seq: T, train: true, seed: 1 }).expect("forward");
    let dout = tensor(bk.as_ref(), rand(B * T * C, 20 + rank as u64, 1.0), &[B, T, C]);
    let mut dx = tensor(bk.as_ref(), vec![0.0; B * T * C], &[B, T, C]);
    layer.backward(&x, &dout, &mut dx).expect("backward");
    let grads = layer.params().iter().map(|p| (p.name.clone(), p.grad.host_f32().expect("g").to_vec())).collect();
    Run { out: out.host_f32().expect("o").to_vec(), dx: dx.host_f32().expect("dx").to_vec(), grads }
}

fn assert_close(a: &[f32], b: &[f32], what: &str) {
    let scale = b.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= 1e-5 * scale, "{what}[{i}]: ep2 {x} vs ep1 {y} (scale {scale})");
    }
    assert_eq!(a.len(), b.len(), "{what}: lengths");
}

/// Rank `r`'s expert-TP slice (of 2) of a whole expert gradient: SwiGLU fc1 `(2F, C)` rows
/// `[gate_r; up_r]`, fc2 `(C, F)` columns.
fn etp_slice(name: &str, g: &[f32], r: usize) -> Vec<f32> {
    let h = F / 2;
    if name.ends_with("linear_fc1.weight") {
        (0..2).flat_map(|blk| g[(blk * F + r * h) * C..(blk * F + (r + 1) * h) * C].to_vec()).collect()
    } else {
        g.chunks(F).flat_map(|row| row[r * h..(r + 1) * h].to_vec()).collect()
    }
}

fn parity(extra: serde_json::Value) {
    two_rank_parity(extra, "expert_model_parallel_size", 2);
}

/// The layer of `extra` with `key` = 2 on a world of two threads, against ep = 1 (one layer
/// per rank's token set); `experts_per_rank` is what each rank must hold.
fn two_rank_parity(extra: serde_json::Value, key: &str, experts_per_rank: usize) {
    let mut base = json!({"num_experts": 4, "moe_router_topk": 2, "moe_aux_loss_coeff": 0.1, "moe_z_loss_coeff": 0.01});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        base[k] = v;
    }
    // Reference: ep = 1, one layer per token set.
    let refs: Vec<Run> =
        (0..2).map(|r| run(&mut layer(config(base.clone()), ParallelContext::single(), true), r)).collect();
    let mut cfg = base.clone();
    cfg[key] = json!(2);
    let comms = LocalCommunicator::world(2, Duration::from_secs(20));
    let grid = RankGrid::new(2, 1, 1, 1).expect("grid");
    let runs: Vec<Run> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let (ctx, cfg) = (grid.context(r, c.clone()), cfg.clone());
                s.spawn(move || run(&mut layer(config(cfg), ctx, true), r))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    check(&extra, &runs, &refs, experts_per_rank);
}

/// Ranks' outputs, input and router gradients equal the reference's for their tokens; expert
/// gradients (`etp` = 2: this rank's slice) equal the sum over both token sets.
fn check(extra: &serde_json::Value, runs: &[Run], refs: &[Run], experts_per_rank: usize) {
    let etp = if experts_per_rank == 4 { 2 } else { 1 };
    for (r, (got, want)) in runs.iter().zip(refs).enumerate() {
        assert_close(&got.out, &want.out, &format!("{extra} rank {r} output"));
        assert_close(&got.dx, &want.dx, &format!("{extra} rank {r} d x"));
        for (name, g) in &got.grads {
            if name.ends_with("router.weight") {
                assert_close(g, &want.grads[name], &format!("{extra} rank {r} {name}"));
            } else {
                // An expert's gradient sums both ranks' tokens.
                let sum: Vec<f32> = refs[0].grads[name].iter().zip(&refs[1].grads[name]).map(|(a, b)| a + b).collect();
                let sum = if etp == 2 { etp_slice(name, &sum, r) } else { sum };
                assert_close(g, &sum, &format!("{extra} rank {r} {name}"));
            }
        }
        let experts = got.grads.keys().filter(|n| n.contains("local_experts")).count();
        assert_eq!(experts, 2 * experts_per_rank, "rank {r} holds {experts_per_rank} experts x 2 weights");
    }
}

/// Expert TP 2 over the two ranks (each rank's experts split in halves; every expert on both).
fn etp_parity(extra: serde_json::Value) {
    two_rank_parity(extra, "expert_tensor_parallel_size", 4);
}

#[test]
fn expert_tensor_parallel_matches_ep1_with_and_without_capacity_padding() {
    etp_parity(json!({"moe_token_dispatcher_type": "alltoall"}));
    etp_parity(json!({"moe_token_dispatcher_type": "allgather"}));
    etp_parity(json!({"moe_expert_capacity_factor": 1.0, "moe_pad_expert_input_to_capacity": true}));
}

#[test]
fn alltoall_dispatcher_matches_ep1() {
    parity(json!({"moe_token_dispatcher_type": "alltoall"}));
}

#[test]
fn allgather_dispatcher_matches_ep1() {
    parity(json!({"moe_token_dispatcher_type": "allgather"}));
}

#[test]
fn dispatchers_match_ep1_with_capacity_dropping() {
    parity(json!({"moe_token_dispatcher_type": "alltoall", "moe_expert_capacity_factor": 1.0}));
    parity(json!({"moe_token_dispatcher_type": "allgather", "moe_expert_capacity_factor": 1.0}));
}
