#!/usr/bin/env python3
"""Writes a tiny GPT checkpoint in Megatron-LM's legacy `torch` format with Megatron-LM's own code.

Writer: Megatron-LM (repository snapshot, `--mlm DIR` = a checkout's root holding `megatron/`):
`megatron.training.arguments.parse_args`/`validate_args` make the `args` Namespace,
`megatron.core.models.gpt.GPTModel` (local spec) builds each rank's model on CPU over a gloo
process group (4 ranks: tp2 x pp2), `megatron.training.checkpointing.generate_state_dict` builds
each rank's state dict (`--ckpt-format torch`), `get_checkpoint_name` names its file, and
`torch.save` writes it (as `save_checkpoint` does); rank 0 writes the tracker.
The weights are Megatron's CPU initialisation, then norms/biases perturbed (seeded) so every
tensor matters. The reference: Megatron's model run as the same 2x2 grid (stage 0 sends its
hidden states to stage 1 by gloo send/recv) on a fixed batch, the per-token loss and the
tp-gathered logits written to `reference.json`.

Usage: python scripts/megatron_legacy_fixture.py --mlm /tmp/mlm --out tests/fixtures/megatron_legacy_tp2pp2
"""
import argparse
import json
import os
import sys
import typing
import zlib

TP, PP = 2, 2
ITERATION = 10
BATCH, SEQ = 2, 16
VOCAB = 100  # true vocabulary; padded by Megatron's rule to 128 at divisible_by 32 x tp 2


def megatron_argv(out):
    return [
        "pretrain_gpt.py",
        "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
        "--group-query-attention", "--num-query-groups", "2", "--ffn-hidden-size", "48",
        "--swiglu", "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ),
        "--position-embedding-type", "learned_absolute", "--normalization", "LayerNorm",
        "--tensor-model-parallel-size", str(TP), "--pipeline-model-parallel-size", str(PP),
        "--micro-batch-size", str(BATCH), "--global-batch-size", str(BATCH),
        "--train-iters", "100", "--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine",
        "--lr-warmup-iters", "5", "--weight-decay", "0.01", "--clip-grad", "1.0",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB - 1),
        "--make-vocab-size-divisible-by", "32", "--mock-data",
        "--hidden-dropout", "0", "--attention-dropout", "0",
        "--transformer-impl", "local", "--no-masked-softmax-fusion", "--no-bias-gelu-fusion",
        "--no-bias-swiglu-fusion", "--no-bias-dropout-fusion", "--no-gradient-accumulation-fusion",
        "--no-persist-layer-norm", "--use-cpu-initialization", "--ckpt-format", "torch",
        "--save", out, "--save-interval", "10", "--seed", "1234",
    ]


