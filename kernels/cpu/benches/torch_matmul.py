"""PyTorch reference for `cargo bench -p megatron-cpu --bench ops -- bf16`: GFLOP/s of
torch.matmul in fp32 and bf16 on the same GPT-2 124M GEMM shapes and variants, on 2 threads.

Variants (M = 4096 tokens): forward y = x @ W.T (NT), input grad dx = dy @ W (NN), weight
grad dW += dy.T @ x (TN, accumulated in fp32 like our bf16 path: bf16 product, fp32 add).
Run under the heavy-work lock, in the same session as the Rust bench:
    flock /work/heavy.lock /work/venv/bin/python kernels/cpu/benches/torch_matmul.py
"""

import sys
import time

import torch


def rate(fn, flops, reps):
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    return flops / times[len(times) // 2] / 1e9


def main():
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    quick = "quick" in sys.argv
    torch.set_num_threads(threads)
    m, c, vocab = 4096, 768, 50304
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"mkldnn bf16 {torch.backends.mkldnn.is_available()}")
    print(f"{'shape':<9} {'var':<4} {'M':>6} {'N':>6} {'K':>6} | {'f32':>8} {'bf16':>8} | {'bf16/f32':>8}")
    shapes = [("qkv", 3 * c, c), ("attn-out", c, c), ("fc1", 4 * c, c), ("fc2", c, 4 * c), ("lm-head", vocab, c)]
    picked = [s for s in shapes if s[0] in sys.argv[1:]] or shapes  # optional shape names
    g = torch.Generator().manual_seed(0)
    for name, out_f, in_f in picked:
        reps = 2 if (quick or out_f == vocab) else 5
        res = {}
        for dt in (torch.float32, torch.bfloat16):
            x = torch.rand(m, in_f, generator=g).sub_(0.5).to(dt)
            w = torch.rand(out_f, in_f, generator=g).sub_(0.5).to(dt)
            dy = torch.rand(m, out_f, generator=g).sub_(0.5).to(dt)
            dw = torch.zeros(out_f, in_f, dtype=torch.float32)
            flops = 2.0 * m * out_f * in_f
            with torch.no_grad():
                res[("fwd", dt)] = rate(lambda: torch.matmul(x, w.t()), flops, reps)
                res[("dX", dt)] = rate(lambda: torch.matmul(dy, w), flops, reps)
                if dt == torch.float32:
                    res[("dW", dt)] = rate(lambda: dw.addmm_(dy.t(), x), flops, reps)
                else:
                    res[("dW", dt)] = rate(lambda: dw.add_(torch.matmul(dy.t(), x)), flops, reps)
        for var, (mm, nn, kk) in (("fwd", (m, out_f, in_f)), ("dX", (m, in_f, out_f)), ("dW", (out_f, in_f, m))):
            f, b = res[(var, torch.float32)], res[(var, torch.bfloat16)]
            print(f"{name:<9} {var:<4} {mm:>6} {nn:>6} {kk:>6} | {f:>8.1f} {b:>8.1f} | {b / f:>7.2f}x")


if __name__ == "__main__":
    main()
