"""Writes transformers/tests/data/logits_processors.json: what transformers' own logits
processors make of fixed scores, for zoo's processors to match (generation.rs's
`processors_match_transformers`).

Each case is a row's sequence (left pads, prompt, tokens generated so far), its eos ids, the
generation options as transformers names them and random raw scores. The processors are the
list `generate()` builds itself (`_prepare_generation_config` fills transformers' defaults, such
as top-k 50 when sampling; `_get_logits_processor` picks and orders them), applied to the
scores as at that step. Banned tokens are written as null.

Run: .venv/bin/python nightly/reference/logits_processors.py
"""

import json
import os

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessorList

OUT = os.path.join(os.path.dirname(__file__), "../../transformers/tests/data/logits_processors.json")
VOCAB = 96
PAD = 0

# (name, prompt with its left pads, pads, generated so far, eos ids, options)
CASES = [
    ("repetition_penalty_skips_pads", [0, 0, 5, 7, 7, 9], 2, [12, 5], [2], {"repetition_penalty": 1.8}),
    ("no_repeat_bigram", [4, 9, 4, 11, 4], 0, [9, 4], [2], {"no_repeat_ngram_size": 2}),
    ("no_repeat_trigram_with_pads", [0, 6, 8, 6, 8], 1, [6, 8], [2], {"no_repeat_ngram_size": 3}),
    ("no_repeat_unigram", [3, 14, 15], 0, [16], [2], {"no_repeat_ngram_size": 1}),
    ("bad_words", [5, 6, 7], 0, [20, 21], [2], {"bad_words_ids": [[30], [2], [21, 40], [20, 22, 41], [9, 42]]}),
    ("suppress_and_begin_suppress_first_step", [5, 6, 7], 0, [], [2], {"suppress_tokens": [10, 11], "begin_suppress_tokens": [2, 12]}),
    ("begin_suppress_later_step", [5, 6, 7], 0, [13], [2], {"suppress_tokens": [10], "begin_suppress_tokens": [2, 12]}),
    ("min_new_tokens_and_ngrams", [7, 8, 7], 0, [8], [2, 3], {"min_new_tokens": 3, "no_repeat_ngram_size": 2, "repetition_penalty": 1.3}),
    ("sampling_defaults_top_k_50", [5, 6], 0, [7], [2], {"do_sample": True}),
    ("sampling_top_k_0_keeps_all", [5, 6], 0, [7], [2], {"do_sample": True, "top_k": 0}),
    ("typical", [5, 6], 0, [7], [2], {"do_sample": True, "typical_p": 0.6, "top_k": 0}),
    ("typical_after_top_p", [5, 6], 0, [], [2], {"do_sample": True, "typical_p": 0.8, "top_p": 0.9, "temperature": 0.7}),
    ("epsilon", [5, 6], 0, [7], [2], {"do_sample": True, "epsilon_cutoff": 0.03, "top_k": 0}),
    ("epsilon_high", [5, 6], 0, [7], [2], {"do_sample": True, "epsilon_cutoff": 0.9, "top_k": 0}),
    ("eta", [5, 6], 0, [7], [2], {"do_sample": True, "eta_cutoff": 0.05, "top_k": 0}),
    ("eta_with_top_k_min_p", [5, 6], 0, [7], [2], {"do_sample": True, "eta_cutoff": 0.002, "top_k": 20, "min_p": 0.05, "temperature": 1.3}),
    ("everything", [0, 9, 4, 9], 1, [4, 9], [2], {"do_sample": True, "no_repeat_ngram_size": 2, "bad_words_ids": [[9, 30]], "suppress_tokens": [31], "repetition_penalty": 1.2, "typical_p": 0.9, "epsilon_cutoff": 0.001, "top_k": 30}),
]


def main() -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=8, intermediate_size=16,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, pad_token_id=PAD)).eval()
    gen = torch.Generator().manual_seed(1)
    cases = []
    for name, prompt, pads, generated, eos, options in CASES:
        scores = (torch.randn(1, VOCAB, generator=gen) * 1.5).float()
        prompt_ids = torch.tensor([prompt])
        mask = torch.tensor([[0] * pads + [1] * (len(prompt) - pads)])
        config, _ = model._prepare_generation_config(None, eos_token_id=eos, pad_token_id=PAD, **options)
        model._prepare_special_tokens(config, True, device="cpu")
        processors = model._get_logits_processor(
            generation_config=config,
            input_ids_seq_length=len(prompt),
            encoder_input_ids=prompt_ids,
            logits_processor=LogitsProcessorList(),
            device="cpu",
            model_kwargs={"attention_mask": mask},
        )
        seq = torch.tensor([prompt + generated])
        processed = processors(seq, scores.clone())[0]
        cases.append({
            "name": name,
            "seq": prompt + generated,
            "pads": pads,
            "step": len(generated),
            "eos": eos,
            "options": options,
            "processors": [type(p).__name__ for p in processors],
            "scores": scores[0].tolist(),
            "processed": [None if v == float("-inf") else v for v in processed.tolist()],
        })
    head = json.dumps({"transformers": transformers.__version__, "torch": torch.__version__,
                       "vocab": VOCAB})
    with open(OUT, "w") as f:
        # One case per line.
        f.write(head[:-1] + ', "cases": [\n')
        f.write(",\n".join(json.dumps(c) for c in cases))
        f.write("\n]}\n")
    print(f"wrote {len(cases)} cases to {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
