//! Parallel state: the rank grid (SPEC §5.1), the [`ParallelContext`] passed to everything
//! that communicates, and the [`ParallelStrategy`] trait.

use crate::{Backend, Communicator, Group, Param, Result, SingleRankCommunicator};
use anyhow::bail;
use std::sync::Arc;

/// Sizes of the dense rank grid, laid out in Megatron's default order `tp-cp-ep-dp-pp`
/// (tp fastest): `rank = tp_rank + tp*(cp_rank + cp*(dp_rank + dp*pp_rank))` (ep = 1 for
/// dense layers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankGrid {
    pub tp: usize,
    pub cp: usize,
    pub dp: usize,
    pub pp: usize,
}

/// Coordinates of one rank in a [`RankGrid`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankCoords {
    pub tp: usize,
    pub cp: usize,
    pub dp: usize,
    pub pp: usize,
}

impl RankGrid {
    /// Derives `dp = world / (tp*cp*pp)`; errors name the flags when it does not divide.
    pub fn new(world_size: usize, tp: usize, cp: usize, pp: usize) -> Result<RankGrid> {
        if tp == 0 || cp == 0 || pp == 0 || world_size == 0 {
            bail!("parallel sizes must be >= 1 (world {world_size}, tp {tp}, cp {cp}, pp {pp})");
        }
        let mp = tp * cp * pp;
        if !world_size.is_multiple_of(mp) {
            bail!(
                "world size {world_size} is not divisible by --tensor-model-parallel-size {tp} x \
                 --context-parallel-size {cp} x --pipeline-model-parallel-size {pp} = {mp}"
            );
        }
        Ok(RankGrid { tp, cp, dp: world_size / mp, pp })
    }

    pub fn world_size(&self) -> usize {
        self.tp * self.cp * self.dp * self.pp
    }

    pub fn coords(&self, rank: usize) -> RankCoords {
        RankCoords {
            tp: rank % self.tp,
            cp: (rank / self.tp) % self.cp,
            dp: (rank / (self.tp * self.cp)) % self.dp,
            pp: rank / (self.tp * self.cp * self.dp),
        }
    }

    pub fn rank(&self, c: RankCoords) -> usize {
        c.tp + self.tp * (c.cp + self.cp * (c.dp + self.dp * c.pp))
    }

    /// The group of ranks sharing every coordinate of `rank` except those selected.
    fn group_varying(&self, rank: usize, name: &str, vary: [bool; 4]) -> Group {
        let me = self.coords(rank);
        let mut ranks: Vec<usize> = (0..self.world_size())
            .filter(|&r| {
                let c = self.coords(r);
                (vary[0] || c.tp == me.tp)
                    && (vary[1] || c.cp == me.cp)
                    && (vary[2] || c.dp == me.dp)
                    && (vary[3] || c.pp == me.pp)
            })
            .collect();
        ranks.sort_unstable();
        Group::new(name, ranks)
    }

    /// Builds the context of global rank `rank`.
    pub fn context(&self, rank: usize, comm: Arc<dyn Communicator>) -> ParallelContext {
        let c = self.coords(rank);
        let pp_group = self.group_varying(rank, "pp", [false, false, false, true]);
        let first = pp_group.ranks[0];
        let last = *pp_group.ranks.last().unwrap_or(&first);
        let mut emb = vec![first];
        if last != first {
            emb.push(last);
        }
        ParallelContext {
            grid: *self,
            rank,
            tp_rank: c.tp,
            cp_rank: c.cp,
            dp_rank: c.dp,
            pp_rank: c.pp,
            world_group: Group::new("world", (0..self.world_size()).collect()),
            tp_group: self.group_varying(rank, "tp", [true, false, false, false]),
            cp_group: self.group_varying(rank, "cp", [false, true, false, false]),
            dp_group: self.group_varying(rank, "dp", [false, false, true, false]),
            pp_group,
            mp_group: self.group_varying(rank, "mp", [true, false, false, true]),
            embedding_group: Group::new("embedding", emb),
            comm,
            expert_model_parallel_size: 1,
            ep_rank: 0,
            ep_group: Group::new("ep", vec![rank]),
            edp_group: self.group_varying(rank, "edp", [false, true, true, false]),
            expert_tensor_parallel_size: 1,
            etp_rank: 0,
            etp_group: Group::new("etp", vec![rank]),
            expert_mp_group: Group::new("expert-mp", vec![rank]),
            virtual_pp_size: 1,
            virtual_pp_rank: 0,
        }
    }
}

