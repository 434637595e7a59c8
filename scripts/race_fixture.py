#!/usr/bin/env python3
"""Writes the small RACE-format fixture of `megatron finetune --task RACE` (issue 15).

No package registry ships RACE, so this synthetic set stands in for it, in the layout of the
RACE distribution as Megatron's `tasks/race/data.py` reads it: `OUT/train` and `OUT/dev`,
directories of `*.txt` files with one JSON document per line, `{"article", "questions",
"options" (4 per question), "answers" ("A".."D")}`. Words are the BERT fixture's vocabulary
(`datasets/tests/fixtures/bert/vocab.txt`: w0..w149), so the tiny test model tokenizes them.

The task is learnable by a tiny model: the right option always holds a word of w120..w129,
the three others words of w130..w149 (the article: random words of w0..w99). Some questions
have a `_` blank (filled with the option), some not (option appended); some articles have
newlines, runs of spaces and " . " (cleaned by Megatron's `clean_text`).

`OUT/train_expected.jsonl` and `OUT/dev_expected.jsonl` are what Megatron's reader makes of every question, computed here with
its rules (`clean_text`, blank filling, `ord(answer) - ord("A")`; files in sorted name
order): one `{"context", "qa": [4], "label"}` per question, in reading order; the Rust reader
must give exactly these (`cargo test -p megatron-datasets --test race`).

  python scripts/race_fixture.py datasets/tests/fixtures/race
"""
import json
import os
import random
import re
import sys


def clean_text(text):
    # Megatron's tasks/race/data.py clean_text.
    text = text.replace("\n", " ")
    text = re.sub(r"\s+", " ", text)
    for _ in range(3):
        text = text.replace(" . ", ". ")
    return text


def words(rng, lo, hi, n):
    return [f"w{rng.randrange(lo, hi)}" for _ in range(n)]


def document(rng, questions):
    art = words(rng, 0, 100, rng.randrange(6, 12))
    # Sentence ends, a newline and a run of spaces for the cleaner.
    art.insert(3, ".")
    article = " ".join(art[:5]) + " \n  " + " ".join(art[5:]) + " ."
    qs, opts, answers = [], [], []
    for _ in range(questions):
        q = words(rng, 100, 120, rng.randrange(2, 4))
        if rng.random() < 0.5:
            q.insert(1, "_")
        right = rng.randrange(4)
        options = []
        for c in range(4):
            w = f"w{rng.randrange(120, 130)}" if c == right else f"w{rng.randrange(130, 150)}"
            options.append(w if rng.random() < 0.5 else f"{w} {words(rng, 0, 100, 1)[0]}")
        qs.append(" ".join(q))
        opts.append(options)
        answers.append("ABCD"[right])
    return {"article": article, "questions": qs, "options": opts, "answers": answers}


def expected(doc):
    out = []
    context = clean_text(doc["article"])
    for q, options, a in zip(doc["questions"], doc["options"], doc["answers"]):
        qa = [clean_text(q.replace("_", o) if "_" in q else " ".join([q, o])) for o in options]
        out.append({"context": context, "qa": qa, "label": ord(a) - ord("A")})
    return out


def main():
    out = sys.argv[1]
    rng = random.Random(1234)
    # split -> file name -> documents (lines); names sort in reading order.
    layout = {
        "train": {"a.txt": [4, 4], "b.txt": [4], "c.txt": [3, 5, 4]},
        "dev": {"x.txt": [4], "y.txt": [4, 4]},
    }
    for split, files in layout.items():
        os.makedirs(os.path.join(out, split), exist_ok=True)
        exp = []
        for name in sorted(files):
            docs = [document(rng, n) for n in files[name]]
            with open(os.path.join(out, split, name), "w") as f:
                for d in docs:
                    f.write(json.dumps(d) + "\n")
            for d in docs:
                exp.extend(expected(d))
        with open(os.path.join(out, f"{split}_expected.jsonl"), "w") as f:
            for e in exp:
                f.write(json.dumps(e) + "\n")
        print(f"{split}: {len(exp)} questions in {len(files)} files")


if __name__ == "__main__":
    main()
