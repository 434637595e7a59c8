#!/usr/bin/env python3
"""Writes a tiny GPT-2-shaped GPT at tp4 x pp2 with Megatron-LM's own code, in both of its
checkpoint formats, with the optimizer state in the legacy one.

Writer: Megatron-LM (repository snapshot, `--mlm DIR` = a checkout's root holding `megatron/`),
8 gloo ranks on CPU:
* `parse_args`/`validate_args` make `args`; `GPTModel` (local spec: MHA 4 heads, GeLU, LayerNorm,
  biases, tied embeddings, learned absolute positions) is each rank's model;
* the optimizer is Megatron's: `_get_param_groups` (its weight-decay grouping) and
  `_get_megatron_optimizer_based_on_param_groups` (torch AdamW inside Megatron's `FP32Optimizer`
  wrapper, as Megatron builds it without Apex/TE). It takes STEPS steps with lr 0 and the
  gradient of every parameter set to the parameter itself, so after the steps
  exp_avg = (1 - b1^STEPS) * param and exp_avg_sq = (1 - b2^STEPS) * param^2 exactly in the
  math (a check that does not need Megatron: any misplaced shard or index shows);
* `generate_state_dict` + `get_checkpoint_name` + `torch.save` write the legacy `torch` format
  (`OUT/legacy`), as `save_checkpoint` does; `generate_state_dict` with `ckpt_format torch_dist`
  + `dist_checkpointing.save` write `OUT/torch_dist` (model weights; optimizer not included).
CPU patches (no GPU): `get_device_arch_version`, `Tensor.cuda` no-op, `cuda.current_device` -> cpu,
`torch.tensor(..., device='cuda')` -> cpu (FP32Optimizer's scale tensor), CUDA RNG state -> CPU's,
`cuda.synchronize` no-op.

Usage: python scripts/megatron_tp4pp2_fixture.py --mlm /tmp/mlm --out tests/fixtures/megatron_tp4pp2
"""
import argparse
import json
import os
import sys
import typing
import zlib

TP, PP = 4, 2
ITERATION = 6
STEPS = 3
BATCH, SEQ = 2, 16
VOCAB = 100  # padded by Megatron's rule to 128 at divisible_by 32 x tp 4


def megatron_argv(out, fmt):
    return [
        "pretrain_gpt.py",
        "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
        "--ffn-hidden-size", "64", "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ),
        "--position-embedding-type", "learned_absolute", "--normalization", "LayerNorm",
        "--tensor-model-parallel-size", str(TP), "--pipeline-model-parallel-size", str(PP),
        "--micro-batch-size", str(BATCH), "--global-batch-size", str(BATCH),
        "--train-iters", "100", "--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine",
        "--lr-warmup-iters", "5", "--weight-decay", "0.01", "--clip-grad", "1.0",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB - 1),
        "--make-vocab-size-divisible-by", "32", "--mock-data",
        "--hidden-dropout", "0", "--attention-dropout", "0",
        "--transformer-impl", "local", "--no-masked-softmax-fusion", "--no-bias-gelu-fusion",
        "--no-bias-dropout-fusion", "--no-gradient-accumulation-fusion",
        "--no-persist-layer-norm", "--use-cpu-initialization", "--ckpt-format", fmt,
        "--save", out, "--save-interval", "10", "--seed", "1234",
    ]


