#!/usr/bin/env python3
"""Loads the optimizer state megatron-rs wrote (`megatron checkpoint convert --to megatron-legacy
--target-tensor-parallel-size 2 --target-pipeline-parallel-size 1` of tests/fixtures/megatron_tp4pp2/legacy)
into Megatron-LM's own optimizer: 2 gloo ranks on CPU build the GPT-2-shaped GPTModel (strict
`load_state_dict` of `model`) and Megatron's optimizer exactly as scripts/megatron_tp4pp2_fixture.py
does (`_get_param_groups` with the standard overrides, `FP32Optimizer` around torch AdamW), then
`optimizer.load_state_dict(state["optimizer"])` — Megatron's loader maps torch's indices to the
parameters of its own groups. Every parameter's moments must then be the closed form the fixture's
steps produce (exp_avg = (1 - 0.9^3) p, exp_avg_sq = (1 - 0.999^3) p^2) and step 3.

Usage: python scripts/megatron_optim_load_check.py --mlm /tmp/mlm --ckpt DIR
"""
import argparse
import os
import sys
import typing


def worker(rank, mlm, ckpt, port):
    typing.override = getattr(typing, "override", lambda f: f)
    sys.path.insert(0, mlm)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import (OptimizerConfig, _get_megatron_optimizer_based_on_param_groups,
                                         _get_param_groups, get_standard_config_overrides)
    from megatron.core.transformer import TransformerConfig

    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.cuda.current_device = lambda: "cpu"
    _tensor = torch.tensor
    torch.tensor = lambda *a, device=None, **k: _tensor(*a, device=None if device == "cuda" else device, **k)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mpu.initialize_model_parallel(2, 1)
    it = open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")).read().strip()
    state = torch.load(os.path.join(ckpt, f"iter_{int(it):07d}", f"mp_rank_{rank:02d}", "model_optim_rng.pt"),
                       weights_only=False)
    a = state["args"]
    config = TransformerConfig(
        num_layers=a.num_layers, hidden_size=a.hidden_size, num_attention_heads=a.num_attention_heads,
        ffn_hidden_size=a.ffn_hidden_size, add_bias_linear=True, normalization="LayerNorm",
        hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True, tensor_model_parallel_size=2,
        bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, bias_dropout_fusion=False, params_dtype=torch.float32)
    model = GPTModel(config, get_gpt_layer_local_spec(), vocab_size=a.padded_vocab_size,
                     max_sequence_length=a.max_position_embeddings, pre_process=True, post_process=True,
                     share_embeddings_and_output_weights=True, position_embedding_type="learned_absolute")
    model.load_state_dict(state["model"], strict=True)
    # As a Megatron run would configure it from its args (group max_lr/min_lr identify the groups).
    ocfg = OptimizerConfig(optimizer="adam", lr=a.lr, min_lr=a.min_lr, weight_decay=a.weight_decay, clip_grad=0.0)
    opt = _get_megatron_optimizer_based_on_param_groups(
        ocfg, [model], _get_param_groups([model], ocfg, get_standard_config_overrides(ocfg)))
    opt.load_state_dict(state["optimizer"])
    c1, c2 = 1 - 0.9 ** 3, 1 - 0.999 ** 3
    worst, n = 0.0, 0
    for name, p in model.named_parameters():
        s = opt.optimizer.state[p]
        assert float(s["step"]) == 3.0, (name, s["step"])
        worst = max(worst, ((s["exp_avg"] - c1 * p) / (c1 * p.abs()).clamp_min(1e-6)).abs().max().item())
        worst = max(worst, ((s["exp_avg_sq"] - c2 * p * p) / (c2 * p * p).clamp_min(1e-9)).abs().max().item())
        n += 1
    print(f"rank {rank}: Megatron-LM's optimizer loaded megatron-rs's state for {n} parameters; "
          f"moments vs closed form: worst relative error {worst:.2e}")
    assert worst < 1e-5, worst
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mlm", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--port", type=int, default=29547)
    a = ap.parse_args()
    import torch.multiprocessing as mp
    mp.spawn(worker, args=(os.path.abspath(a.mlm), os.path.abspath(a.ckpt), a.port), nprocs=2)


if __name__ == "__main__":
    main()
