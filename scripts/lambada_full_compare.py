#!/usr/bin/env python3
"""Summary of scripts/lambada_full_chunks.sh: for the chunks both sides finished, the counts of
`megatron eval` and of transformers (non-strict and strict), the examples whose verdicts differ
(global index, passage tail), and the seconds per example of each side.

    scripts/lambada_full_compare.py target/eval_runs/lambada_full [--json OUT]
"""
import glob
import json
import os
import sys


def main():
    d = sys.argv[1]
    chunk_files = sorted(glob.glob(os.path.join(d, "chunks", "c*.jsonl")))
    sizes = [sum(1 for line in open(f, encoding="utf-8") if line.strip()) for f in chunk_files]
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    report = {"chunks_total": len(chunk_files), "examples_total": sum(sizes)}
    done = []
    for i, f in enumerate(chunk_files):
        c = "%03d" % i
        hf = os.path.join(d, "hf_%s.json" % c)
        both = os.path.join(d, "ours_both_%s.json" % c)
        paths = [os.path.join(d, p % c) for p in ("ours_%s.json", "ours_strict_%s.json")]
        if not os.path.exists(hf):
            continue
        if os.path.exists(both):
            # One run for both rules (--lambada-both-rules): its time is split between them.
            b = json.load(open(both))
            for k in ("non_strict", "strict"):
                b[k]["seconds"] = b["seconds"] / 2
            done.append((i, [b["non_strict"], b["strict"], json.load(open(hf))]))
        elif all(os.path.exists(p) for p in paths):
            done.append((i, [json.load(open(p)) for p in paths] + [json.load(open(hf))]))
    report["chunks_done"] = [i for i, _ in done]
    n = sum(sizes[i] for i, _ in done)
    report["examples_done"] = n
    for key, k in (("non_strict", 0), ("strict", 1)):
        ours_c = hf_c = 0
        ours_s = hf_s = 0.0
        diffs = []
        for i, (o_ns, o_s, hf) in done:
            ours = (o_ns, o_s)[k]
            ref = hf[key]
            assert ours["total_examples"] == ref["total"] == sizes[i], f"chunk {i}: sizes differ"
            ours_c += int(ours["number_correct"])
            hf_c += ref["number_correct"]
            ours_s += ours["seconds"]
            hf_s += ref["seconds_per_example"] * ref["total"]
            for j, (a, b) in enumerate(zip(ours["correct"], ref["correct"])):
                if bool(a) != bool(b):
                    diffs.append({"index": offsets[i] + j, "ours": a, "transformers": b})
        report[key] = {
            "ours_correct": ours_c,
            "transformers_correct": hf_c,
            "examples": n,
            "ours_accuracy": ours_c / n if n else None,
            "transformers_accuracy": hf_c / n if n else None,
            "disagreements": diffs,
            "ours_seconds_per_example": ours_s / n if n else None,
            "transformers_seconds_per_example": hf_s / n if n else None,
        }
        print(
            f"{key}: {n}/{report['examples_total']} examples ({len(done)}/{len(chunk_files)} chunks): "
            f"ours {ours_c} ({ours_c / max(n, 1):.4f}), transformers {hf_c} ({hf_c / max(n, 1):.4f}), "
            f"{len(diffs)} disagreeing examples; s/example ours {ours_s / max(n, 1):.3f}, "
            f"transformers {hf_s / max(n, 1):.3f}"
        )
        for x in diffs:
            print("  differs at example", x["index"], "ours", x["ours"], "transformers", x["transformers"])
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:
            json.dump(report, f)


if __name__ == "__main__":
    main()