/// Everything a rank knows about the parallel layout; passed by reference, never global.
#[derive(Clone)]
pub struct ParallelContext {
    pub grid: RankGrid,
    pub rank: usize,
    pub tp_rank: usize,
    pub cp_rank: usize,
    pub dp_rank: usize,
    pub pp_rank: usize,
    pub world_group: Group,
    pub tp_group: Group,
    pub cp_group: Group,
    pub dp_group: Group,
    pub pp_group: Group,
    /// Model-parallel group (TP x PP): gradient-norm and inf checks reduce over it.
    pub mp_group: Group,
    /// First and last pipeline stage of this pipeline (tied embeddings).
    pub embedding_group: Group,
    pub comm: Arc<dyn Communicator>,
    /// Expert grid (SPEC §5.1 "parallel folding", [`ParallelContext::with_expert_grid`]):
    /// `--expert-model-parallel-size`, 1 unless that set it.
    pub expert_model_parallel_size: usize,
    /// This rank's position in `ep_group`.
    pub ep_rank: usize,
    /// Ranks sharing one set of experts between them (each holds `E/ep` of them).
    pub ep_group: Group,
    /// Expert-data-parallel group: the replicas of this rank's experts; expert gradients are
    /// reduced over it instead of the DP×CP group (SPEC §5.8). With ep = 1 it is the DP×CP group.
    pub edp_group: Group,
    /// `--expert-tensor-parallel-size`: each expert's fc1 is split by columns and fc2 by rows
    /// over `etp_group` (1 unless [`ParallelContext::with_expert_grid`] set it).
    pub expert_tensor_parallel_size: usize,
    /// This rank's position in `etp_group`.
    pub etp_rank: usize,
    pub etp_group: Group,
    /// The ranks of this stage that together hold one copy of every expert (etp × ep ranks):
    /// the gradient norm adds the experts' squares up over it.
    pub expert_mp_group: Group,
    /// Model chunks per pipeline rank (interleaved 1F1B, SPEC §5.5); 1 without interleaving.
    pub virtual_pp_size: usize,
    /// Which of this rank's model chunks a model built with this context is (virtual stage
    /// `virtual_pp_rank · pp + pp_rank`); 0 without interleaving.
    pub virtual_pp_rank: usize,
}

impl std::fmt::Debug for ParallelContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParallelContext")
            .field("grid", &self.grid)
            .field("rank", &self.rank)
            .field("comm", &self.comm.name())
            .finish()
    }
}

impl ParallelContext {
    /// World of one rank: tp = pp = dp = 1.
    pub fn single() -> ParallelContext {
        let grid = RankGrid { tp: 1, cp: 1, dp: 1, pp: 1 };
        grid.context(0, Arc::new(SingleRankCommunicator))
    }

    pub fn tp_size(&self) -> usize {
        self.grid.tp
    }
    pub fn pp_size(&self) -> usize {
        self.grid.pp
    }
    pub fn dp_size(&self) -> usize {
        self.grid.dp
    }
    pub fn world_size(&self) -> usize {
        self.grid.world_size()
    }
    /// Megatron's `pre_process`: this stage holds the embedding (with interleaving: the first
    /// model chunk of pipeline rank 0).
    pub fn is_first_stage(&self) -> bool {
        self.pp_rank == 0 && self.virtual_pp_rank == 0
    }
    /// Megatron's `post_process`: this stage holds the final norm, output layer and loss (with
    /// interleaving: the last model chunk of the last pipeline rank).
    pub fn is_last_stage(&self) -> bool {
        self.pp_rank + 1 == self.grid.pp && self.virtual_pp_rank + 1 == self.virtual_pp_size
    }