def worker(rank, mlm, out, port):
    typing.override = getattr(typing, "override", lambda f: f)  # Megatron-LM needs Python 3.12's
    sys.path.insert(0, mlm)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(TP * PP), LOCAL_RANK=str(rank), CUDA_DEVICE_MAX_CONNECTIONS="1")
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from megatron.core import parallel_state as mpu
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.training.arguments import core_transformer_config_from_args, parse_args, validate_args
    from megatron.training import checkpointing
    from megatron.training.global_vars import set_args
    import megatron.training.arguments as margs

    # validate_args asks the GPU's architecture for an advisory check only; there is no GPU here.
    margs.get_device_arch_version = lambda: 9
    # The tied-embedding sync moves the weight to the GPU before its all-reduce; on CPU/gloo the
    # tensor stays where it is (the only patch to Megatron's code path).
    torch.Tensor.cuda = lambda self, *a, **k: self
    # Megatron's attention scratch buffer is allocated on `torch.cuda.current_device()`.
    torch.cuda.current_device = lambda: "cpu"

    dist.init_process_group("gloo", rank=rank, world_size=TP * PP)
    sys.argv = megatron_argv(out)
    args = parse_args()
    validate_args(args, {})
    args.padded_vocab_size = 128  # what Megatron's tokenizer setup computes for VOCAB at tp2
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
    model.eval()
    # Norm weights are 1 and biases 0 after init: perturb them (identically on the TP ranks
    # that replicate them) so the reader's placement of every tensor is tested.
    pp_rank = mpu.get_pipeline_model_parallel_rank()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "bias" in name or "layernorm" in name or "norm" in name:
                g = torch.Generator().manual_seed(zlib.crc32(f"{pp_rank}/{name}".encode()))
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = OptimizerParamScheduler(opt, init_lr=0.0, max_lr=1e-3, min_lr=1e-4, lr_warmup_steps=5 * BATCH,
                                    lr_decay_steps=100 * BATCH, lr_decay_style="cosine", start_wd=0.01,
                                    end_wd=0.01, wd_incr_steps=100 * BATCH, wd_incr_style="constant")
    sched.step(increment=ITERATION * BATCH)
    # No GPU: the CUDA generator's state is stood in by the CPU one (same type: a ByteTensor).
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    rng_state = checkpointing.get_rng_state(
        ckpt_format="torch", tp_group=mpu.get_tensor_model_parallel_group(), pp_group=mpu.get_pipeline_model_parallel_group()
    )
    state = checkpointing.generate_state_dict(args, [model], None, sched, rng_state, iteration=ITERATION)
    state["num_floating_point_operations_so_far"] = 0.0
    path = checkpointing.get_checkpoint_name(out, ITERATION)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(state, path)
    dist.barrier()
    if rank == 0:
        with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(ITERATION))

    # Reference forward of Megatron's model on a fixed batch, as the 2x2 grid. Dropout is 0, so
    # the CUDA RNG tracker's fork around attention dropout can be a no-op on CPU.
    import contextlib
    from megatron.core import tensor_parallel
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    inp, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    pos = torch.arange(SEQ).unsqueeze(0).expand(BATCH, SEQ)
    mask = torch.triu(torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool), diagonal=1)
    with torch.no_grad():
        if pre:
            hidden = model(inp, pos, mask)
            dist.send(hidden.contiguous(), mpu.get_pipeline_model_parallel_next_rank())
        else:
            hidden = torch.empty(SEQ, BATCH, 32)
            dist.recv(hidden, mpu.get_pipeline_model_parallel_prev_rank())
            model.set_input_tensor(hidden)
            loss = model(None, pos, mask, labels=labels)  # (B, S) per-token loss
            model.set_input_tensor(hidden)
            logits = model(None, pos, mask)  # (B, S, V/tp)
            parts = [torch.empty_like(logits) for _ in range(TP)]
            dist.all_gather(parts, logits.contiguous(), group=mpu.get_tensor_model_parallel_group())
            logits = torch.cat(parts, dim=-1)
            if mpu.get_tensor_model_parallel_rank() == 0:
                ref = {
                    "writer": "Megatron-LM GPTModel (local spec) tp2 pp2 on CPU/gloo, generate_state_dict + torch.save",
                    "tokens": inp.flatten().tolist(), "labels": labels.flatten().tolist(),
                    "batch": BATCH, "seq": SEQ, "vocab": VOCAB, "padded_vocab": 128,
                    "loss": loss.float().mean().item(),
                    "per_token_loss": loss.flatten().tolist(),
                    "logits": logits[..., :VOCAB].flatten().tolist(),
                }
                with open(os.path.join(out, "reference.json"), "w") as f:
                    json.dump(ref, f)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mlm", required=True, help="Megatron-LM checkout root (holds megatron/)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--port", type=int, default=29533)
    a = ap.parse_args()
    import torch.multiprocessing as mp
    mp.spawn(worker, args=(os.path.abspath(a.mlm), os.path.abspath(a.out), a.port), nprocs=TP * PP)


if __name__ == "__main__":
    main()
