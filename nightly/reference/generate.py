#!/usr/bin/env python3
"""Writes zoo parity cases from the real PyTorch libraries (transformers, diffusers).

Tiny random families: Llama, Mistral, Qwen2, Qwen3 (lm.py), Phi-3 (phi3.py), Gemma, Gemma 2,
Gemma 3 (gemma.py), Mixtral, Qwen2-MoE, Qwen3-MoE (moe.py), GGUF files of these as llama.cpp
writes them (gguf_families.py), GPT-2 (gpt2.py), BERT, RoBERTa, XLM-RoBERTa, DistilBERT and MPNet and their
masked-LM, sequence-, token-classification, question-answering and multiple-choice heads
(bert.py), CLIP's text encoder (clip.py),
ViT, CLIP's vision tower and CLIPModel (vision.py), T5's and UMT5's encoders (t5.py),
T5 and UMT5 encoder-decoders with generation (seq2seq.py); the peers' own tester
configurations of the causal-LM families (tester.py, a few committed, all in the sweep).

Every number a zoo parity test compares against comes from here. A case is one folder:
the checkpoint (config.json + model.safetensors as save_pretrained writes them),
inputs.safetensors, expected.safetensors and case.json. nightly/README.md documents the
format so that any generator can write cases.

Examples, from the repository root:

  # every tiny random case into the committed fixture folder
  .venv/bin/python nightly/reference/generate.py

  # prove the committed fixtures are what the pinned stack makes (byte for byte)
  .venv/bin/python nightly/reference/generate.py --check

  # list the case names, then regenerate two of them elsewhere
  .venv/bin/python nightly/reference/generate.py --list
  .venv/bin/python nightly/reference/generate.py --only llama-gqa-f32 bert-base-f32 \
      --out /tmp/cases

  # every case on the peers' own tester configurations (tester.py) into a cache folder
  .venv/bin/python nightly/reference/generate.py --tester --out .cache/zoo-tester-cases

  # a real-model case into a cache folder (never committed)
  .venv/bin/python nightly/reference/generate.py --real smollm2 --gguf PATH/model.gguf --out ~/.cache/zoo/cases
  .venv/bin/python nightly/reference/generate.py --real minilm --model-dir PATH/all-MiniLM-L6-v2 --out ~/.cache/zoo/cases

Reruns are bit-identical: torch runs single-threaded with deterministic kernels and every
random draw comes from a generator seeded per case.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import make_deterministic, reference_block, write_case  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "nightly" / "fixtures"


def tiny_builders():
    """Name -> (spec, builder) for every committed tiny random case, in a stable order."""
    import bert
    import clip
    import compressed
    import fp8
    import gemma
    import gguf_families
    import gpt2
    import llava
    import lm
    import peft_lora
    import moe
    import phi3
    import seq2seq
    import siglip
    import t5
    import tester
    import vision

    table = {}
    for module in (lm, phi3, gemma, moe, gguf_families, gpt2, bert, clip, vision, siglip, llava, t5, seq2seq,
                   peft_lora, compressed, fp8):
        for spec in module.SPECS:
            table[spec.name] = (spec, module.build_case)
    # A few of the peers' tester configurations are committed; the sweep writes them all.
    for spec in tester.SPECS:
        if spec.name in tester.COMMITTED:
            table[spec.name] = (spec, tester.build_case)
    return table


def tester_builders():
    """Name -> (spec, builder) for every case on the peers' tester configurations."""
    import tester

    return {spec.name: (spec, tester.build_case) for spec in tester.SPECS}


class CaseDir:
    """A case folder written atomically: built in a hidden sibling, swapped in when complete.

    A crash therefore never leaves a half-written case behind, and an existing folder
    is only replaced if it is a case (has case.json), so a mistyped --out cannot wipe
    unrelated files.
    """

    def __init__(self, final: Path):
        self.final = final
        if final.exists() and any(final.iterdir()) and not (final / "case.json").exists():
            raise SystemExit(f"refusing to overwrite {final}: not empty and has no case.json")
        self.work = final.with_name(f".{final.name}.partial")
        if self.work.exists():
            shutil.rmtree(self.work)
        self.work.mkdir(parents=True)

    def commit(self) -> Path:
        if self.final.exists():
            shutil.rmtree(self.final)
        self.work.rename(self.final)
        return self.final


def tiny_names(only: list[str] | None) -> list[str]:
    table = tiny_builders()
    names = only or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"unknown case(s): {', '.join(unknown)}; --list shows the names")
    return names


def generate_tiny(out: Path, only: list[str] | None, quiet: bool = False, table=None) -> None:
    names = tiny_names(only) if table is None else only or list(table)
    table = table or tiny_builders()
    for name in names:
        spec, build = table[name]
        target = CaseDir(out / name)
        case = build(spec, target.work)
        write_case(case, target.work, reference_block({"attn_implementation": "eager"}))
        path = target.commit()
        if not quiet:
            print(f"wrote {path}")


