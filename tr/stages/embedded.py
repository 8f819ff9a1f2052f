"""Makes the embedded default model's assets (tr/models/embedded.py, tr/models/assets/).

    python -m tr.stages.embedded tokenizer    # rebuild assets/gym_tokenizer.json (deterministic)
    python -m tr.stages.embedded measure      # tokens per gym episode, byte vs BPE
    python -m tr.stages.embedded pretrain     # rebuild assets/gym_init.safetensors (~2 min, 2 cores)

They live here, not beside the model, because they need what the model room may not import: the
tokenizer trains on gym text (`tr.envs.gym`, the harness's action format) and the init is the
`gym` model after the Base's copy warm-up (`tr.stages.base.copy_warmup`: 300 updates of in-context
copying on random tokens, a previous-token head then an induction head; no gym text).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from flax import nnx
from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers, trainers
from tokenizers import models as bpe_models

from tr.agent.harness import command_observation, format_action
from tr.envs import gym
from tr.models import chat
from tr.models.decoder import Decoder
from tr.models.embedded import (ACT_THOUGHT, DONE_THOUGHT, INIT_COPY_STEPS, INIT_FILE,
                                SYSTEM_PROMPT, TOKENIZER_FILE, TOKENIZER_VOCAB, file_digest,
                                load_tokenizer, model_config, save_params)
from tr.models.tokenizer import ENDOFTEXT, IM_END, IM_START, PAD, ByteTokenizer
from tr.stages import base
from tr.train.model_fns import nnx_model_fns

_WORDS_PATTERN = r"[A-Za-z]+|[0-9]|\s|[^\sA-Za-z0-9]+"


def pretrain(path: Path = INIT_FILE, *, steps: int = INIT_COPY_STEPS, seed: int = 0) -> dict:
    """The shipped initial weights: the `gym` model from a random init (`seed`), `steps` copy
    updates (`tr.stages.base.copy_warmup` with the Base's `copy` settings), written to `path`.
    Returns the warm-up's stats with the file's sha256."""
    config = base.defaults()
    config.seed, config.copy.steps = seed, steps
    model = Decoder(model_config(config.model), rngs=nnx.Rngs(seed))
    fns = nnx_model_fns(model)
    params, stats = base.copy_warmup(config, fns, load_tokenizer(config.tokenizer), time.monotonic())
    save_params(model, params, Path(path))
    return {**stats, "path": str(path), "sha256": file_digest(str(path))}


# ---------------------------------------------------------------- the tokenizer's training text


def gym_corpus(n_per_family: int = 200) -> list[str]:
    """Text like the gym's episodes: the system prompt, instructions, actions in the harness's
    format (reference, partial, mistake and repair commands), file names and contents as the
    observations show them.  Train split only."""
    texts = [SYSTEM_PROMPT, format_action(DONE_THOUGHT, None)]
    for family, seed in gym.split_seeds("train", n_per_family * (len(gym.FAMILIES) - 1)):
        inst = gym.instance(family, seed)
        texts += [SYSTEM_PROMPT, inst.instruction, format_action(DONE_THOUGHT, None),
                  "system\nuser\nassistant\n"]
        for command in {*inst.solution, *inst.partial, *inst.mistakes, *inst.repair}:
            texts.append(format_action(ACT_THOUGHT, command))
        listing = "\n".join(sorted(inst.files))
        texts.append(command_observation(listing, 0, False, 60))
        texts += [command_observation(text, 0, False, 60) for text in inst.files.values()]
    return texts


def train_tokenizer(path: Path = TOKENIZER_FILE, vocab_size: int = TOKENIZER_VOCAB, *,
                    words: bool = False) -> Path:
    """Byte-level BPE on `gym_corpus()` with the chat specials; written to `path`.  `words`: the
    pre-tokenizer first isolates words, single digits, single whitespace and punctuation runs
    (`tr.models.embedded.WORDS_TOKENIZER_FILE`)."""
    tok = Tokenizer(bpe_models.BPE())
    if words:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_WORDS_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=[PAD, ENDOFTEXT, IM_START, IM_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(gym_corpus(), trainer)
    path.write_text(tok.to_str(pretty=False) + "\n")
    return path


def measure(n_per_family: int = 20) -> dict:
    """Tokens per gym reference episode (prompt + actions + short observations), byte vs BPE."""
    out = {}
    for name, tok in (("byte", ByteTokenizer()), ("bpe", load_tokenizer())):
        lengths, prompts = [], []
        for family, seed in gym.split_seeds("val", n_per_family * len(gym.FAMILIES)):
            inst = gym.instance(family, seed)
            prompt = len(chat.prompt_ids(tok, SYSTEM_PROMPT, inst.instruction))
            n = prompt
            for command in inst.solution:
                n += len(tok.encode(format_action(ACT_THOUGHT, command))) + 1
                n += len(tok.encode(command_observation("", 0, False, 60))) + 8
            n += len(tok.encode(format_action(DONE_THOUGHT, None))) + 1
            lengths.append(n)
            prompts.append(prompt)
        out[name] = {"vocab": tok.vocab_size, "prompt_tokens": statistics.mean(prompts),
                     "episode_tokens": statistics.mean(lengths), "max_episode_tokens": max(lengths)}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tr.stages.embedded",
                                     description="rebuild the shipped tokenizer or initial weights; "
                                     "measure tokens per episode")
    parser.add_argument("command", choices=("tokenizer", "measure", "pretrain"))
    parser.add_argument("--out", default=str(INIT_FILE), help="pretrain: the file to write")
    parser.add_argument("--steps", type=int, default=INIT_COPY_STEPS, help="pretrain: copy updates")
    args = parser.parse_args(argv)
    if args.command == "tokenizer":
        print(f"wrote {train_tokenizer()}")
    elif args.command == "pretrain":
        stats = pretrain(Path(args.out), steps=args.steps)
        print(f"wrote {stats['path']} (sha256 {stats['sha256']}): {stats['steps']} copy updates, "
              f"loss {stats['loss']:.3f}, {stats['wall_s']:.0f}s")
    else:
        for name, row in measure().items():
            print(f"{name:5} vocab {row['vocab']:5}  prompt {row['prompt_tokens']:6.1f}  "
                  f"episode {row['episode_tokens']:6.1f}  max {row['max_episode_tokens']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
