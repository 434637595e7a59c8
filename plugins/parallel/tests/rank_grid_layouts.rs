//! The contexts the `megatron` strategy builds for several layouts (SPEC §5.1: order
//! tp-cp-dp-pp, tp fastest), checked group by group against the layouts written out by hand.

mod common;

use common::FakeComm;
use megatron_core::{ParallelContext, ParallelStrategy};
use megatron_parallel::{dp_cp_group, MegatronStrategy, StrategyConfig};
use std::sync::Arc;

fn contexts(world: usize, tp: usize, cp: usize, pp: usize) -> Vec<ParallelContext> {
    let config = StrategyConfig {
        tensor_model_parallel_size: tp,
        pipeline_model_parallel_size: pp,
        context_parallel_size: cp,
        ..StrategyConfig::default()
    };
    let s = MegatronStrategy::new(config).unwrap();
    (0..world).map(|r| s.build_context(Arc::new(FakeComm::new(r, world))).unwrap()).collect()
}

/// The group of every rank, as the sorted set of distinct groups.
fn groups(ctxs: &[ParallelContext], pick: impl Fn(&ParallelContext) -> Vec<usize>) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = ctxs.iter().map(pick).collect();
    out.sort();
    out.dedup();
    out
}

#[test]
fn spec_example_w8_tp2_pp2_dp2() {
    let c = contexts(8, 2, 1, 2);
    assert_eq!(c[0].dp_size(), 2);
    assert_eq!(groups(&c, |x| x.tp_group.ranks.clone()), [[0, 1], [2, 3], [4, 5], [6, 7]]);
    assert_eq!(groups(&c, |x| x.dp_group.ranks.clone()), [[0, 2], [1, 3], [4, 6], [5, 7]]);
    assert_eq!(groups(&c, |x| x.pp_group.ranks.clone()), [[0, 4], [1, 5], [2, 6], [3, 7]]);
    assert_eq!(groups(&c, |x| x.mp_group.ranks.clone()), [[0, 1, 4, 5], [2, 3, 6, 7]]);
    assert_eq!(c[5].embedding_group.ranks, [1, 5]);
    let coords: Vec<_> = c.iter().map(|x| (x.tp_rank, x.dp_rank, x.pp_rank)).collect();
    assert_eq!(coords[6], (0, 1, 1));
    assert!(c[3].is_first_stage() && !c[3].is_last_stage());
    assert!(c[4].is_last_stage() && !c[4].is_first_stage());
    for (r, x) in c.iter().enumerate() {
        assert_eq!(x.rank, r);
        assert_eq!(dp_cp_group(x), x.dp_group, "cp = 1: the DP x CP group is the DP group");
    }
}

#[test]
fn w4_tp2_dp2() {
    let c = contexts(4, 2, 1, 1);
    assert_eq!(groups(&c, |x| x.tp_group.ranks.clone()), [[0, 1], [2, 3]]);
    assert_eq!(groups(&c, |x| x.dp_group.ranks.clone()), [[0, 2], [1, 3]]);
    assert_eq!(groups(&c, |x| x.pp_group.ranks.clone()), [[0], [1], [2], [3]]);
    assert_eq!(groups(&c, |x| x.mp_group.ranks.clone()), [[0, 1], [2, 3]]);
    assert!(c.iter().all(|x| x.is_first_stage() && x.is_last_stage()));
}

#[test]
fn w8_pp4_dp2_stages_and_embedding_groups() {
    let c = contexts(8, 1, 1, 4);
    assert_eq!(groups(&c, |x| x.pp_group.ranks.clone()), [[0, 2, 4, 6], [1, 3, 5, 7]]);
    assert_eq!(groups(&c, |x| x.dp_group.ranks.clone()), [[0, 1], [2, 3], [4, 5], [6, 7]]);
    assert_eq!(groups(&c, |x| x.embedding_group.ranks.clone()), [[0, 6], [1, 7]]);
    let stages: Vec<usize> = c.iter().map(|x| x.pp_rank).collect();
    assert_eq!(stages, [0, 0, 1, 1, 2, 2, 3, 3]);
}

#[test]
fn w8_tp2_cp2_dp2_context_parallel_groups() {
    let c = contexts(8, 2, 2, 1);
    assert_eq!(groups(&c, |x| x.cp_group.ranks.clone()), [[0, 2], [1, 3], [4, 6], [5, 7]]);
    assert_eq!(groups(&c, |x| x.dp_group.ranks.clone()), [[0, 4], [1, 5], [2, 6], [3, 7]]);
    assert_eq!(groups(&c, |x| dp_cp_group(x).ranks), [[0, 2, 4, 6], [1, 3, 5, 7]]);
}

#[test]
fn single_rank_world_is_all_ones() {
    let c = contexts(1, 1, 1, 1);
    assert_eq!((c[0].tp_size(), c[0].pp_size(), c[0].dp_size()), (1, 1, 1));
    assert_eq!(c[0].world_group.ranks, [0]);
}

#[test]
fn layouts_that_do_not_fit_name_the_flags() {
    let s = MegatronStrategy::new(StrategyConfig { tensor_model_parallel_size: 4, ..StrategyConfig::default() });
    let err = s.unwrap().build_context(Arc::new(FakeComm::new(0, 6))).unwrap_err().to_string();
    assert!(err.contains("--tensor-model-parallel-size 4"), "{err}");
    let err = MegatronStrategy::new(StrategyConfig { pipeline_model_parallel_size: 0, ..StrategyConfig::default() })
        .unwrap_err()
        .to_string();
    assert!(err.contains("--pipeline-model-parallel-size"), "{err}");
    let s = MegatronStrategy::new(StrategyConfig::default()).unwrap();
    let err = s.build_context(Arc::new(FakeComm::new(4, 4))).unwrap_err().to_string();
    assert!(err.contains("rank 4"), "{err}");
}