    /// The context of model chunk `chunk` of `vp` on this rank (interleaved 1F1B, SPEC §5.5):
    /// a model built with it holds virtual pipeline stage `chunk · pp + pp_rank`. Groups and
    /// ranks are unchanged; only [`ParallelContext::is_first_stage`] /
    /// [`ParallelContext::is_last_stage`] and the layers a model builds depend on the chunk.
    pub fn with_virtual_stage(mut self, vp: usize, chunk: usize) -> Result<ParallelContext> {
        if vp == 0 || chunk >= vp {
            bail!("model chunk {chunk} does not exist with {vp} chunks per pipeline rank");
        }
        self.virtual_pp_size = vp;
        self.virtual_pp_rank = chunk;
        Ok(self)
    }

    /// This rank's virtual pipeline stage (`virtual_pp_rank · pp + pp_rank`) and their number
    /// (`pp · vp`); `(pp_rank, pp)` without interleaving.
    pub fn virtual_stage(&self) -> (usize, usize) {
        (self.virtual_pp_rank * self.grid.pp + self.pp_rank, self.grid.pp * self.virtual_pp_size)
    }

    /// This context with `ep`-way expert parallelism and expert TP 1 (see
    /// [`ParallelContext::with_expert_grid`]).
    pub fn with_expert_parallel(self, ep: usize) -> Result<ParallelContext> {
        self.with_expert_grid(ep, 1)
    }

    /// Whether the experts are sharded over ranks (ep · etp > 1): expert weights then differ
    /// between ranks of a stage and are reduced over `edp_group`, not the DP×CP group.
    pub fn experts_sharded(&self) -> bool {
        self.expert_model_parallel_size * self.expert_tensor_parallel_size > 1
    }

    /// This context with the expert grid of SPEC §5.1 "parallel folding": the `tp·cp·dp`
    /// ranks of this pipeline stage (position `q = tp_rank + tp·(cp_rank + cp·dp_rank)`,
    /// the grid's own order) are regrouped as `etp × ep × edp`, etp fastest: expert-TP rank
    /// `q % etp`, expert-parallel rank `(q / etp) % ep`, expert-data-parallel rank
    /// `q / (etp·ep)`. With tp = 1 and etp = 1 the EP group is `ep` consecutive DP×CP ranks.
    /// With `ep = etp = 1` nothing changes: the experts are replicated like dense weights.
    pub fn with_expert_grid(mut self, ep: usize, etp: usize) -> Result<ParallelContext> {
        let stage: Vec<usize> = self.grid.group_varying(self.rank, "stage", [true, true, true, false]).ranks;
        if ep == 0 || etp == 0 || !stage.len().is_multiple_of(ep * etp) {
            bail!(
                "--expert-model-parallel-size {ep} x --expert-tensor-parallel-size {etp} must divide \
                 tensor- x data- x context-parallel size {}",
                stage.len()
            );
        }
        if ep * etp == 1 {
            return Ok(self);
        }
        let q = stage.iter().position(|&r| r == self.rank).unwrap_or(0);
        let (etp_rank, ep_rank, edp_rank) = (q % etp, (q / etp) % ep, q / (etp * ep));
        let pick = |f: &dyn Fn(usize, usize, usize) -> bool| -> Vec<usize> {
            stage
                .iter()
                .enumerate()
                .filter(|(i, _)| f(i % etp, (i / etp) % ep, i / (etp * ep)))
                .map(|(_, &r)| r)
                .collect()
        };
        let ep_ranks = pick(&|t, _, d| t == etp_rank && d == edp_rank);
        let etp_ranks = pick(&|_, e, d| e == ep_rank && d == edp_rank);
        let edp_ranks = pick(&|t, e, _| t == etp_rank && e == ep_rank);
        let mp_ranks = pick(&|_, _, d| d == edp_rank);
        self.ep_group = Group::new(format!("ep{}", ep_ranks[0]), ep_ranks);
        self.etp_group = Group::new(format!("etp{}", etp_ranks[0]), etp_ranks);
        self.edp_group = Group::new(format!("edp{}", edp_ranks[0]), edp_ranks);
        self.expert_mp_group = Group::new(format!("expert-mp{}", mp_ranks[0]), mp_ranks);
        (self.ep_rank, self.etp_rank) = (ep_rank, etp_rank);
        self.expert_model_parallel_size = ep;
        self.expert_tensor_parallel_size = etp;
        Ok(self)
    }
}

