"""The embedded default model: the model size, tokenizer and system prompt the gym's Base uses.

Named here once and recorded in every stage manifest (`stage.json` -> `config.model`,
`config.tokenizer`, `config.system_prompt`), so a later stage rebuilds the graph from its parent's
manifest (`from_manifest`).

* model: the named size `gym` (tr/models/config.py): the tiny decoder's shape at half its width
  (d_model 128, 4 layers, ~0.9M parameters) with a 1,024-token vocabulary and context.  On 2 CPU
  cores an SFT update of 8 x 512 tokens takes a fraction of a second.
* tokenizer: a byte-level BPE trained on gym text (`assets/gym_tokenizer.json`, 1,024 ids with the
  chat specials): a gym episode is ~3.5x fewer tokens than with the byte tokenizer, so prompts fit
  the sampler's smallest buckets and each action is a few dozen sampled tokens.
* system prompt: the harness's one action format, in one sentence.
* initial weights: `assets/gym_init.safetensors`, the `gym` model after 300 updates of in-context
  copying on random tokens (a previous-token head, then an induction head; no gym text).  Like a
  pretrained checkpoint it is made once, offline, and every Base starts from it, so the Base's
  budget is spent on the demos; a stage records the file's sha256 (`init_digest`).

The assets are made by `python -m tr.stages.embedded tokenizer|pretrain` (tr/stages/embedded.py:
training the tokenizer needs gym text, the init the Base's copy warm-up).  Runs made before the
assets moved here recorded them as `tr/stages/<file>`; `canonical` maps those to the files here.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from tr.models import tokenizer as tokenizer_lib
from tr.models.config import get_model_config
from tr.models.weights import assign_params, export_state_dict, load_safetensors

REPO_ROOT = Path(__file__).resolve().parents[2]
ASSETS = Path(__file__).resolve().parent / "assets"

MODEL = "gym"
TOKENIZER_FILE = ASSETS / "gym_tokenizer.json"
TOKENIZER = "tr/models/assets/gym_tokenizer.json"    # as recorded in manifests (repo-relative)
TOKENIZER_VOCAB = 1024
# A second BPE over the same text whose pre-tokenizer splits words, single digits, single
# whitespace characters and punctuation runs apart: a name or number is the same tokens wherever it
# stands ("/app/cache/x" and "mkdir cache"; "uid 9548" and "echo 9548"), so copying it from the
# instruction or an observation into a command is a token-for-token copy.
WORDS_TOKENIZER_FILE = ASSETS / "gym_tokenizer_words.json"
WORDS_TOKENIZER = "tr/models/assets/gym_tokenizer_words.json"
INIT_FILE = ASSETS / "gym_init.safetensors"
INIT = "tr/models/assets/gym_init.safetensors"       # as recorded in configs (repo-relative)
INIT_COPY_STEPS = 300                               # copy updates in the shipped init
SYSTEM_PROMPT = ("Shell agent in /app. Reply THOUGHT: <short> then COMMAND: and one ```bash "
                 "block, or THOUGHT: <short> then DONE when finished.")
ACT_THOUGHT = "Next step."
DONE_THOUGHT = "The task is complete."

# Where runs before the move recorded the assets (manifests, configs, reports): still readable.
MOVED_FROM = {
        "tr/stages/gym_tokenizer.json": TOKENIZER,
        "tr/stages/gym_tokenizer_words.json": WORDS_TOKENIZER,
        "tr/stages/gym_init.safetensors": INIT,
}


def manifest_config() -> dict:
    """What a stage records so its graph can be rebuilt (`config.model`, `config.tokenizer`)."""
    return {"model": MODEL, "tokenizer": TOKENIZER, "system_prompt": SYSTEM_PROMPT}


def canonical(spec: str) -> str:
    """`spec` with an asset path recorded before the move (`MOVED_FROM`) replaced by today's; a
    tokenizer pin (`#sha256=...`) is kept."""
    path, pin, digest = spec.partition(tokenizer_lib.PIN)
    return MOVED_FROM.get(path, path) + pin + digest


def repo_path(spec: str) -> Path:
    """`spec` as a path; a relative one is taken from the repository root."""
    path = Path(canonical(spec))
    return path if path.is_absolute() else REPO_ROOT / path


def load_tokenizer(spec: str = TOKENIZER):
    """The tokenizer a manifest names: 'byte' or a tokenizer.json path (repo-relative allowed)."""
    return tokenizer_lib.load_tokenizer(spec if spec in ("", "byte") else str(repo_path(spec)))


def pin_tokenizer(spec: str) -> str:
    """`spec` pinned to its file's digest (`tr.models.tokenizer.pin_tokenizer`): the children of a
    stage that records it refuse a retrained file instead of decoding with the wrong ids."""
    if spec in ("", "byte") or tokenizer_lib.PIN in spec:
        return spec
    spec = canonical(spec)
    return tokenizer_lib.pin_tokenizer(spec, repo_path(spec))


def model_config(name: str = MODEL, **overrides):
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
    # flax comes in with the weights: lazily, so loading an experiment config stays light

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
    from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top

    assign_params(model, params)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(export_state_dict(model), str(path), metadata={"format": "pt"})
    return path
