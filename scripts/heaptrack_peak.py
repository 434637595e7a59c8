#!/usr/bin/env python3
"""Live allocations at the heap peak of a run, grouped by the first three megatron frames
(docs/plan.md). Record and convert first:

    heaptrack -o run target/release/megatron pretrain ... --train-iters 2
    heaptrack_print -f run.zst --print-peaks 0 --print-allocators 0 --print-temporary 0 \
        --print-leaks 0 -F run.fg --flamegraph-cost-type peak
    scripts/heaptrack_peak.py run.fg [rows]
"""
import collections
import re
import sys

# Generic frames (allocation helpers, clones, collectives' plumbing) are skipped so the key
# names the module that owns the buffer.
SKIP = re.compile(r'HostBuffer|megatron_cpu::memory|megatron_cpu::backend|Clone|clone|from_iter|try_fold|'
                  r'Payload|megatron_core::tensor|alloc::|core::iter|ensure_buffer|state_tensors|'
                  r'init::take_shard|ModuleBuilder|World::collective')


def main():
    agg = collections.Counter()
    with open(sys.argv[1]) as f:
        for line in f:
            stack, cost = line.rsplit(' ', 1)
            frames = [re.sub(r'::h[0-9a-f]{16}.*$', '', x) for x in stack.split(';')]
            frames = [re.sub(r'_\$LT\$|\$GT\$|\$u20\$|\$u7b\$|\$u7d\$|\$C\$', '', x) for x in frames]
            keep = [x for x in frames if 'megatron' in x and not SKIP.search(x)]
            key = ' < '.join(list(reversed(keep))[:3]) if keep else frames[-1]
            agg[key] += int(cost)
    print("total %.1f MB" % (sum(agg.values()) / 1e6))
    for key, v in agg.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 30):
        if v > 0.5e6:
            print(f"{v / 1e6:9.1f}M  {key[:200]}")


if __name__ == '__main__':
    main()