/// Builds the rank grid and owns data-parallel gradient reduction.
pub trait ParallelStrategy: Send + Sync {
    fn name(&self) -> &str;
    /// The context of `rank` in a world of `comm.world_size()` ranks.
    fn build_context(&self, comm: Arc<dyn Communicator>) -> Result<ParallelContext>;
    /// Reduces (averages per SPEC §5.6) parameter gradients over the data-parallel group.
    fn reduce_gradients(&self, params: &mut [&mut Param], backend: &dyn Backend, ctx: &ParallelContext) -> Result<()>;
    /// The stateful gradient reducer of this rank for the parameters `params` of its model
    /// (buckets, overlap with backward; SPEC §5.6), built once and used every step:
    /// [`GradSync::grads_ready`] from the schedule's gradient hook, then [`GradSync::finish`].
    /// `None` (the default): the strategy has none, call [`ParallelStrategy::reduce_gradients`].
    fn grad_sync(
        &self,
        _params: &[&Param],
        _backend: Arc<dyn Backend>,
        _ctx: &ParallelContext,
    ) -> Result<Option<Box<dyn GradSync>>> {
        Ok(None)
    }
}

/// Data-parallel gradient synchronization of one rank, reused every step (Megatron's DDP
/// grad buffers and buckets). Afterwards every gradient holds the same value on all
/// data-parallel replicas, as [`ParallelStrategy::reduce_gradients`] would leave it.
pub trait GradSync: Send {
    /// `params`' gradients are final for this step (called during the last microbatch's
    /// backward, in backward order, each parameter at most once per step); a bucket whose
    /// parameters are all final may start its reduction in the background.
    fn grads_ready(&mut self, params: &[&Param]) -> Result<()>;
    /// Reduces whatever was not started, waits for everything and writes the reduced
    /// gradients back into `params` (all of the model's parameters); then resets for the
    /// next step.
    fn finish(&mut self, params: &mut [&mut Param], backend: &dyn Backend) -> Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_stages_move_first_and_last_to_the_end_chunks() {
        let g = RankGrid::new(2, 1, 1, 2).unwrap();
        let ctx = |r: usize, c: usize| g.context(r, Arc::new(SingleRankCommunicator)).with_virtual_stage(2, c).unwrap();
        // Virtual stages: rank 0 chunk 0 = 0, rank 1 chunk 0 = 1, rank 0 chunk 1 = 2, rank 1 chunk 1 = 3.
        let flags = |r, c| (ctx(r, c).is_first_stage(), ctx(r, c).is_last_stage(), ctx(r, c).virtual_stage());
        assert_eq!(flags(0, 0), (true, false, (0, 4)));
        assert_eq!(flags(1, 0), (false, false, (1, 4)));
        assert_eq!(flags(0, 1), (false, false, (2, 4)));
        assert_eq!(flags(1, 1), (false, true, (3, 4)));
        let plain = g.context(1, Arc::new(SingleRankCommunicator));
        assert!(plain.is_last_stage() && plain.virtual_stage() == (1, 2));
        assert!(g.context(0, Arc::new(SingleRankCommunicator)).with_virtual_stage(2, 2).is_err());
    }

