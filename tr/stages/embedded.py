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
* initial weights: `gym_init.safetensors` next to this file, the `gym` model after 300 updates of
  in-context copying on random tokens (`tr.stages.base.copy_warmup`: a previous-token head, then
  an induction head; no gym text).  Like a pretrained checkpoint it is made once, offline
  (`python -m tr.stages.embedded pretrain`, ~2 min on 2 cores), and every Base starts from it, so
  the Base's budget is spent on the demos; a stage records the file's sha256 (`init_digest`).
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
INIT_FILE = TOKENIZER_FILE.with_name("gym_init.safetensors")
INIT = "tr/stages/gym_init.safetensors"             # as recorded in configs (repo-relative)
INIT_COPY_STEPS = 300                               # copy updates in the shipped init
SYSTEM_PROMPT = ("Shell agent in /app. Reply THOUGHT: <short> then COMMAND: and one ```bash "
                 "block, or THOUGHT: <short> then DONE when finished.")
ACT_THOUGHT = "Next step."
DONE_THOUGHT = "The task is complete."


def manifest_config() -> dict:
    """What a stage records so its graph can be rebuilt (`config.model`, `config.tokenizer`)."""
    return {"model": MODEL, "tokenizer": TOKENIZER, "system_prompt": SYSTEM_PROMPT}


def repo_path(spec: str) -> Path:
    """`spec` as a path; a relative one is taken from the repository root."""
    path = Path(spec)
    return path if path.is_absolute() else Path(__file__).resolve().parents[2] / path


def load_tokenizer(spec: str = TOKENIZER):
    """The tokenizer a manifest names: 'byte' or a tokenizer.json path (repo-relative allowed)."""
    from tr.models.tokenizer import load_tokenizer as load

    return load(spec if spec in ("", "byte") else str(repo_path(spec)))


def pin_tokenizer(spec: str) -> str:
    """`spec` pinned to its file's digest (`tr.models.tokenizer.pin_tokenizer`): the children of a
    stage that records it refuse a retrained file instead of decoding with the wrong ids."""
    from tr.models.tokenizer import PIN, pin_tokenizer as pin

    if spec in ("", "byte") or PIN in spec:
        return spec
    return pin(spec, repo_path(spec))


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


def file_digest(spec: str) -> str:
    """sha256 of the file `spec` names (repo-relative allowed); of a folder, over its
    `*.safetensors` files' names and bytes in name order (an HF checkpoint folder)."""
    import hashlib

    path = repo_path(spec)
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    digest = hashlib.sha256()
    for file in sorted(path.glob("*.safetensors")):
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def load_init(model, spec: str):
    """`model` (in place) with the weights of the safetensors file or HF folder `spec`
    (repo-relative allowed);
    "" leaves its random initialisation.  A missing or mismatched file is one error naming it."""
    from tr.models.weights import load_safetensors

    if not spec:
        return model
    path = repo_path(spec)
    if not path.exists():
        raise ValueError(f"config.init {spec!r}: no file or folder {path} (`python -m tr.stages.embedded "
                         "pretrain` writes the embedded one; '' starts from a random init)")
    try:
        return load_safetensors(model, path)
    except ValueError as e:
        raise ValueError(f"config.init {spec!r} does not fit model {model.config.name!r}: {e}") from e


def save_params(model, params, path: Path) -> Path:
    """Write `params` (a pure dict of `model`'s parameters) as one HF-named safetensors file."""
    from safetensors.numpy import save_file

    from tr.models.weights import assign_params, export_state_dict

    assign_params(model, params)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(export_state_dict(model), str(path), metadata={"format": "pt"})
    return path


def pretrain(path: Path = INIT_FILE, *, steps: int = INIT_COPY_STEPS, seed: int = 0) -> dict:
    """The shipped initial weights: the `gym` model from a random init (`seed`), `steps` copy
    updates (`tr.stages.base.copy_warmup` with the Base's `copy` settings), written to `path`.
    Returns the warm-up's stats with the file's sha256."""
    import time

    from flax import nnx

    from tr.models.decoder import Decoder
    from tr.stages import base
    from tr.train import steps as steps_lib

    config = base.defaults()
    config.seed, config.copy.steps = seed, steps
    model = Decoder(model_config(config.model), rngs=nnx.Rngs(seed))
    fns = steps_lib.nnx_model_fns(model)
    params, stats = base.copy_warmup(config, fns, load_tokenizer(config.tokenizer), time.monotonic())
    save_params(model, params, Path(path))
    return {**stats, "path": str(path), "sha256": file_digest(str(path))}


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
