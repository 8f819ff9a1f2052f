"""The embedded default model: the model size, tokenizer and system prompt the gym's Base uses.

Named here once and recorded in every stage manifest (`stage.json` -> `config.model`,
`config.tokenizer`, `config.system_prompt`), so a later stage rebuilds the graph from its parent's
manifest (`from_manifest`).

* model: the named size `gym` (tr/models/config.py): the tiny decoder's shape at half its width
  (d_model 128, 4 layers, ~0.9M parameters) with a 1,024-token vocabulary and context.  On 2 CPU
  cores an SFT update of 8 x 512 tokens takes a fraction of a second.
* tokenizer: a byte-level BPE trained on gym text (`gym_tokenizer.json` next to this file, 1,024
  ids with the chat specials): a gym episode is ~3.5x fewer tokens than with the byte tokenizer
  (`python -m tr.stages.embedded measure` prints the numbers), so prompts fit the sampler's
  smallest buckets and each action is a few dozen sampled tokens.
  `python -m tr.stages.embedded tokenizer` rebuilds the file (deterministic).
* system prompt: the harness's one action format, in one sentence.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

MODEL = "gym"
TOKENIZER_FILE = Path(__file__).resolve().parent / "gym_tokenizer.json"
TOKENIZER = "tr/stages/gym_tokenizer.json"          # as recorded in manifests (repo-relative)
TOKENIZER_VOCAB = 1024
# A second BPE over the same text whose pre-tokenizer splits words, single digits, single
# whitespace characters and punctuation runs apart: a name or number is the same tokens wherever it
# stands ("/app/cache/x" and "mkdir cache"; "uid 9548" and "echo 9548"), so copying it from the
# instruction or an observation into a command is a token-for-token copy.
WORDS_TOKENIZER_FILE = TOKENIZER_FILE.with_name("gym_tokenizer_words.json")
WORDS_TOKENIZER = "tr/stages/gym_tokenizer_words.json"
_WORDS_PATTERN = r"[A-Za-z]+|[0-9]|\s|[^\sA-Za-z0-9]+"
SYSTEM_PROMPT = ("Shell agent in /app. Reply THOUGHT: <short> then COMMAND: and one ```bash "
                 "block, or THOUGHT: <short> then DONE when finished.")
ACT_THOUGHT = "Next step."
DONE_THOUGHT = "The task is complete."


def manifest_config() -> dict:
    """What a stage records so its graph can be rebuilt (`config.model`, `config.tokenizer`)."""
    return {"model": MODEL, "tokenizer": TOKENIZER, "system_prompt": SYSTEM_PROMPT}


def _repo_path(spec: str) -> Path:
    path = Path(spec)
    return path if path.is_absolute() else Path(__file__).resolve().parents[2] / path


def load_tokenizer(spec: str = TOKENIZER):
    """The tokenizer a manifest names: 'byte' or a tokenizer.json path (repo-relative allowed)."""
    from tr.models.tokenizer import load_tokenizer as load

    return load(spec if spec in ("", "byte") else str(_repo_path(spec)))


def pin_tokenizer(spec: str) -> str:
    """`spec` pinned to its file's digest (`tr.models.tokenizer.pin_tokenizer`): the children of a
    stage that records it refuse a retrained file instead of decoding with the wrong ids."""
    from tr.models.tokenizer import PIN, pin_tokenizer as pin

    if spec in ("", "byte") or PIN in spec:
        return spec
    return pin(spec, _repo_path(spec))


def model_config(name: str = MODEL, **overrides):
    from tr.models.config import get_model_config

    return get_model_config(name, **overrides)


def from_manifest(manifest: dict):
    """(ModelConfig, tokenizer, system prompt) named by a stage manifest's config."""
    config = manifest.get("config") or {}
    for field in ("model", "tokenizer"):
        if field not in config:
            raise ValueError(f"stage manifest of {manifest.get('stage')!r} has no config.{field}; "
                             "cannot rebuild its model")
    return (model_config(config["model"]), load_tokenizer(config["tokenizer"]),
            config.get("system_prompt", SYSTEM_PROMPT))


# ---------------------------------------------------------------- the tokenizer's training text


def gym_corpus(n_per_family: int = 200) -> list[str]:
    """Text like the gym's episodes: the system prompt, instructions, actions in the harness's
    format (reference, partial, mistake and repair commands), file names and contents as the
    observations show them.  Train split only."""
    from tr.agent.harness import command_observation, format_action
    from tr.envs import gym

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
    (`WORDS_TOKENIZER_FILE`)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from tr.models.tokenizer import ENDOFTEXT, IM_END, IM_START, PAD

    tok = Tokenizer(models.BPE())
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
    from tr.agent.harness import command_observation, format_action
    from tr.envs import gym
    from tr.models import chat
    from tr.models.tokenizer import ByteTokenizer

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
    parser = argparse.ArgumentParser(prog="python -m tr.stages.embedded")
    parser.add_argument("command", choices=("tokenizer", "measure"))
    args = parser.parse_args(argv)
    if args.command == "tokenizer":
        print(f"wrote {train_tokenizer()}")
    else:
        for name, row in measure().items():
            print(f"{name:5} vocab {row['vocab']:5}  prompt {row['prompt_tokens']:6.1f}  "
                  f"episode {row['episode_tokens']:6.1f}  max {row['max_episode_tokens']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
