#!/usr/bin/env python3
"""The first finetuning step(s) of `megatron finetune` against transformers (issue 15, item 4).

`megatron finetune ... --hidden-dropout 0 --attention-dropout 0 --dump-first-step STEP.safetensors`
writes our first training step: the batch, every parameter before the step, the logits and mean
loss, every gradient before clipping, the gradient norm, the learning rate and every parameter
after clipping + AdamW. This script runs the same step in transformers'
BertForSequenceClassification (BertForMultipleChoice for a RACE dump) (dropout 0) from MODEL_DIR (the Hugging Face directory that was
imported) and prints, tensor by tensor, the largest relative difference (max |ours - hf| /
max |hf|) of: the imported weights, the logits, the loss, every gradient, the gradient norm and
the parameter update (after - before, relative to the learning rate; elements with a
gradient within 100 eps of 0 skipped: their first Adam step is the sign of rounding noise).
The weights of the transformers model are then set to ours (the fresh classification head included) so that every
later comparison sees the same starting point. AdamW uses Megatron's groups (no weight decay on
biases and LayerNorm parameters, i.e. 1-D tensors), betas (0.9, 0.999), eps 1e-8, clipping at
the dump's --clip-grad. With `--dump-steps N` the N steps run in turn on our batches and
learning rates: the logits and loss of every step are compared (later steps with looser bounds)
and the parameter drift after step N is printed. Exit status 1 when a tolerance is exceeded.

  python scripts/bert_finetune_step_check.py STEP.safetensors MODEL_DIR
"""
import sys

import torch
from safetensors.numpy import load_file
from transformers import BertConfig, BertForMultipleChoice, BertForSequenceClassification

TOL = {"import": 1e-6, "logits": 1e-4, "loss": 1e-5, "grad": 1e-3, "update": 1e-2, "logits_later": 1e-3,
       "loss_later": 1e-4}


def hf_names(ours, layers):
    """Our parameter name -> the transformers name(s) (q, k, v for the fused qkv)."""
    m = {
        "embedding.word_embeddings.weight": ["bert.embeddings.word_embeddings.weight"],
        "embedding.position_embeddings.weight": ["bert.embeddings.position_embeddings.weight"],
        "embedding.tokentype_embeddings.weight": ["bert.embeddings.token_type_embeddings.weight"],
    }
    for p in ["weight", "bias"]:
        m[f"embedding.layernorm.{p}"] = [f"bert.embeddings.LayerNorm.{p}"]
        m[f"pooler.dense.{p}"] = [f"bert.pooler.dense.{p}"]
        m[f"classification_head.{p}"] = [f"classifier.{p}"]
        m[f"multichoice_head.{p}"] = [f"classifier.{p}"]
        for l in range(layers):
            o, t = f"encoder.layers.{l}", f"bert.encoder.layer.{l}"
            m[f"{o}.self_attention.linear_qkv.{p}"] = [f"{t}.attention.self.{x}.{p}" for x in ("query", "key", "value")]
            m[f"{o}.self_attention.linear_proj.{p}"] = [f"{t}.attention.output.dense.{p}"]
            m[f"{o}.post_attention_layernorm.{p}"] = [f"{t}.attention.output.LayerNorm.{p}"]
            m[f"{o}.mlp.linear_fc1.{p}"] = [f"{t}.intermediate.dense.{p}"]
            m[f"{o}.mlp.linear_fc2.{p}"] = [f"{t}.output.dense.{p}"]
            m[f"{o}.post_mlp_layernorm.{p}"] = [f"{t}.output.LayerNorm.{p}"]
    return m[ours]


def to_ours(tensors, heads, shape):
    """transformers tensor(s) -> our layout: q/k/v into per-head [q_h; k_h; v_h] rows; the
    vocabulary zero-padded to our padded size."""
    if len(tensors) == 3:
        per = [t.reshape(heads, -1, *t.shape[1:]) for t in tensors]
        return torch.stack(per, 1).reshape(shape)
    t = tensors[0]
    if t.shape[0] != shape[0]:
        t = torch.cat([t, t.new_zeros(shape[0] - t.shape[0], *t.shape[1:])])
    return t


