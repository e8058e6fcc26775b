"""Tiny random BERT-family cases (BERT, RoBERTa, XLM-RoBERTa, DistilBERT, MPNet, ModernBERT):
hidden states and pooled output of the base models, and the logits of their heads on the
same encoder."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import (
    BertConfig,
    ModernBertConfig,
    ModernBertForMaskedLM,
    ModernBertForMultipleChoice,
    ModernBertForQuestionAnswering,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
    ModernBertModel,
    MPNetConfig,
    MPNetForMaskedLM,
    MPNetForSequenceClassification,
    MPNetModel,
    DistilBertConfig,
    DistilBertForMaskedLM,
    DistilBertForQuestionAnswering,
    DistilBertForSequenceClassification,
    DistilBertForTokenClassification,
    DistilBertModel,
    RobertaConfig,
    RobertaForMaskedLM,
    RobertaForQuestionAnswering,
    RobertaForSequenceClassification,
    RobertaForTokenClassification,
    RobertaModel,
    XLMRobertaConfig,
    XLMRobertaForSequenceClassification,
    XLMRobertaModel,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)

from common import TORCH_DTYPES, Case, TensorSpec, cast_as_loaded, randomize_parameters, run_capturing

VOCAB = 128
PAD_ID = 0

BASE_CONFIG: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "pad_token_id": PAD_ID,
}

# Architecture -> (class, case task). Head classes wrap the encoder as `bert`.
ARCHITECTURES: dict[str, tuple[type, str]] = {
    "BertModel": (BertModel, "feature-extraction"),
    "BertForMaskedLM": (BertForMaskedLM, "fill-mask"),
    "BertForSequenceClassification": (BertForSequenceClassification, "text-classification"),
    "BertForTokenClassification": (BertForTokenClassification, "token-classification"),
    "BertForQuestionAnswering": (BertForQuestionAnswering, "question-answering"),
    "BertForMultipleChoice": (BertForMultipleChoice, "multiple-choice"),
    "RobertaModel": (RobertaModel, "feature-extraction"),
    "RobertaForMaskedLM": (RobertaForMaskedLM, "fill-mask"),
    "RobertaForSequenceClassification": (RobertaForSequenceClassification, "text-classification"),
    "RobertaForTokenClassification": (RobertaForTokenClassification, "token-classification"),
    "RobertaForQuestionAnswering": (RobertaForQuestionAnswering, "question-answering"),
    "XLMRobertaModel": (XLMRobertaModel, "feature-extraction"),
    "XLMRobertaForSequenceClassification": (XLMRobertaForSequenceClassification, "text-classification"),
    "DistilBertModel": (DistilBertModel, "feature-extraction"),
    "DistilBertForMaskedLM": (DistilBertForMaskedLM, "fill-mask"),
    "DistilBertForSequenceClassification": (DistilBertForSequenceClassification, "text-classification"),
    "DistilBertForTokenClassification": (DistilBertForTokenClassification, "token-classification"),
    "DistilBertForQuestionAnswering": (DistilBertForQuestionAnswering, "question-answering"),
    "MPNetModel": (MPNetModel, "feature-extraction"),
    "MPNetForMaskedLM": (MPNetForMaskedLM, "fill-mask"),
    "MPNetForSequenceClassification": (MPNetForSequenceClassification, "text-classification"),
    "ModernBertModel": (ModernBertModel, "feature-extraction"),
    "ModernBertForMaskedLM": (ModernBertForMaskedLM, "fill-mask"),
    "ModernBertForSequenceClassification": (ModernBertForSequenceClassification, "text-classification"),
    "ModernBertForTokenClassification": (ModernBertForTokenClassification, "token-classification"),
    "ModernBertForQuestionAnswering": (ModernBertForQuestionAnswering, "question-answering"),
    "ModernBertForMultipleChoice": (ModernBertForMultipleChoice, "multiple-choice"),
}

# DistilBERT's names for BASE_CONFIG's sizes (no token types; its LayerNorms' epsilon is fixed).
DISTILBERT_NAMES = {"hidden_size": "dim", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
                    "intermediate_size": "hidden_dim", "hidden_act": "activation"}

# ModernBERT's names for BASE_CONFIG's fields (no token types, no position table), and its
# local window made short enough that the cases' 16 tokens cross it (half-window 4); layer 0
# attends globally, 1 and 2 locally.
MODERNBERT_NAMES = {"hidden_act": "hidden_activation", "layer_norm_eps": "norm_eps"}
MODERNBERT_CONFIG: dict[str, Any] = {"num_hidden_layers": 3, "intermediate_size": 32, "local_attention": 8,
                                     "global_attn_every_n_layers": 3, "global_rope_theta": 160000.0,
                                     "local_rope_theta": 10000.0, "layer_norm_eps": 1e-5,
                                     "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1, "sep_token_id": 2}

# RoBERTa's and XLM-RoBERTa's config beside BERT's: RobertaConfig's special ids (padding 1,
# whose index the position ids count from), one token type, two more positions.
ROBERTA_CONFIG: dict[str, Any] = {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "type_vocab_size": 1,
                                  "max_position_embeddings": 66}


def config_class(architecture: str) -> type:
    """The config class of a class of this module."""
    return (XLMRobertaConfig if architecture.startswith("XLMRoberta") else
            RobertaConfig if architecture.startswith("Roberta") else
            DistilBertConfig if architecture.startswith("DistilBert") else
            MPNetConfig if architecture.startswith("MPNet") else
            ModernBertConfig if architecture.startswith("ModernBert") else BertConfig)

# Choices per example of the multiple-choice cases (BertModelTester's num_choices is 4).
CHOICES = 4


def labels(*names: str) -> dict[str, Any]:
    """Config overrides for a classification head: id2label and label2id (num_labels follows)."""
    return {"id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)}}


@dataclass
class BertSpec:
    """One encoder case: config overrides and the shape of its batch."""

    name: str
    description: str
    features: list[str]
    config: dict[str, Any] = field(default_factory=dict)
    dtype: str = "f32"
    seed: int = 0
    seq_len: int = 12
    right_pad: int = 4  # pad tokens after the second sentence of the batch
    architecture: str = "BertModel"
    weight_std: float = 0.1
    left_pad: bool = False  # pad the padded row on the left instead


SPECS: list[BertSpec] = [
    BertSpec("bert-base-f32", "2 layers, 4 heads, gelu (erf), two segments, right-padded batch",
             ["gelu", "token-type-ids", "padding"], seed=501),
    BertSpec("bert-gelutanh-f32", "gelu_new (tanh approximation), layer_norm_eps 1e-5",
             ["gelu-tanh", "layer-norm-eps"], {"hidden_act": "gelu_new", "layer_norm_eps": 1e-5}, seed=502),
    BertSpec("bert-h64-f32", "hidden 64, 8 heads, 3 layers, right-padded batch",
             ["gelu", "padding"], {"hidden_size": 64, "num_attention_heads": 8, "num_hidden_layers": 3,
                                   "intermediate_size": 128}, seed=503, seq_len=16, right_pad=6),
    BertSpec("bert-base-bf16", "the bert-base-f32 shape in bfloat16", ["gelu", "padding", "bf16"],
             dtype="bf16", seed=504),
    BertSpec("bert-mlm-f32", "BertForMaskedLM: prediction transform, decoder tied to the word embeddings, "
             "output bias", ["gelu", "token-type-ids", "padding", "tied", "head:masked-lm"], seed=505,
             architecture="BertForMaskedLM"),
    BertSpec("bert-seqcls-f32", "BertForSequenceClassification: 3 labels (id2label) from the pooled output",
             ["gelu", "token-type-ids", "padding", "pooler", "head:sequence-classification"],
             labels("negative", "neutral", "positive"), seed=506, architecture="BertForSequenceClassification"),
    BertSpec("bert-tokcls-f32", "BertForTokenClassification: 5 BIO labels (id2label) per token",
             ["gelu", "token-type-ids", "padding", "head:token-classification"],
             labels("O", "B-PER", "I-PER", "B-LOC", "I-LOC"), seed=507, architecture="BertForTokenClassification"),
    # RoBERTa and XLM-RoBERTa: position ids counted from after the padding index, one token type.
    BertSpec("roberta-base-f32", "RobertaModel: padding id 1, positions from 2 on real tokens (padding keeps 1), "
             "one token type, right-padded batch", ["gelu", "padding", "positions:after-padding", "pooler"],
             seed=520, architecture="RobertaModel"),
    BertSpec("roberta-mlm-f32", "RobertaForMaskedLM: lm_head (dense, gelu, layer_norm), decoder tied to the word "
             "embeddings, lm_head.bias", ["gelu", "padding", "tied", "head:masked-lm"], seed=521,
             architecture="RobertaForMaskedLM"),
    BertSpec("roberta-seqcls-f32", "RobertaForSequenceClassification: 3 labels from the first token through "
             "classifier.dense, tanh, classifier.out_proj", ["gelu", "padding", "head:sequence-classification"],
             labels("negative", "neutral", "positive"), seed=522, architecture="RobertaForSequenceClassification"),
    BertSpec("roberta-tokcls-f32", "RobertaForTokenClassification: 3 labels per token",
             ["gelu", "padding", "head:token-classification"], labels("O", "B", "I"), seed=523,
             architecture="RobertaForTokenClassification"),
    BertSpec("roberta-qa-f32", "RobertaForQuestionAnswering: qa_outputs per token", ["gelu", "padding",
             "head:question-answering"], seed=524, architecture="RobertaForQuestionAnswering"),
    BertSpec("xlm-roberta-base-f32", "XLMRobertaModel: 3 layers, gelu_new, longer right padding",
             ["gelu-tanh", "padding", "positions:after-padding"], {"num_hidden_layers": 3, "hidden_act": "gelu_new"},
             seed=525, seq_len=16, right_pad=6, architecture="XLMRobertaModel"),
    # DistilBERT: BERT's encoder renamed, no token types, a ReLU pre-classifier.
    BertSpec("distilbert-base-f32", "DistilBertModel: transformer.layer.N (q_lin, sa_layer_norm, ffn.lin1), no "
             "token types, right-padded batch", ["gelu", "padding"], seed=530, architecture="DistilBertModel"),
    BertSpec("distilbert-mlm-f32", "DistilBertForMaskedLM: vocab_transform, gelu, vocab_layer_norm, vocab_projector "
             "tied to the word embeddings", ["gelu", "padding", "tied", "head:masked-lm"], seed=531,
             architecture="DistilBertForMaskedLM"),
    BertSpec("distilbert-seqcls-f32", "DistilBertForSequenceClassification: the first token through pre_classifier, "
             "ReLU, classifier (2 labels, as the SST-2 classifiers ship)", ["gelu", "padding",
                                                                          "head:sequence-classification"],
             labels("NEGATIVE", "POSITIVE"), seed=532, architecture="DistilBertForSequenceClassification"),
    BertSpec("distilbert-tokcls-f32", "DistilBertForTokenClassification, relu activation",
             ["relu", "padding", "head:token-classification"], {**labels("O", "B", "I"), "hidden_act": "relu"},
             seed=533, architecture="DistilBertForTokenClassification"),
    BertSpec("distilbert-qa-f32", "DistilBertForQuestionAnswering: qa_outputs per token",
             ["gelu", "padding", "head:question-answering"], seed=534, architecture="DistilBertForQuestionAnswering"),
    # MPNet: positions after padding index 1, a relative position bias in every layer, no token types.
    BertSpec("mpnet-base-f32", "MPNetModel: relative position bias (32 buckets), positions from 2 on real tokens, "
             "no token types, right-padded batch", ["gelu", "padding", "relative-bias", "positions:after-padding",
                                                    "pooler"], seed=540, architecture="MPNetModel"),
    BertSpec("mpnet-long-f32", "MPNetModel on 40 tokens: relative distances past the exact buckets", ["gelu",
             "padding", "relative-bias"], seed=541, seq_len=40, right_pad=9, architecture="MPNetModel"),
    BertSpec("mpnet-mlm-f32", "MPNetForMaskedLM: lm_head (dense, gelu, layer_norm), decoder tied to the word "
             "embeddings, lm_head.bias", ["gelu", "padding", "tied", "head:masked-lm"], seed=542,
             architecture="MPNetForMaskedLM"),
    BertSpec("mpnet-seqcls-f32", "MPNetForSequenceClassification: the first token through classifier.dense, tanh, "
             "classifier.out_proj", ["gelu", "padding", "head:sequence-classification"],
             labels("negative", "neutral", "positive"), seed=543, architecture="MPNetForSequenceClassification"),
    # ModernBERT: pre-norm, rotary, gated MLP, local attention in two of three layers.
    BertSpec("modernbert-base-f32", "ModernBertModel: 3 layers (global, local, local), local_attention 8 over 16 "
             "tokens, rotary bases 160000/10000, no biases, right-padded batch",
             ["gelu", "padding", "rotary", "sliding-window", "glu"], seed=550, seq_len=16, right_pad=5,
             architecture="ModernBertModel"),
    BertSpec("modernbert-base-bf16", "the modernbert-base-f32 shape in bfloat16 (rotary in f32, as transformers "
             "rotates)", ["gelu", "padding", "rotary", "sliding-window", "glu", "bf16"], dtype="bf16", seed=551,
             seq_len=16, right_pad=5, architecture="ModernBertModel"),
    BertSpec("modernbert-mlm-f32", "ModernBertForMaskedLM: head (dense, gelu, norm), decoder tied to the token "
             "embeddings with a bias", ["gelu", "padding", "rotary", "tied", "head:masked-lm"], seed=552,
             seq_len=16, right_pad=5, architecture="ModernBertForMaskedLM"),
    BertSpec("modernbert-seqcls-mean-f32", "ModernBertForSequenceClassification pooled by the mean over real "
             "tokens; every bias on, layer_types (local, global, local), linear rope scaling on the local layers, "
             "silu MLP", ["silu", "padding", "rotary", "rope-scaling", "sliding-window", "biases",
                          "head:sequence-classification"],
             {**labels("negative", "neutral", "positive"), "classifier_pooling": "mean", "norm_bias": True,
              "attention_bias": True, "mlp_bias": True, "classifier_bias": True, "hidden_act": "silu",
              "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
              "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 50000.0},
                                  "sliding_attention": {"rope_type": "linear", "factor": 2.0,
                                                        "rope_theta": 10000.0}}},
             seed=553, seq_len=16, right_pad=5, architecture="ModernBertForSequenceClassification"),
    BertSpec("modernbert-tokcls-f32", "ModernBertForTokenClassification: head then classifier per token, 3 labels",
             ["gelu", "padding", "rotary", "head:token-classification"], labels("O", "B", "I"), seed=554,
             seq_len=16, right_pad=5, architecture="ModernBertForTokenClassification"),
    BertSpec("modernbert-mc-f32", "ModernBertForMultipleChoice: each row pooled at its first real token "
             "(attention_mask.argmax; the padded row is padded on the left)",
             ["gelu", "padding", "left-padding", "rotary", "head:multiple-choice"], seed=555, seq_len=12,
             right_pad=4, left_pad=True, architecture="ModernBertForMultipleChoice"),
    BertSpec("xlm-roberta-rerank-f32", "XLMRobertaForSequenceClassification with one label (a cross-encoder "
             "reranker's head, as bge-reranker ships)", ["gelu", "padding", "head:sequence-classification"],
             {"num_labels": 1}, seed=526, architecture="XLMRobertaForSequenceClassification"),
]


def full_config(spec: BertSpec) -> dict[str, Any]:
    """The spec's config fields over the module's (and RoBERTa's) defaults; DistilBERT's
    under its own names."""
    cls = config_class(spec.architecture)
    if cls is DistilBertConfig:
        merged = {**BASE_CONFIG, **spec.config}
        out = {DISTILBERT_NAMES.get(k, k): v for k, v in merged.items()
               if k not in ("type_vocab_size", "layer_norm_eps")}
        out.setdefault("activation", "gelu")
        out["type_vocab_size"] = 0
        return out
    if cls is ModernBertConfig:
        merged = {**BASE_CONFIG, **MODERNBERT_CONFIG, **spec.config}
        out = {MODERNBERT_NAMES.get(k, k): v for k, v in merged.items() if k != "type_vocab_size"}
        out["type_vocab_size"] = 0
        return out
    roberta = {} if cls is BertConfig else ROBERTA_CONFIG
    # MPNet takes no token types (and its own relative-bias buckets).
    mpnet = {"type_vocab_size": 0, "relative_attention_num_buckets": 32} if cls is MPNetConfig else {}
    return {**BASE_CONFIG, **roberta, **mpnet, **spec.config}


def build_model(spec: BertSpec) -> torch.nn.Module:
    config = config_class(spec.architecture)(**{k: v for k, v in full_config(spec).items()
                                                if k != "type_vocab_size" or v})
    config.architectures = [spec.architecture]
    torch.manual_seed(spec.seed)
    model_class, _ = ARCHITECTURES[spec.architecture]
    model = model_class._from_config(config, attn_implementation="eager", dtype=torch.float32)
    # Every distinct parameter, heads included; a tied decoder shares the embedding's storage,
    # so it stays tied and save_pretrained stores it once.
    randomize_parameters(model, spec.seed, spec.weight_std)
    model = cast_as_loaded(model, TORCH_DTYPES[spec.dtype])
    model.config.dtype = TORCH_DTYPES[spec.dtype]
    return model


LOGITS_MEANING = {
    "fill-mask": "masked-LM scores [batch, seq, vocab]: cls.predictions transform, then the decoder "
                 "tied to bert.embeddings.word_embeddings plus cls.predictions.bias",
    "text-classification": "label scores [batch, num_labels]: classifier(pooler_output); names in "
                           "config.json id2label",
    "token-classification": "per-token label scores [batch, seq, num_labels]: classifier(last_hidden_state); "
                            "names in config.json id2label",
    "multiple-choice": "choice scores [batch, choices]: classifier(pooler_output) of each choice's row",
}
# RoBERTa's heads where they differ from BERT's.
ROBERTA_LOGITS_MEANING = {
    "fill-mask": "masked-LM scores [batch, seq, vocab]: lm_head dense, exact gelu, layer_norm, then the decoder "
                 "tied to roberta.embeddings.word_embeddings plus lm_head.bias",
    "text-classification": "label scores [batch, num_labels]: classifier.out_proj(tanh(classifier.dense(first "
                           "token))); names in config.json id2label",
}
# DistilBERT's heads where they differ from BERT's.
DISTILBERT_LOGITS_MEANING = {
    "fill-mask": "masked-LM scores [batch, seq, vocab]: vocab_transform, the activation, vocab_layer_norm, then "
                 "vocab_projector tied to distilbert.embeddings.word_embeddings, with its own bias",
    "text-classification": "label scores [batch, num_labels]: classifier(relu(pre_classifier(first token))); "
                           "names in config.json id2label",
}


# ModernBERT's heads: ModernBertPredictionHead (dense, activation, norm) before each.
MODERNBERT_LOGITS_MEANING = {
    "fill-mask": "masked-LM scores [batch, seq, vocab]: head (dense, gelu, norm), then the decoder tied to "
                 "model.embeddings.tok_embeddings with its own bias",
    "text-classification": "label scores [batch, num_labels]: classifier(head(pooled)), pooled as "
                           "classifier_pooling says (first token or mean over real tokens); names in id2label",
    "token-classification": "per-token label scores [batch, seq, num_labels]: classifier(head(last_hidden_state))",
    "multiple-choice": "choice scores [batch, choices]: classifier(head(each row's first real token))",
}


def make_inputs(spec: BertSpec) -> dict[str, torch.Tensor]:
    """Two sentences of random ids; the second is right-padded, each has two segments. For
    multiple choice, two examples of CHOICES such rows each ([2, CHOICES, seq]), the last
    choice of the second example right-padded."""
    gen = torch.Generator().manual_seed(spec.seed + 7919)
    config = full_config(spec)
    vocab, pad = config["vocab_size"], config["pad_token_id"]
    if ARCHITECTURES[spec.architecture][1] == "multiple-choice":
        ids = torch.randint(1, vocab, (2 * CHOICES, spec.seq_len), generator=gen, dtype=torch.int64)
        mask = torch.ones_like(ids)
        token_types = torch.zeros_like(ids)
        token_types[:, spec.seq_len // 2:] = 1
        if spec.right_pad:
            pad = slice(0, spec.right_pad) if spec.left_pad else slice(-spec.right_pad, None)
            ids[-1, pad] = PAD_ID
            mask[-1, pad] = 0
            token_types[-1, pad] = 0
        fields = (("input_ids", ids), ("attention_mask", mask), ("token_type_ids", token_types))
        # A family without token types (ModernBERT) takes none.
        return {k: v.view(2, CHOICES, spec.seq_len) for k, v in fields
                if k != "token_type_ids" or config["type_vocab_size"]}
    # Real tokens above the padding id (RoBERTa numbers positions by where padding is).
    ids = torch.randint(pad + 1, vocab, (2, spec.seq_len), generator=gen, dtype=torch.int64)
    mask = torch.ones_like(ids)
    token_types = torch.zeros_like(ids)
    if config["type_vocab_size"] > 1:
        token_types[:, spec.seq_len // 2:] = 1
    if spec.right_pad:
        ids[1, -spec.right_pad:] = pad
        mask[1, -spec.right_pad:] = 0
        token_types[1, -spec.right_pad:] = 0
    if not config["type_vocab_size"]:
        # DistilBERT takes no token types.
        return {"input_ids": ids, "attention_mask": mask}
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": token_types}


def run_forward(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """BertModel: hidden states and pooled output. A head: its logits, the encoder's hidden
    states (and pooled output where the head has a pooler), points named under `bert.`."""
    if model.base_model is model:
        return _run_base(model, inputs)
    base = model.base_model
    captured: dict[str, torch.Tensor] = {}

    def keep(name):
        def hook(_module, _args, output):
            captured[name] = output.last_hidden_state if name == "last_hidden_state" else output

        return hook

    hooks = [base.register_forward_hook(keep("last_hidden_state"))]
    if getattr(base, "pooler", None) is not None:
        hooks.append(base.pooler.register_forward_hook(keep("pooler_output")))
    try:
        points = _run_base(base, inputs, prefix=f"{model.base_model_prefix}.", head=model)
    finally:
        for hook in hooks:
            hook.remove()
    return {**captured, **points}


def _run_base(base: torch.nn.Module, inputs: dict[str, torch.Tensor], prefix: str = "",
              head: torch.nn.Module | None = None) -> dict[str, torch.Tensor]:
    """Runs `head` (default: `base` itself), capturing `base`'s embeddings and layer outputs."""
    points = {f"{prefix}embeddings": base.embeddings}
    # DistilBERT keeps its layers under `transformer.layer`, ModernBERT under `layers`.
    layers, name = ((base.transformer.layer, "transformer.layer") if hasattr(base, "transformer")
                    else (base.layers, "layers") if hasattr(base, "layers")
                    else (base.encoder.layer, "encoder.layer"))
    for i, layer in enumerate(layers):
        points[f"{prefix}{name}.{i}"] = layer
    out, captured = run_capturing(points, lambda: (head or base)(**inputs))
    if head is not None and hasattr(out, "start_logits"):
        return {"start_logits": out.start_logits, "end_logits": out.end_logits, **captured}
    if head is not None:
        return {"logits": out.logits, **captured}
    pooled = {"pooler_output": out.pooler_output} if getattr(out, "pooler_output", None) is not None else {}
    return {"last_hidden_state": out.last_hidden_state, **pooled, **captured}


def build_case(spec: BertSpec, out_dir: Path) -> Case:
    model = build_model(spec)
    model.save_pretrained(out_dir)
    inputs = make_inputs(spec)
    forward = run_forward(model, inputs)
    stored_as = "" if spec.dtype == "f32" else f", computed in {spec.dtype} and stored as f32 (exact upcast)"
    _, task = ARCHITECTURES[spec.architecture]
    # The encoder runs a multiple-choice batch as [batch * choices, seq] rows: its states are
    # compared under the attention mask as those rows.
    rows_mask = "attention_mask"
    extra_inputs = []
    if task == "multiple-choice":
        rows_mask = "row_attention_mask"
        extra_inputs.append(TensorSpec(rows_mask, inputs["attention_mask"].reshape(-1, spec.seq_len),
                                       "attention_mask as the [batch * choices, seq] rows the encoder runs "
                                       "(masks the states compared)"))
    outputs = []
    if "logits" in forward:
        per_token = forward["logits"].dim() == 3
        meaning = LOGITS_MEANING[task]
        if config_class(spec.architecture) is MPNetConfig:
            meaning = ROBERTA_LOGITS_MEANING.get(task, meaning).replace("roberta.", "mpnet.")
        elif config_class(spec.architecture) is DistilBertConfig:
            meaning = DISTILBERT_LOGITS_MEANING.get(task, meaning)
        elif config_class(spec.architecture) is ModernBertConfig:
            meaning = MODERNBERT_LOGITS_MEANING.get(task, meaning)
        elif config_class(spec.architecture) is not BertConfig:
            meaning = ROBERTA_LOGITS_MEANING.get(task, meaning)
        outputs.append(TensorSpec("logits", forward["logits"].float(), f"{meaning}{stored_as}",
                                  compare="allclose", mask="attention_mask" if per_token else None))
    for end in ("start", "end"):
        if f"{end}_logits" in forward:
            outputs.append(TensorSpec(f"{end}_logits", forward[f"{end}_logits"].float(),
                                      f"per-token scores of the answer span's {end} [batch, seq]: column "
                                      f"{0 if end == 'start' else 1} of qa_outputs(last_hidden_state){stored_as}",
                                      compare="allclose", mask="attention_mask"))
    rows = "batch * choices" if task == "multiple-choice" else "batch"
    outputs.append(TensorSpec("last_hidden_state", forward["last_hidden_state"].float(),
                              f"encoder output [{rows}, seq, hidden]{stored_as}", compare="allclose",
                              mask=rows_mask))
    if "pooler_output" in forward:
        outputs.append(TensorSpec("pooler_output", forward["pooler_output"].float(),
                                  f"tanh(dense(first token)) [{rows}, hidden]{stored_as}", compare="allclose"))
    for name, value in forward.items():
        if name.endswith(".output"):
            outputs.append(TensorSpec(name, value.float(), f"output of module {name[:-7]}{stored_as}",
                                      compare="allclose", mask=rows_mask))
    ids_meaning = ("token ids [batch, choices, seq]; right padding uses pad_token_id" if task == "multiple-choice"
                   else "token ids [batch, seq]; right padding uses pad_token_id")
    return Case(
        name=spec.name,
        architecture=spec.architecture,
        model_type=model.config.model_type,
        task=task,
        dtype=spec.dtype,
        seed=spec.seed,
        description=spec.description,
        features=spec.features,
        inputs=[
            TensorSpec("input_ids", inputs["input_ids"], ids_meaning),
            TensorSpec("attention_mask", inputs["attention_mask"], "1 for a real token, 0 for padding"),
            *([TensorSpec("token_type_ids", inputs["token_type_ids"], "segment ids (0 or 1)")]
              if "token_type_ids" in inputs else []),
            *extra_inputs,
        ],
        outputs=outputs,
    )
