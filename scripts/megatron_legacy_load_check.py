#!/usr/bin/env python3
"""Loads a legacy checkpoint written by `megatron checkpoint convert --to megatron-legacy` at tp2
x pp1 into Megatron-LM's own GPTModel (2 gloo ranks on CPU, strict `load_state_dict` of each
rank's `model`, `args` read back as an argparse.Namespace through torch.load) and compares its
logits on the fixture's batch with the reference Megatron-LM computed from the original tp2 x pp2
checkpoint (tests/fixtures/megatron_legacy_tp2pp2/reference.json).

Usage: python scripts/megatron_legacy_load_check.py --mlm /tmp/mlm --ckpt DIR --reference REF.json
"""
import argparse
import json
import os
import sys
import typing


def worker(rank, mlm, ckpt, reference, port):
    typing.override = getattr(typing, "override", lambda f: f)
    sys.path.insert(0, mlm)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import contextlib
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu, tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    import torch.nn.functional as F

    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.cuda.current_device = lambda: "cpu"
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mpu.initialize_model_parallel(2, 1)
    it = open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")).read().strip()
    path = os.path.join(ckpt, f"iter_{int(it):07d}", f"mp_rank_{rank:02d}", "model_optim_rng.pt")
    state = torch.load(path, weights_only=False)
    a = state["args"]
    assert isinstance(a, argparse.Namespace), type(a)
    assert a.tensor_model_parallel_size == 2 and state["checkpoint_version"] == 3.0
    config = TransformerConfig(
        num_layers=a.num_layers, hidden_size=a.hidden_size, num_attention_heads=a.num_attention_heads,
        num_query_groups=a.num_query_groups, ffn_hidden_size=a.ffn_hidden_size, gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=True, normalization="LayerNorm", layernorm_epsilon=getattr(a, "norm_epsilon", getattr(a, "layernorm_epsilon", 1e-5)),
        hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True, tensor_model_parallel_size=2,
        bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, bias_dropout_fusion=False, params_dtype=torch.float32)
    model = GPTModel(config, get_gpt_layer_local_spec(), vocab_size=a.padded_vocab_size,
                     max_sequence_length=a.max_position_embeddings, pre_process=True, post_process=True,
                     share_embeddings_and_output_weights=True, position_embedding_type="learned_absolute")
    missing, unexpected = model.load_state_dict(state["model"], strict=True)
    model.eval()
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    ref = json.load(open(reference))
    b, s, v = ref["batch"], ref["seq"], ref["vocab"]
    tokens = torch.tensor(ref["tokens"]).view(b, s)
    pos = torch.arange(s).unsqueeze(0).expand(b, s)
    mask = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1)
    with torch.no_grad():
        logits = model(tokens, pos, mask)
    parts = [torch.empty_like(logits) for _ in range(2)]
    dist.all_gather(parts, logits.contiguous(), group=mpu.get_tensor_model_parallel_group())
    logits = torch.cat(parts, dim=-1)[..., :v].flatten()
    diff = (logits - torch.tensor(ref["logits"])).abs().max().item()
    if rank == 0:
        print(f"Megatron-LM loaded {ckpt} (strict, tp2): max |logit - reference| = {diff:.3e}")
        assert diff < 1e-4, diff
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mlm", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--reference", required=True)
    ap.add_argument("--port", type=int, default=29544)
    a = ap.parse_args()
    import torch.multiprocessing as mp
    mp.spawn(worker, args=(os.path.abspath(a.mlm), os.path.abspath(a.ckpt), os.path.abspath(a.reference), a.port), nprocs=2)


if __name__ == "__main__":
    main()