    #[test]
    fn grid_groups_match_spec_example() {
        // SPEC §5.1: W=8, tp=2, pp=2, dp=2.
        let g = RankGrid::new(8, 2, 1, 2).unwrap();
        assert_eq!(g.dp, 2);
        let ctx = |r| g.context(r, Arc::new(SingleRankCommunicator));
        assert_eq!(ctx(0).tp_group.ranks, vec![0, 1]);
        assert_eq!(ctx(6).tp_group.ranks, vec![6, 7]);
        assert_eq!(ctx(1).dp_group.ranks, vec![1, 3]);
        assert_eq!(ctx(4).dp_group.ranks, vec![4, 6]);
        assert_eq!(ctx(2).pp_group.ranks, vec![2, 6]);
        assert_eq!(ctx(3).pp_group.ranks, vec![3, 7]);
        assert_eq!(ctx(3).embedding_group.ranks, vec![3, 7]);
        assert!(RankGrid::new(6, 4, 1, 1).is_err());
    }

    #[test]
    fn expert_groups_fold_over_data_parallel() {
        // W=8, tp=1, pp=2, dp=4, ep=2: EP groups are consecutive DP ranks, EDP the rest.
        let g = RankGrid::new(8, 1, 1, 2).unwrap();
        let ctx = |r| g.context(r, Arc::new(SingleRankCommunicator)).with_expert_parallel(2).unwrap();
        assert_eq!(ctx(0).ep_group.ranks, vec![0, 1]);
        assert_eq!(ctx(3).ep_group.ranks, vec![2, 3]);
        assert_eq!(ctx(3).ep_rank, 1);
        assert_eq!(ctx(1).edp_group.ranks, vec![1, 3]);
        assert_eq!(ctx(6).edp_group.ranks, vec![4, 6]);
        assert_eq!(g.context(5, Arc::new(SingleRankCommunicator)).edp_group.ranks, vec![4, 5, 6, 7]);
        assert!(g.context(0, Arc::new(SingleRankCommunicator)).with_expert_parallel(3).is_err());
    }

    #[test]
    fn expert_grid_folds_over_tensor_and_data_parallel() {
        // W=8, tp=2, dp=4: q = rank. ep2·etp1: EP = [0,1], EDP = [0,2,4,6].
        let g = RankGrid::new(8, 2, 1, 1).unwrap();
        let ctx = |r, ep, etp| g.context(r, Arc::new(SingleRankCommunicator)).with_expert_grid(ep, etp).unwrap();
        let c = ctx(3, 2, 1);
        assert_eq!((c.ep_group.ranks.clone(), c.ep_rank, c.edp_group.ranks.clone()), (vec![2, 3], 1, vec![1, 3, 5, 7]));
        assert_eq!((c.etp_group.ranks.clone(), c.expert_mp_group.ranks.clone()), (vec![3], vec![2, 3]));
        // ep2·etp2: ETP = [4,5], EP = [4,6], EDP = [4,0], expert-MP = [4..8).
        let c = ctx(4, 2, 2);
        assert_eq!((c.etp_group.ranks.clone(), c.etp_rank), (vec![4, 5], 0));
        assert_eq!((c.ep_group.ranks.clone(), c.ep_rank), (vec![4, 6], 0));
        assert_eq!(c.edp_group.ranks, vec![0, 4]);
        assert_eq!(c.expert_mp_group.ranks, vec![4, 5, 6, 7]);
        assert!(c.experts_sharded() && !ctx(4, 1, 1).experts_sharded());
        assert!(g.context(0, Arc::new(SingleRankCommunicator)).with_expert_grid(4, 4).is_err());
    }
}
