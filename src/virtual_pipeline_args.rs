//! The interleaved-pipeline flags of `megatron pretrain` (SPEC §5.5) with Megatron-LM's rules
//! (`arguments.py`): `--num-layers-per-virtual-pipeline-stage N` gives each pipeline rank
//! `(num-layers / pp) / N` model chunks, `--num-virtual-stages-per-pipeline-rank V` gives `V`
//! directly (at most one of them); one chunk means the plain 1F1B schedule. The number of
//! microbatches must fit the interleaved schedule's groups (never silently changed).

use crate::args::PretrainArgs;

/// Model chunks per pipeline rank (1 without interleaving), or the broken rule.
pub fn virtual_pipeline_size(a: &PretrainArgs) -> Result<usize, String> {
    let pp = a.pipeline_model_parallel_size.max(1);
    let vp = match (a.num_layers_per_virtual_pipeline_stage, a.num_virtual_stages_per_pipeline_rank) {
        (None, None) => return Ok(1),
        (Some(_), Some(_)) => {
            return Err("give at most one of --num-layers-per-virtual-pipeline-stage and \
                        --num-virtual-stages-per-pipeline-rank"
                .into())
        }
        (Some(n), None) => {
            if a.decoder_first_pipeline_num_layers.is_some() || a.decoder_last_pipeline_num_layers.is_some() {
                return Err(
                    "with --decoder-first/last-pipeline-num-layers use --num-virtual-stages-per-pipeline-rank \
                            for the interleaved pipeline (as in Megatron-LM)"
                        .into(),
                );
            }
            if n == 0 {
                return Err("--num-layers-per-virtual-pipeline-stage must be >= 1".into());
            }
            if !a.num_layers.is_multiple_of(pp) {
                return Err(format!(
                    "--num-layers {} must be divisible by --pipeline-model-parallel-size {pp}",
                    a.num_layers
                ));
            }
            let per_stage = a.num_layers / pp;
            if !per_stage.is_multiple_of(n) {
                return Err(format!(
                    "the {per_stage} layers per pipeline stage must be divisible by \
                     --num-layers-per-virtual-pipeline-stage {n}"
                ));
            }
            per_stage / n
        }
        (None, Some(v)) => v,
    };
    if vp == 0 {
        return Err("--num-virtual-stages-per-pipeline-rank must be >= 1".into());
    }
    if vp == 1 {
        return Ok(1);
    }
    if pp < 2 {
        return Err(format!(
            "an interleaved pipeline ({vp} model chunks per rank) needs --pipeline-model-parallel-size >= 2"
        ));
    }
    let (first, last) = (a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers);
    if first.is_some() || last.is_some() {
        // Megatron splits every stage's layers evenly over its chunks (the split itself is
        // checked when the model is built).
        let given = first.iter().chain(&last).count();
        let rest = a.num_layers.saturating_sub(first.unwrap_or(0) + last.unwrap_or(0));
        let middle = (pp > given).then(|| rest / (pp - given));
        for (what, n) in [
            ("--decoder-first-pipeline-num-layers", first),
            ("--decoder-last-pipeline-num-layers", last),
            ("the layers of each other stage,", middle),
        ] {
            if let Some(n) = n.filter(|n| !n.is_multiple_of(vp)) {
                return Err(format!(
                    "{what} {n} must be divisible by the {vp} model chunks per rank (every stage's layers are split \
                     evenly over its chunks)"
                ));
            }
        }
    } else if !a.num_layers.is_multiple_of(pp * vp) {
        return Err(format!(
            "--num-layers {} must be divisible by --pipeline-model-parallel-size {pp} x {vp} model chunks per rank \
             (every virtual stage gets the same number of layers)",
            a.num_layers
        ));
    }
    if a.model != "gpt" {
        return Err(format!("the interleaved pipeline is implemented for --model gpt only, not `{}`", a.model));
    }
    Ok(vp)
}

/// Every broken rule of the interleaved flags for a run of `num_microbatches` microbatches.
pub fn check(a: &PretrainArgs, num_microbatches: usize) -> Vec<String> {
    let vp = match virtual_pipeline_size(a) {
        Ok(vp) => vp,
        Err(e) => return vec![e],
    };
    if vp == 1 {
        return match a.microbatch_group_size_per_virtual_pipeline_stage {
            Some(_) => vec!["--microbatch-group-size-per-virtual-pipeline-stage needs an interleaved pipeline".into()],
            None => Vec::new(),
        };
    }
    let pp = a.pipeline_model_parallel_size;
    let group = a.microbatch_group_size_per_virtual_pipeline_stage.unwrap_or(pp);
    #[cfg(feature = "parallel")]
    let broken = megatron_parallel::check_interleaving(pp, vp, num_microbatches, group).err().map(|e| e.to_string());
    #[cfg(not(feature = "parallel"))]
    let broken = {
        let _ = (pp, num_microbatches, group);
        Some("an interleaved pipeline needs the `parallel` feature".to_string())
    };
    broken.into_iter().collect()
}