def check_tiny(committed: Path, only: list[str] | None) -> int:
    """Regenerates into a temp folder and compares with `committed`; returns the exit code.

    Every file must be byte-identical except case.json's reference.command, which records
    how this particular run was invoked.
    """
    names = tiny_names(only)
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        generate_tiny(Path(tmp), only, quiet=True)
        for name in names:
            problems += compare_case_dirs(Path(tmp) / name, committed / name)
    if only is None and committed.is_dir():
        stale = sorted(p.name for p in committed.iterdir() if p.is_dir() and p.name not in names)
        problems += [f"{name}: committed but no longer generated" for name in stale]
    for problem in problems:
        print(problem)
    print(f"{len(names)} cases checked, {len(problems)} difference(s)")
    return 1 if problems else 0


def compare_case_dirs(fresh: Path, committed: Path) -> list[str]:
    if not committed.is_dir():
        return [f"{committed.name}: missing from {committed.parent}"]
    problems = []
    # Files of subfolders too (a case's adapters).
    def listing(root: Path) -> set[str]:
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}

    files = sorted(listing(fresh) | listing(committed))
    for file in files:
        a, b = fresh / file, committed / file
        if not a.exists() or not b.exists():
            problems.append(f"{committed.name}/{file}: only in {'the fresh run' if a.exists() else committed}")
        elif file == "case.json":
            if _without_command(a) != _without_command(b):
                problems.append(f"{committed.name}/{file}: differs")
        elif a.read_bytes() != b.read_bytes():
            problems.append(f"{committed.name}/{file}: differs")
    return problems


def _without_command(path: Path) -> dict:
    doc = json.loads(path.read_text())
    doc.get("reference", {}).pop("command", None)
    return doc


def generate_real(args: argparse.Namespace) -> None:
    import real

    if args.real == "smollm2":
        if args.gguf is None:
            raise SystemExit("--real smollm2 needs --gguf PATH (the .gguf file)")
        target = CaseDir(args.out / "smollm2-135m-instruct-gguf")
        case = real.smollm2_case(args.gguf.resolve(), target.work)
    else:
        if args.model_dir is None:
            raise SystemExit("--real minilm needs --model-dir DIR (config.json, model.safetensors, tokenizer)")
        target = CaseDir(args.out / "all-minilm-l6-v2")
        case = real.minilm_case(args.model_dir.resolve(), target.work)
    write_case(case, target.work, reference_block())
    print(f"wrote {target.commit()}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=None,
                        help=f"folder that receives one sub-folder per case (default for tiny cases: {DEFAULT_OUT})")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="generate only these tiny cases")
    parser.add_argument("--list", action="store_true", help="print the tiny case names and what each covers")
    parser.add_argument("--check", action="store_true",
                        help="regenerate into a temp folder and compare with --out (default: the fixtures); "
                             "exit 1 on any difference")
    parser.add_argument("--tester", action="store_true",
                        help="write the cases on the peers' own tester configurations (tester.py) instead; "
                             "--out is required (a cache folder: only a few of them are committed)")
    parser.add_argument("--real", choices=["smollm2", "minilm"],
                        help="write a real-model case instead of the tiny ones; --out is required")
    parser.add_argument("--gguf", type=Path, help="SmolLM2 .gguf file, for --real smollm2")
    parser.add_argument("--model-dir", type=Path, help="all-MiniLM-L6-v2 folder, for --real minilm")
    args = parser.parse_args(argv)
    if args.check and args.real:
        parser.error("--check applies to the tiny cases only")
    if args.tester and (args.out is None or args.check or args.real):
        parser.error("--tester needs --out (a cache folder) and goes without --check and --real")
    if args.real and args.out is None:
        parser.error("--real needs --out: real-model cases go to a cache folder, never to the fixtures")
    return args


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if args.list:
        for name, (spec, _) in (tester_builders() if args.tester else tiny_builders()).items():
            print(f"{name:28} {spec.description}")
        return
    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    make_deterministic()
    if args.tester:
        table = tester_builders()
        unknown = [n for n in args.only or [] if n not in table]
        if unknown:
            raise SystemExit(f"unknown tester case(s): {', '.join(unknown)}; --tester --list shows the names")
        generate_tiny(args.out, args.only, table=table)
    elif args.real:
        generate_real(args)
    elif args.check:
        sys.exit(check_tiny(args.out or DEFAULT_OUT, args.only))
    else:
        generate_tiny(args.out or DEFAULT_OUT, args.only)


if __name__ == "__main__":
    main(sys.argv[1:])