def from_ours(t, heads, hf_shapes):
    """Our tensor -> transformers tensor(s) (inverse of to_ours)."""
    if len(hf_shapes) == 3:
        parts = t.reshape(heads, 3, -1, *t.shape[1:]).unbind(1)
        return [p.reshape(s) for p, s in zip(parts, hf_shapes)]
    return [t[: hf_shapes[0][0]]]


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def main():
    dump, model_dir = sys.argv[1], sys.argv[2]
    d = {k: torch.from_numpy(v) for k, v in load_file(dump).items()}
    classes = d["s000.logits"].shape[1]
    # RACE dumps (`choices` > 1): rows come in groups of `choices`, one score per row, a softmax
    # per group: transformers' BertForMultipleChoice.
    choices = int(d["choices"].item()) if "choices" in d else 1
    cfg = BertConfig.from_pretrained(model_dir, num_labels=classes, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0, classifier_dropout=0.0)
    kind = BertForMultipleChoice if choices > 1 else BertForSequenceClassification
    model = kind.from_pretrained(model_dir, config=cfg).train()
    heads, layers = cfg.num_attention_heads, cfg.num_hidden_layers
    hf = dict(model.named_parameters())
    ours = sorted(k[len("before."):] for k in d if k.startswith("before."))
    failed = []

    def report(kind, name, r):
        bad = r > TOL[kind]
        if bad:
            failed.append(f"{kind} {name}")
        return f"{r:.2e}{'  <-- over ' + str(TOL[kind]) if bad else ''}"

    print("== imported weights (ours before the step vs transformers' checkpoint; the fresh head skipped)")
    worst = (0.0, "")
    for n in ours:
        names = hf_names(n, layers)
        if n.startswith(("classification_head.", "multichoice_head.")):
            continue
        r = rel(d[f"before.{n}"], to_ours([hf[x].detach() for x in names], heads, d[f"before.{n}"].shape))
        worst = max(worst, (r, n))
        if r > TOL["import"]:
            print(f"  {n}: {report('import', n, r)}")
    print(f"  worst {worst[0]:.2e} ({worst[1]})")
    # Start from exactly our parameters (the fresh head included).
    with torch.no_grad():
        for n in ours:
            names = hf_names(n, layers)
            for x, t in zip(names, from_ours(d[f"before.{n}"], heads, [hf[x].shape for x in names])):
                hf[x].copy_(t)

    steps = sorted(k[: -len(".tokens")] for k in d if k.endswith(".tokens"))
    wd, clip = d["weight_decay"].item(), d["clip_grad"].item()
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1.0, betas=(0.9, 0.999), eps=1e-8)
    lrs = []
    for k, tag in enumerate(steps):
        ids = d[f"{tag}.tokens"].long()
        b, s = ids.shape
        mask = (torch.arange(s)[None, :] < d[f"{tag}.lengths"].long()[:, None]).long()
        model.zero_grad()
        types = d[f"{tag}.types"].long()
        if choices > 1:
            ids, types, mask = (t.reshape(b // choices, choices, s) for t in (ids, types, mask))
        out = model(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=d[f"{tag}.labels"].long())
        # Later steps inherit the rounding differences of the earlier updates: looser bounds.
        kind = ("logits", "loss") if k == 0 else ("logits_later", "loss_later")
        ours_logits, hf_logits = d[f"{tag}.logits"], out.logits.detach()
        if choices > 1:
            # The options share multichoice_head.bias, so a constant shift of a question's
            # scores changes nothing (its exact gradient is 0, its Adam steps are rounding
            # noise): compare the scores relative to their mean.
            ours_logits = ours_logits - ours_logits.mean(1, keepdim=True)
            hf_logits = hf_logits - hf_logits.mean(1, keepdim=True)
        lg = report(kind[0], f"{tag} logits", rel(ours_logits, hf_logits))
        ls = report(kind[1], f"{tag} loss", rel(d[f"{tag}.loss"], out.loss.detach().reshape(1)))
        out.loss.backward()
        if k == 0:
            print("== gradients of step 1 (before clipping), max |ours - hf| / max |hf| per tensor")
            for n in ours:
                names = hf_names(n, layers)
                g = to_ours([hf[x].grad for x in names], heads, d[f"grad.{n}"].shape)
                if n == "multichoice_head.bias":
                    # Exactly 0 (see above): both must be rounding noise, relative to the norm.
                    r = max(d[f"grad.{n}"].abs().max().item(), g.abs().max().item()) / d[f"{tag}.grad_norm"].item()
                    print(f"  {n:55s} {report('grad', n, r)} (exact gradient 0: max |g| / grad norm)")
                    continue
                print(f"  {n:55s} {report('grad', n, rel(d[f'grad.{n}'], g))}")
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        lr = d[f"{tag}.lr"].item()
        lrs.append(lr)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        print(f"step {k + 1}: loss ours {d[f'{tag}.loss'].item():.7f} hf {out.loss.item():.7f} (rel {ls}) | "
              f"logits rel {lg} | grad norm ours {d[f'{tag}.grad_norm'].item():.6f} hf {norm.item():.6f} | lr {lr:.3e}")
    print(f"== parameters after {len(steps)} step(s) (AdamW, weight decay {wd:g} on 2-D tensors, clip {clip:g}): "
          "max |Δours - Δhf| / Σlr")
    total_lr = sum(lrs)
    for n in ours:
        names = hf_names(n, layers)
        after = to_ours([hf[x].detach() for x in names], heads, d[f"after.{n}"].shape)
        diff = (d[f"after.{n}"] - after).abs()
        if len(steps) == 1:
            # Adam's first step is lr·g/(|g|+eps): where |g| is within ~100 eps of 0 (the key
            # bias, whose exact gradient is 0) its sign is rounding noise, so those are skipped.
            g = to_ours([hf[x].grad for x in names], heads, d[f"grad.{n}"].shape)
            live = (g.abs() > 100 * 1e-8) | (g == 0)
            r = (diff[live].max() / total_lr).item() if live.any() else 0.0
            skipped = f" ({(~live).sum().item()} elements with 0 < |g| <= 1e-6 skipped)" if (~live).any() else ""
            print(f"  {n:55s} {report('update', n, r)}{skipped}")
        else:
            # Over several steps those noise elements drift by up to Σlr; the forward
            # comparisons above are the check, this is the size of the drift.
            frac = (diff > 0.1 * total_lr).float().mean().item()
            print(f"  {n:55s} {(diff.max() / total_lr).item():.2e} ({100 * frac:.3f}% of elements > 0.1·Σlr)")
    if failed:
        print(f"FAILED: {len(failed)} tensors over tolerance, first: {failed[0]}")
        sys.exit(1)
    print("OK: the step equals transformers' within", TOL)


if __name__ == "__main__":
    main()