def worker(rank, mlm, out, port):
    typing.override = getattr(typing, "override", lambda f: f)  # Megatron-LM needs Python 3.12's
    sys.path.insert(0, mlm)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(TP * PP), LOCAL_RANK=str(rank), CUDA_DEVICE_MAX_CONNECTIONS="1")
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu
    from megatron.core import dist_checkpointing
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import (OptimizerConfig, _get_megatron_optimizer_based_on_param_groups, _get_param_groups,
                                         get_standard_config_overrides)
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.training.arguments import core_transformer_config_from_args, parse_args, validate_args
    from megatron.training import checkpointing
    from megatron.training.global_vars import set_args
    import megatron.training.arguments as margs

    margs.get_device_arch_version = lambda: 9
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.cuda.current_device = lambda: "cpu"
    _tensor = torch.tensor
    torch.tensor = lambda *a, device=None, **k: _tensor(*a, device=None if device == "cuda" else device, **k)
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.synchronize = lambda *a, **k: None  # the dist-checkpoint writer syncs the GPU

    dist.init_process_group("gloo", rank=rank, world_size=TP * PP)
    legacy_dir = os.path.join(out, "legacy")
    sys.argv = megatron_argv(legacy_dir, "torch")
    args = parse_args()
    validate_args(args, {})
    args.padded_vocab_size = 128
    args.iteration = ITERATION
    args.consumed_train_samples = ITERATION * BATCH
    args.consumed_valid_samples = 0
    set_args(args)
    mpu.initialize_model_parallel(TP, PP)
    torch.manual_seed(1234)
    config = core_transformer_config_from_args(args)
    pre, post = mpu.is_pipeline_first_stage(), mpu.is_pipeline_last_stage()
    model = GPTModel(config, get_gpt_layer_local_spec(), vocab_size=args.padded_vocab_size,
                     max_sequence_length=SEQ, pre_process=pre, post_process=post,
                     share_embeddings_and_output_weights=True, position_embedding_type="learned_absolute")
    pp_rank = mpu.get_pipeline_model_parallel_rank()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "bias" in name or "norm" in name:
                g = torch.Generator().manual_seed(zlib.crc32(f"{pp_rank}/{name}".encode()))
                p.add_(0.1 * torch.randn(p.shape, generator=g))

    ocfg = OptimizerConfig(optimizer="adam", lr=0.0, min_lr=0.0, weight_decay=0.01, adam_beta1=0.9,
                           adam_beta2=0.999, adam_eps=1e-8, clip_grad=0.0)
    groups = _get_param_groups([model], ocfg, get_standard_config_overrides(ocfg))  # as get_megatron_optimizer
    optimizer = _get_megatron_optimizer_based_on_param_groups(ocfg, [model], groups)
    for _ in range(STEPS):
        for p in model.parameters():
            p.grad = p.detach().clone()
        optimizer.optimizer.step()  # the inner torch AdamW, as Megatron's step_with_ready_grads does
    sched = OptimizerParamScheduler(optimizer, init_lr=0.0, max_lr=1e-3, min_lr=1e-4, lr_warmup_steps=5 * BATCH,
                                    lr_decay_steps=100 * BATCH, lr_decay_style="cosine", start_wd=0.01,
                                    end_wd=0.01, wd_incr_steps=100 * BATCH, wd_incr_style="constant")
    sched.step(increment=ITERATION * BATCH)
    rng_state = checkpointing.get_rng_state(
        ckpt_format="torch", tp_group=mpu.get_tensor_model_parallel_group(), pp_group=mpu.get_pipeline_model_parallel_group()
    )
    state = checkpointing.generate_state_dict(args, [model], optimizer, sched, rng_state, iteration=ITERATION)
    state["num_floating_point_operations_so_far"] = 0.0
    path = checkpointing.get_checkpoint_name(legacy_dir, ITERATION)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(state, path)
    dist.barrier()
    if rank == 0:
        with open(os.path.join(legacy_dir, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(ITERATION))

    # torch_dist: the same weights through Megatron-Core's distributed checkpoint.
    dist_dir = os.path.join(out, "torch_dist")
    args.ckpt_format = "torch_dist"
    args.save = dist_dir
    meta = checkpointing._build_sharded_state_dict_metadata(args, dp_cp_group=mpu.get_data_parallel_group(with_context_parallel=True))
    dstate = checkpointing.generate_state_dict(args, [model], None, sched, None, iteration=ITERATION,
                                               model_sd_kwargs=dict(metadata=meta))
    dstate["num_floating_point_operations_so_far"] = 0.0
    name = checkpointing.get_checkpoint_name(dist_dir, ITERATION, return_base_dir=True)
    if rank == 0:
        os.makedirs(name, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(dstate, name, content_metadata=checkpointing._clean_metadata_for_serialization(meta))
    dist.barrier()
    if rank == 0:
        with open(os.path.join(dist_dir, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(ITERATION))
        with open(os.path.join(out, "README.txt"), "w") as f:
            f.write(f"written by scripts/megatron_tp4pp2_fixture.py: Megatron-LM tp{TP} pp{PP}, iteration {ITERATION}, "
                    f"AdamW steps {STEPS} (lr 0, grad = param), betas 0.9/0.999\n")
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mlm", required=True, help="Megatron-LM checkout root (holds megatron/)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--port", type=int, default=29541)
    a = ap.parse_args()
    import torch.multiprocessing as mp
    mp.spawn(worker, args=(os.path.abspath(a.mlm), os.path.abspath(a.out), a.port), nprocs=TP * PP)


if __name__ == "__main__":
    main()
