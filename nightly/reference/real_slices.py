"""What the real-model reference scripts (smollm2_expected.py, gemma3_expected.py) record the
same way: slices of transformers' logits for a one-prompt batch, greedy runs, the file's hash.

- prompt logits: one eager forward over the prompt (no cache); for every position the ids of
  its `top` highest logits and their values, plus the logits of fixed `probe` ids (so low
  logits are compared too);
- step logits: for each step of a greedy run with eos suppressed (cached decode), the top
  ids and values of the raw logits.
Floats are float(x) of the float32 values: exact.
"""

import hashlib

import torch


def top_of(row, k):
    values, idx = row.float().topk(k)
    return {"ids": idx.tolist(), "values": [float(v) for v in values]}


def logits_slices(model, ids, pad, new, probe, k=8):
    """(prompt_logits, step_logits, the greedy run's new ids) for `new` steps."""
    mask = torch.ones_like(ids)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[0]
        steps = model.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=pad,
                               max_new_tokens=new, min_new_tokens=new,
                               output_logits=True, return_dict_in_generate=True)
    prompt_logits = {
        "top": [top_of(row, k) for row in logits],
        "probe_ids": probe,
        "probe": [[float(row[i]) for i in probe] for row in logits],
    }
    step_logits = [top_of(step[0], k) for step in steps.logits]
    return prompt_logits, step_logits, steps.sequences[0, ids.shape[1]:].tolist()


def greedy(model, tok, ids, pad, **kw):
    """A greedy run's new ids and their text."""
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=pad, **kw)
    new = out[0, ids.shape[1]:].tolist()
    return {"ids": new, "text": tok.decode(new, skip_special_tokens=True)}


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
