"""Checkpoints as models: the one loader every checkpoint-taking command uses (`termrl eval`,
`termrl serve`, `termrl export`, `python -m tr.agent.rollout --checkpoint`, the `evaluate` job's
`config.eval.checkpoints`, the Terminal-RSI report's test evaluations).

A checkpoint is named by a spec:

    W/STAGE[@STEP]     a stage of a run: the actor of the stage store `W/STAGE` at STEP, else the
                       stage's retained step (`summary.json`), else its latest complete step
    hf:DIR             a Hugging Face Qwen3 folder: `config.json`, `*.safetensors`, `tokenizer.json`
                       (`termrl export` writes one, with `tr.json` beside them)
    openai:URL#MODEL   an OpenAI-compatible endpoint (evaluation only: no weights to load)

The model graph and the tokenizer always come from the checkpoint itself: a stage's manifest
(`stage.json: config.model / tokenizer / system_prompt`, the tokenizer pinned to its file's
sha256), an HF folder's `config.json` and `tokenizer.json`.  What does not fit is refused with a
`CheckpointError` naming the field: a tokenizer with more ids than the model's vocabulary, a
retrained tokenizer file, parameters of another shape, a `tr.json` that disagrees with
`config.json`, a model size or tokenizer the caller asked for that is not the checkpoint's
(`expect`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import shutil
from typing import Any

from tr.agent.harness import SYSTEM_PROMPT
from tr.agent.policies import ModelPolicy
from tr.models import embedded
from tr.models.config import get_model_config
from tr.models.decoder import Decoder
from tr.models.tokenizer import ByteTokenizer
from tr.models.weights import assign_params, config_from_hf, load_safetensors, save_safetensors
from tr.stages.actor import episode_sampler
from tr.stages.registry import ConfigError
from tr.stages.stage_models import parent_model
from tr.train.checkpoint import CheckpointError as StoreError, StageStore

HF_PREFIX = "hf:"
OPENAI_PREFIX = "openai:"
SIDECAR = "tr.json"          # what an exported folder adds to the HF files: model name, prompt
# ModelConfig fields Hugging Face's config.json does not carry; they change how the graph runs,
# not its numbers, and an export records them so its logits are bit-identical to the stage's.
EXECUTION_FIELDS = ("scan_layers", "attention_chunk", "remat")


class CheckpointError(ConfigError, ValueError):
    """A checkpoint spec that names nothing loadable, or a checkpoint that does not fit (a
    `ConfigError`: the entry points print it as one line and exit 2)."""


@dataclasses.dataclass(frozen=True)
class Spec:
    """A parsed checkpoint spec: kind 'stage' (run_dir, stage, step), 'hf' (path) or 'openai'
    (url, model)."""

    kind: str
    text: str
    run_dir: pathlib.Path | None = None
    stage: str = ""
    step: int | None = None
    path: pathlib.Path | None = None
    url: str = ""
    model: str = ""


@dataclasses.dataclass
class Loaded:
    """A checkpoint's actor: the `Decoder` holding its weights, the pure parameter dict, the
    tokenizer and system prompt it was trained with, and where it came from (`source`: spec,
    kind, step, `model` {name, overrides}, `tokenizer` spec)."""

    model: Any
    params: Any
    tokenizer: Any
    system_prompt: str
    source: dict

    @property
    def config(self):
        return self.model.config


def parse(spec: str) -> Spec:
    """`spec` as a `Spec`; `CheckpointError` (one line) when it names nothing of the three kinds."""
    text = str(spec or "").strip()
    if not text:
        raise CheckpointError("checkpoint: empty spec; expected W/STAGE, hf:DIR or openai:URL#MODEL")
    if text.startswith(OPENAI_PREFIX):
        url, sep, model = text[len(OPENAI_PREFIX):].partition("#")
        if not sep or not model or not url.startswith(("http://", "https://")):
            raise CheckpointError(f"checkpoint {text!r}: expected openai:http(s)://HOST[:PORT]/v1#MODEL")
        return Spec("openai", text, url=url, model=model)
    if text.startswith(HF_PREFIX):
        path = pathlib.Path(text[len(HF_PREFIX):]).expanduser()
        if not (path / "config.json").is_file():
            raise CheckpointError(f"checkpoint {text!r}: {path} has no config.json (a Hugging Face "
                                  "model folder)")
        return Spec("hf", text, path=path.resolve())
    body, _, step_text = text.rpartition("@") if "@" in pathlib.Path(text).name else (text, "", "")
    step = None
    if step_text:
        if not step_text.isdigit():
            raise CheckpointError(f"checkpoint {text!r}: step {step_text!r} is not a number")
        step = int(step_text)
    path = pathlib.Path(body).expanduser()
    if not (path / "stage.json").is_file():
        if (path / "config.json").is_file():
            hint = f"; a Hugging Face folder is hf:{body}"
        elif path.is_dir() and any((p / "stage.json").is_file() for p in path.iterdir() if p.is_dir()):
            stages = sorted(p.name for p in path.iterdir() if (p / "stage.json").is_file())
            hint = f"; {body} is a run: name one of its stages {stages}"
        else:
            hint = ""
        raise CheckpointError(f"checkpoint {text!r}: {path} is not a stage of a run (no stage.json)"
                              f"{hint}; expected W/STAGE, hf:DIR or openai:URL#MODEL")
    path = path.resolve()
    return Spec("stage", text, run_dir=path.parent, stage=path.name, step=step)


# ------------------------------------------------------------------------------------------------
# Graph and tokenizer from what the checkpoint records


def _tokenizer(spec: str, model_config, where: str):
    """The tokenizer `spec` names ('byte': byte ids sized to the model's vocabulary), refused when
    it has more ids than the model's embedding."""

    if spec in ("", "byte"):
        return ByteTokenizer(vocab_size=model_config.vocab_size)
    try:
        tokenizer = embedded.load_tokenizer(spec)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{where}: tokenizer {spec!r}: {' '.join(str(error).split())}") from None
    if tokenizer.vocab_size > model_config.vocab_size:
        raise CheckpointError(f"{where}: tokenizer {spec!r} has {tokenizer.vocab_size} ids but model "
                              f"{model_config.name!r} has vocab_size {model_config.vocab_size}")
    return tokenizer


def stage_graph(manifest: dict, where: str):
    """(ModelConfig, tokenizer, system prompt, {name, overrides}, tokenizer spec) a stage manifest
    records (`stage_models.parent_model`: a loop stage's `{name, overrides}` or the Base's size name)."""

    try:
        model, tokenizer_spec, prompt = parent_model(manifest)
    except ConfigError as error:
        raise CheckpointError(f"{where}: {error}") from None
    try:
        model_config = get_model_config(model["name"], **model["overrides"])
    except (ValueError, TypeError) as error:
        raise CheckpointError(f"{where}: config.model {model}: {error}") from None
    return (model_config, _tokenizer(tokenizer_spec, model_config, where), prompt, model,
            tokenizer_spec)


def check_expected(loaded: Loaded, *, model: str | None = None, tokenizer: str | None = None) -> None:
    """Refuses a checkpoint whose model size / tokenizer is not the one a caller also named."""
    have_model = loaded.source["model"]["name"]
    if model and model != have_model:
        raise CheckpointError(f"checkpoint {loaded.source['spec']!r} holds model {have_model!r}, "
                              f"not the {model!r} asked for")
    have_tok = loaded.source["tokenizer"]
    if tokenizer and tokenizer.split("#")[0] != have_tok.split("#")[0]:
        raise CheckpointError(f"checkpoint {loaded.source['spec']!r} was trained with tokenizer "
                              f"{have_tok!r}, not the {tokenizer!r} asked for")


# ------------------------------------------------------------------------------------------------
# Loading


def load(spec: str | Spec, *, expect_model: str | None = None,
         expect_tokenizer: str | None = None) -> Loaded:
    """The actor `spec` names (a stage or an HF folder), with its own model config and tokenizer."""
    parsed = spec if isinstance(spec, Spec) else parse(spec)
    if parsed.kind == "stage":
        loaded = load_stage(parsed.run_dir, parsed.stage, parsed.step, spec=parsed.text)
    elif parsed.kind == "hf":
        loaded = load_hf(parsed.path, spec=parsed.text)
    else:
        raise CheckpointError(f"checkpoint {parsed.text!r}: an OpenAI endpoint has no weights to "
                              "load (only `termrl eval` takes one)")
    check_expected(loaded, model=expect_model, tokenizer=expect_tokenizer)
    return loaded


def stage_step(run_dir, stage: str, step: int | None = None) -> int | None:
    """`step`, else the stage's retained step (`summary.json`), else None (the latest)."""
    if step is not None:
        return step
    summary = pathlib.Path(run_dir) / stage / "summary.json"
    if summary.is_file():
        data = json.loads(summary.read_text())
        retained = data.get("retained_step")
        return int(data["finished_step"] if retained is None else retained)
    return None


def load_stage(run_dir, stage: str, step: int | None = None, *, spec: str | None = None) -> Loaded:
    """The actor of stage `stage` of `run_dir` at `step` (default: `stage_step`)."""
    from flax import nnx  # pylint: disable=g-import-not-at-top

    run_dir = pathlib.Path(run_dir)
    where = str(run_dir / stage)
    spec = spec or where
    manifest_path = run_dir / stage / "stage.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise CheckpointError(f"checkpoint {spec!r}: cannot read {manifest_path}: {error}") from None
    model_config, tokenizer, prompt, model_name, tokenizer_spec = stage_graph(manifest, where)
    model = Decoder(model_config, rngs=nnx.Rngs(0))
    target = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    step = stage_step(run_dir, stage, step)
    quiet = logging.getLogger("absl")   # Orbax's warnings that a read-only store does not save
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with StageStore(run_dir, stage, async_save=False, read_only=True) as store:
            step = store.latest_step() if step is None else step
            if step is None:
                raise CheckpointError(f"checkpoint {spec!r}: stage {stage!r} has no complete "
                                      "checkpoint")
            params = store.restore_item("actor_params", target, step=step)
    except StoreError as error:
        raise CheckpointError(f"checkpoint {spec!r}: {error}") from None
    except (ValueError, TypeError, KeyError) as error:   # Orbax: the saved tree is not this graph's
        raise CheckpointError(f"checkpoint {spec!r}: its actor parameters do not fit model "
                              f"{model_name} recorded in {manifest_path}: "
                              f"{' '.join(str(error).split())[:300]}") from None
    finally:
        quiet.setLevel(level)
    assign_params(model, params)
    return Loaded(model, params, tokenizer, prompt,
                  {"spec": spec, "kind": "stage", "run_dir": str(run_dir), "stage": stage,
                   "step": int(step), "model": model_name, "tokenizer": tokenizer_spec})


def load_hf(path, *, spec: str | None = None) -> Loaded:
    """An HF Qwen3 folder: `config.json` (`weights.config_from_hf`), its safetensors, its
    `tokenizer.json` (else the byte tokenizer); `tr.json`, when there, names the size and the
    execution fields and the system prompt, and must agree with `config.json`."""
    from flax import nnx  # pylint: disable=g-import-not-at-top

    path = pathlib.Path(path)
    spec = spec or f"{HF_PREFIX}{path}"
    sidecar = {}
    if (path / SIDECAR).is_file():
        try:
            sidecar = json.loads((path / SIDECAR).read_text())
        except json.JSONDecodeError as error:
            raise CheckpointError(f"checkpoint {spec!r}: {path / SIDECAR}: {error}") from None
    named = sidecar.get("model") or {}
    execution = {k: v for k, v in (sidecar.get("execution") or {}).items() if k in EXECUTION_FIELDS}
    try:
        model_config = config_from_hf(path, name=named.get("name") or "hf", **execution)
    except (OSError, ValueError, TypeError) as error:
        raise CheckpointError(f"checkpoint {spec!r}: {error}") from None
    if named.get("name"):    # the size tr.json names must be the one config.json describes
        try:
            recorded = get_model_config(named["name"], **dict(named.get("overrides") or {}))
        except ValueError as error:
            raise CheckpointError(f"checkpoint {spec!r}: {path / SIDECAR}: {error}") from None
        differ = [f.name for f in dataclasses.fields(recorded)
                  if getattr(recorded, f.name) != getattr(model_config, f.name)]
        if differ:
            raise CheckpointError(
                f"checkpoint {spec!r}: {SIDECAR} names model {named['name']!r} but config.json "
                f"differs in {', '.join(f'{f} ({getattr(recorded, f)!r} vs {getattr(model_config, f)!r})' for f in differ)}")
    tokenizer_spec = str(path / "tokenizer.json") if (path / "tokenizer.json").is_file() else "byte"
    tokenizer = _tokenizer(tokenizer_spec, model_config, spec)
    model = Decoder(model_config, rngs=nnx.Rngs(0))
    try:
        load_safetensors(model, path)
    except (OSError, ValueError, KeyError) as error:
        raise CheckpointError(f"checkpoint {spec!r}: {' '.join(str(error).split())[:400]}") from None
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    return Loaded(model, params, tokenizer, sidecar.get("system_prompt") or SYSTEM_PROMPT,
                  {"spec": spec, "kind": "hf", "path": str(path), "step": sidecar.get("step"),
                   "model": {"name": model_config.name,
                             "overrides": dict(named.get("overrides") or {})},
                   "tokenizer": tokenizer_spec})


def export_hf(loaded: Loaded, out) -> list[str]:
    """`loaded`'s actor as an HF folder `out`: `model.safetensors` + `config.json`
    (`weights.save_safetensors`), its `tokenizer.json` (none for the byte tokenizer), and `tr.json`
    (the size's name and overrides, the execution fields, the system prompt, the source), so
    `load_hf(out)` gives the same graph and the same logits.  Returns the files written."""

    out = pathlib.Path(out)
    if out.exists() and any(out.iterdir()):
        raise CheckpointError(f"--out {out}: exists and is not empty (refusing to overwrite)")
    files = save_safetensors(loaded.model, out)
    tokenizer_path = getattr(loaded.tokenizer, "path", None)
    if tokenizer_path:
        shutil.copyfile(tokenizer_path, out / "tokenizer.json")
        files.append("tokenizer.json")
    config = loaded.config
    sidecar = {"model": loaded.source["model"],
               "execution": {f: getattr(config, f) for f in EXECUTION_FIELDS},
               "system_prompt": loaded.system_prompt, "tokenizer": loaded.source["tokenizer"],
               "source": loaded.source["spec"], "step": loaded.source.get("step")}
    (out / SIDECAR).write_text(json.dumps(sidecar, indent=1, sort_keys=True) + "\n")
    files.append(SIDECAR)
    return files


def model_policy(loaded: Loaded, *, concurrency: int = 16, max_new_tokens: int = 256,
                 temperature: float = 0.6, top_p: float = 0.95, seed: int = 0,
                 name: str | None = None):
    """A `ModelPolicy` over the stages' batch-invariant `EpisodeSampler` (`actor.episode_sampler`)
    with `loaded`'s weights and tokenizer; the caller closes `policy.sampler`."""

    sampler = episode_sampler(loaded.model, loaded.tokenizer, concurrency=concurrency,
                              max_new_tokens=max_new_tokens)
    return ModelPolicy(sampler, loaded.tokenizer, temperature=temperature, top_p=top_p, seed=seed,
                       name=name or loaded.source["spec"])


def describe(loaded: Loaded) -> str:
    """One line: what was loaded."""
    src = loaded.source
    step = f" step {src['step']}" if src.get("step") is not None else ""
    return (f"{src['spec']}{step}: model {src['model']['name']} "
            f"({loaded.config.vocab_size} ids, {loaded.config.n_layers} layers), tokenizer "
            f"{os.path.basename(str(src['tokenizer']).split('#')[0])}")
