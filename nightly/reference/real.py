"""Real-model cases, written on demand into a cache folder and never committed.

The weights stay where they are: case.json's checkpoint.path points at them by absolute
path, so a case folder holds only inputs, expected outputs and case.json.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, BertModel

from common import Case, TensorSpec

SMOLLM2_PROMPT = "What is the capital of France?"
SMOLLM2_NEW_TOKENS = 32
MINILM_SENTENCES = [
    "The capital of France is Paris.",
    "A quick brown fox jumps over the lazy dog, twice.",
    "Rust ports of transformer models should match PyTorch.",
]


def smollm2_case(gguf: Path, out_dir: Path) -> Case:
    """SmolLM2-135M-Instruct read through transformers' gguf_file= path (dequantized to f32)."""
    if not gguf.is_file():
        raise SystemExit(f"--gguf {gguf}: no such file")
    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    messages = [{"role": "user", "content": SMOLLM2_PROMPT}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(rendered, return_tensors="pt", add_special_tokens=False)["input_ids"]
    mask = torch.ones_like(ids)
    eos = model.generation_config.eos_token_id
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=SMOLLM2_NEW_TOKENS,
            min_new_tokens=SMOLLM2_NEW_TOKENS,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos,
            output_logits=True,
            output_scores=True,
            return_dict_in_generate=True,
        )
    new_ids = out.sequences[:, ids.shape[1]:]
    scores = torch.stack(out.scores, dim=1).float()
    top2 = scores.topk(2, dim=-1).values
    margins = top2[..., 0] - top2[..., 1]
    return Case(
        name="smollm2-135m-instruct-gguf",
        architecture=model.config.architectures[0] if model.config.architectures else "LlamaForCausalLM",
        model_type=model.config.model_type,
        task="causal-lm",
        dtype="f32",
        seed=0,
        description=f"{gguf.name} dequantized by transformers' gguf loader; chat prompt, greedy",
        features=["real-model", "gguf", "chat-template"],
        checkpoint={"path": str(gguf), "format": "gguf"},
        inputs=[
            TensorSpec("input_ids", ids, "the chat-templated prompt, tokenized by the GGUF's own tokenizer"),
            TensorSpec("attention_mask", mask, "all ones (one prompt, no padding)"),
        ],
        outputs=[
            TensorSpec("logits", logits, "next-token logits for every prompt position", compare="allclose"),
            TensorSpec("generated_ids", new_ids, f"{SMOLLM2_NEW_TOKENS} greedy new tokens", compare="exact"),
            TensorSpec("generated_logits", torch.stack(out.logits, dim=1).float(),
                       "raw logits of each greedy step [batch, step, vocab]", compare="allclose"),
            TensorSpec("generated_margins", margins, "best minus second-best processed score per step",
                       compare="info"),
        ],
        generation={
            "do_sample": False,
            "max_new_tokens": SMOLLM2_NEW_TOKENS,
            "min_new_tokens": SMOLLM2_NEW_TOKENS,
            "eos_token_id": eos,
            "min_top2_margin": float(margins.min()),
        },
        extra={
            "prompt": {
                "messages": messages,
                "rendered": rendered,
                "completion": tokenizer.decode(new_ids[0], skip_special_tokens=False),
            }
        },
    )


def minilm_case(model_dir: Path, out_dir: Path) -> Case:
    """all-MiniLM-L6-v2 as BertModel: hidden states, pooled output, sentence embeddings."""
    if not (model_dir / "config.json").is_file():
        raise SystemExit(f"--model-dir {model_dir}: no config.json there")
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = BertModel.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="eager").eval()
    batch = tokenizer(MINILM_SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch)
    mask = batch["attention_mask"].unsqueeze(-1).float()
    # sentence-transformers' recipe for this model: mean over real tokens, then L2 norm.
    mean = (out.last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    embedding = torch.nn.functional.normalize(mean, p=2, dim=1)
    return Case(
        name="all-minilm-l6-v2",
        architecture="BertModel",
        model_type="bert",
        task="feature-extraction",
        dtype="f32",
        seed=0,
        description="sentence-transformers/all-MiniLM-L6-v2 on three sentences, right-padded batch",
        features=["real-model", "padding", "mean-pooling"],
        checkpoint={"path": str(model_dir), "format": "safetensors"},
        inputs=[
            TensorSpec("input_ids", batch["input_ids"], "WordPiece ids, right-padded"),
            TensorSpec("attention_mask", batch["attention_mask"], "1 for a real token, 0 for padding"),
            TensorSpec("token_type_ids", batch["token_type_ids"], "all zeros (single segment)"),
        ],
        outputs=[
            TensorSpec("last_hidden_state", out.last_hidden_state, "encoder output", compare="allclose",
                       mask="attention_mask"),
            TensorSpec("pooler_output", out.pooler_output, "tanh(dense(first token))", compare="allclose"),
            TensorSpec("sentence_embedding", embedding, "mean over real tokens, L2-normalized",
                       compare="allclose"),
        ],
        extra={"sentences": MINILM_SENTENCES},
    )
