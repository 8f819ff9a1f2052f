"""A stage's models: the actor and critic graphs built from the config, and the model size,
tokenizer and system prompt a stage inherits from its parent's manifest."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import ml_collections
from flax import nnx

from tr.agent.harness import SYSTEM_PROMPT
from tr.models import embedded
from tr.models.config import get_model_config
from tr.models.critic import CriticModel
from tr.models.decoder import Decoder
from tr.models.tokenizer import ByteTokenizer
from tr.stages.registry import ConfigError
from tr.train.model_fns import nnx_model_fns


@dataclasses.dataclass
class Models:
    """The actor and critic graphs of a stage, their pure functions and initial parameters, and the
    tokenizer and system prompt its rollouts use."""

    config: Any
    tokenizer: Any
    actor: Any
    critic: Any
    fns: Any
    system_prompt: str = ""


FALLBACK_MODEL = "tiny"


FALLBACK_TOKENIZER = "byte"


def parent_model(manifest: dict) -> tuple[dict, str, str]:
    """`({name, overrides}, tokenizer spec, system prompt)` a stage manifest records.

    A stage of the loop records `config.model` as `{name, overrides}`; the gym's Base
    (`tr.stages.base`, `tr.models.embedded.manifest_config`) as the size's name. A manifest without
    a tokenizer or system prompt is an older byte-tokenizer stage: the fallbacks.
    """
    config = manifest.get("config") or {}
    model = config.get("model")
    if isinstance(model, str) and model:
        model = {"name": model, "overrides": {}}
    elif isinstance(model, dict) and model.get("name"):
        model = {"name": model["name"], "overrides": dict(model.get("overrides") or {})}
    else:
        raise ConfigError(f"stage manifest of {manifest.get('stage')!r}: config.model = {model!r} "
                          "names no model size; cannot rebuild its model")
    return (model, config.get("tokenizer") or FALLBACK_TOKENIZER,
            config.get("system_prompt") or SYSTEM_PROMPT)


def inherit_from_parent(config, run_dir) -> ml_collections.ConfigDict:
    """Fills the stage config's unset `model`, `tokenizer`, `system_prompt` (in place) from the
    manifest of its `actor_from` stage, else with the fallbacks (`tiny`, `byte`, the harness's
    prompt), so the stage's own manifest records what it runs with and its children can rebuild it.

    A `critic_from` stage whose model or tokenizer differs from the result raises `ConfigError`.
    """
    def manifest_of(stage):
        path = pathlib.Path(run_dir) / stage / "stage.json"
        if not path.exists():
            raise ConfigError(f"stage {config.name!r}: parent stage {stage!r} has no manifest {path}")
        return json.loads(path.read_text())

    if config.actor_from:
        model, tokenizer, prompt = parent_model(manifest_of(config.actor_from))
    else:
        model, tokenizer, prompt = ({"name": FALLBACK_MODEL, "overrides": {}}, FALLBACK_TOKENIZER,
                                    SYSTEM_PROMPT)
    if not config.model.name:
        config.model.name = model["name"]
        if not config.model.overrides:
            config.model.overrides = model["overrides"]
    config.tokenizer = config.tokenizer or tokenizer
    config.system_prompt = config.system_prompt or prompt
    if config.critic_from and config.critic_from not in ("fresh", config.actor_from):
        critic_model, critic_tokenizer, _ = parent_model(manifest_of(config.critic_from))
        mine = {"name": config.model.name, "overrides": dict(config.model.overrides)}
        # canonical: a stage run before the embedded assets moved recorded tr/stages/<file>
        if (critic_model, embedded.canonical(critic_tokenizer)) != (
                mine, embedded.canonical(config.tokenizer)):
            raise ConfigError(f"stage {config.name!r}: critic_from={config.critic_from!r} has model "
                              f"{critic_model} / tokenizer {critic_tokenizer!r}, the stage "
                              f"{mine} / {config.tokenizer!r}")
    return config


def build_models(model_config, *, seed: int = 0, chunk_size: int = 1024,
                 tokenizer: str = FALLBACK_TOKENIZER, system_prompt: str = "",
                 policy_temperature: float = 1.0) -> Models:
    """The named size with overrides, and the tokenizer `tokenizer` names ('byte' or a
    tokenizer.json path, repo-relative allowed); both recorded in the stage manifest."""
    overrides = dict(model_config.overrides) if "overrides" in model_config else {}
    try:
        config = get_model_config(model_config.name or FALLBACK_MODEL, **overrides)
    except ValueError as error:
        raise ConfigError(f"config.model: {error}") from None
    if tokenizer in ("", "byte"):
        tok = ByteTokenizer(vocab_size=config.vocab_size)
    else:
        try:
            tok = embedded.load_tokenizer(tokenizer)
        except Exception as error:  # pylint: disable=broad-except
            raise ConfigError(f"config.tokenizer = {tokenizer!r}: {error}") from None
        if tok.vocab_size > config.vocab_size:
            raise ConfigError(f"config.tokenizer = {tokenizer!r} has {tok.vocab_size} ids > "
                              f"model {model_config.name!r} vocab_size {config.vocab_size}")
    actor = Decoder(config, rngs=nnx.Rngs(seed))
    critic = CriticModel(config, rngs=nnx.Rngs(seed + 1))
    fns = nnx_model_fns(actor, critic, chunk_size=min(chunk_size, config.max_seq_len),
                        temperature=policy_temperature)
    return Models(config, tok, actor, critic, fns, system_prompt or SYSTEM_PROMPT)


def stage_models(config, *, seed: int | None = None, chunk_size: int | None = None) -> Models:
    """`build_models` from a stage config (after `inherit_from_parent`)."""
    return build_models(config.model, seed=int(config.seed if seed is None else seed),
                        chunk_size=int(chunk_size or config.train.logprob_chunk_size),
                        tokenizer=config.tokenizer, system_prompt=config.system_prompt,
                        policy_temperature=float(config.train.get("policy_temperature", 1.0)))
