"""PyTorch reference for the GPT-2 124M training-step throughput of issue 11: eager
`GPT2LMHeadModel` (random init, no dropout), seq 1024, micro batch 4, AdamW, with
`torch.autocast("cpu", torch.bfloat16)` (or fp32), on N threads. Prints tokens/s of the timed
steps (after warm-up) and peak RSS.

    /work/venv/bin/python scripts/torch_gpt2_step.py --dtype bf16 --threads 2 --steps 3
"""
import argparse, resource, time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

p = argparse.ArgumentParser()
p.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
p.add_argument("--threads", type=int, default=2)
p.add_argument("--steps", type=int, default=3)
p.add_argument("--seq", type=int, default=1024)
p.add_argument("--mb", type=int, default=4)
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)
cfg = GPT2Config(n_positions=a.seq, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
model = GPT2LMHeadModel(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randint(0, cfg.vocab_size, (a.mb, a.seq))


def step():
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
        loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


step()  # warm-up
t = time.perf_counter()
for _ in range(a.steps):
    step()
secs = (time.perf_counter() - t) / a.steps
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"torch eager {a.dtype} threads {a.threads}: {a.mb * a.seq / secs:.1f} tokens/s ({secs:.2f} s/step), peak RSS {rss:.0f} MiB")
