#!/usr/bin/env python3
"""The official `openai` Python client against `megatron serve` on loopback.

Runs completions, chat, streaming, logprobs, n > 1, stop sequences, a seeded repeat and error
cases, printing each result (quoted in docs/serving.md). Start the server first, e.g.

    megatron serve --load CKPT --port 5077 --api-key demo-key &
    /work/venv/bin/python scripts/openai_demo.py --port 5077 --api-key demo-key
"""

import argparse
import json
import sys

import openai


def show(title, value):
    print(f"== {title}")
    print(value if isinstance(value, str) else json.dumps(value, indent=None, ensure_ascii=False))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5077)
    ap.add_argument("--api-key", default="demo-key")
    a = ap.parse_args()
    client = openai.OpenAI(base_url=f"http://{a.host}:{a.port}/v1", api_key=a.api_key, timeout=120, max_retries=0)

    models = client.models.list()
    model = models.data[0].id
    show("models", [m.id for m in models.data])

    r = client.completions.create(model=model, prompt="ROMEO: What light", max_tokens=12, temperature=0)
    show("completion (greedy)", {"text": r.choices[0].text, "finish_reason": r.choices[0].finish_reason,
                                 "usage": r.usage.model_dump()})

    r = client.completions.create(model=model, prompt="The king", max_tokens=5, temperature=0, logprobs=3,
                                  echo=True)
    lp = r.choices[0].logprobs
    show("completion logprobs + echo", {"text": r.choices[0].text, "tokens": lp.tokens,
                                         "token_logprobs": [None if x is None else round(x, 3) for x in lp.token_logprobs],
                                         "top_logprobs[-1]": {k: round(v, 3) for k, v in lp.top_logprobs[-1].items()}})

    r = client.completions.create(model=model, prompt="To be", max_tokens=8, n=3, temperature=1.0, seed=5)
    again = client.completions.create(model=model, prompt="To be", max_tokens=8, n=3, temperature=1.0, seed=5)
    show("n=3, seed=5", [c.text for c in r.choices])
    show("same seed again is identical", [c.text for c in again.choices] == [c.text for c in r.choices])

    full = client.completions.create(model=model, prompt="To be", max_tokens=8, temperature=1.0, seed=5).choices[0].text
    stop = " " + full.split()[2]
    r = client.completions.create(model=model, prompt="To be", max_tokens=8, temperature=1.0, seed=5,
                                  stop=[stop, "\n\n"])
    show(f"stop={stop!r}", {"without stop": full, "with stop": r.choices[0].text,
                            "finish_reason": r.choices[0].finish_reason, "usage": r.usage.model_dump()})

    r = client.chat.completions.create(model=model, messages=[{"role": "system", "content": "You are terse."},
                                                              {"role": "user", "content": "Say hello."}],
                                       max_tokens=10, temperature=0, logprobs=True, top_logprobs=2)
    c = r.choices[0]
    show("chat", {"content": c.message.content, "role": c.message.role, "finish_reason": c.finish_reason,
                  "first token logprobs": c.logprobs.content[0].model_dump() if c.logprobs.content else None,
                  "usage": r.usage.model_dump()})

    pieces = []
    for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello."}],
                                                max_tokens=10, temperature=0, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    show("chat streamed (pieces)", pieces)
    show("streamed == non-streamed", "".join(pieces) == c.message.content)

    pieces = []
    stream = client.completions.create(model=model, prompt="ROMEO: What light", max_tokens=12, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    usage = None
    for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
        if chunk.usage:
            usage = chunk.usage.model_dump()
    show("completion streamed", {"text": "".join(pieces), "usage": usage})

    for title, call in [
        ("error: temperature 5", lambda: client.completions.create(model=model, prompt="x", temperature=5)),
        ("error: unknown model", lambda: client.completions.create(model="gpt-9", prompt="x")),
        ("error: context too long", lambda: client.completions.create(model=model, prompt="x " * 200, max_tokens=4000)),
        ("error: wrong API key", lambda: openai.OpenAI(base_url=f"http://{a.host}:{a.port}/v1", api_key="wrong",
                                                       max_retries=0).models.list()),
    ]:
        try:
            call()
            show(title, "NO ERROR (unexpected)")
            sys.exit(1)
        except openai.APIStatusError as e:
            show(title, {"exception": type(e).__name__, "status": e.status_code, "body": e.body})


if __name__ == "__main__":
    main()
