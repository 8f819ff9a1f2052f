"""Opening and closing a training stage in the run's stage store.

`open_stage` builds the models from the stage config, turns `actor_from` / `critic_from` into one
`tr.train.checkpoint.Side` per side (a parent stage's *retained* step, chosen on `val`; `fresh`; or
nothing) and resumes or hands off (`start_stage`). `finish_stage` saves the final state, records
the retained step and writes `summary.json`, which marks the stage finished for the pipeline.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import jax

from tr.stages.stage_config import resolve_stage_config, stage_defaults
from tr.stages.stage_models import Models, inherit_from_parent, stage_models
from tr.stages.registry import ConfigError
from tr.train import checkpoint as ckpt
from tr.train.compile import UpdateSteps, build_steps
from tr.train.optim import make_optimizer
from tr.train.state import TrainState, abstract_state, create_train_state


@dataclasses.dataclass
class OpenStage:
    models: Models
    steps: UpdateSteps
    state: TrainState
    store: ckpt.StageStore
    stage_dir: pathlib.Path


def summary_path(run_dir, stage: str) -> pathlib.Path:
    return pathlib.Path(run_dir) / stage / "summary.json"


def finished_summary(run_dir, stage: str) -> dict | None:
    """The summary of a finished stage (manifest `finished_step` set and summary written)."""
    path = summary_path(run_dir, stage)
    manifest = pathlib.Path(run_dir) / stage / "stage.json"
    if not path.exists() or not manifest.exists():
        return None
    if json.loads(manifest.read_text()).get("finished_step") is None:
        return None
    return json.loads(path.read_text())


def parent_ref(run_dir, stage: str) -> ckpt.StageRef:
    """A parent stage's retained step (its summary's `retained_step`), else its latest step."""
    if not (pathlib.Path(run_dir) / stage).is_dir():
        raise ConfigError(f"stage {stage!r} named as a parent does not exist in {run_dir}")
    summary = finished_summary(run_dir, stage)
    step = None if summary is None else summary.get("retained_step")
    return ckpt.StageRef(stage, step)


def critic_from_actor(critic_params: dict, run_dir, ref: ckpt.StageRef, actor_target) -> dict:
    """`critic_params` with its backbone replaced by the actor weights `ref` names (value head,
    bias and start value kept: zero).  The critic's backbone is the decoder without its output
    projection, the same tree as a tied-embedding actor's parameters."""
    with ckpt.StageStore(run_dir, ref.stage, read_only=True) as store:
        step = store.resolve_step(ref.step)
        actor = store.restore_item("actor_params", actor_target, step)
    if jax.tree.structure(actor) != jax.tree.structure(critic_params["backbone"]):
        raise ConfigError(f"critic_init='actor': stage {ref.stage!r}'s actor parameters are not the "
                          "critic backbone's tree (an untied output projection?)")
    return {**critic_params, "backbone": actor}


def open_stage(config, run_dir, *, kind: str, actor_trains: bool, critic_trains: bool,
               critic_frozen: bool = False) -> OpenStage:
    """Models, compiled steps, and the stage's state (resumed, or handed off from its parents).

    The model size, tokenizer and system prompt come from the `actor_from` stage's manifest unless
    the stage config sets them (`inherit_from_parent`; recorded in this stage's manifest)."""
    if not config.actor_from:
        raise ConfigError(f"stage {config.name!r} ({kind}) needs actor_from (a stage name)")
    inherit_from_parent(config, run_dir)
    models = stage_models(config)
    train = config.train
    actor_opt = make_optimizer(train.actor.optimizer) if actor_trains else None
    critic_opt = make_optimizer(train.critic.optimizer) if critic_trains else None
    has_critic = bool(config.critic_from)
    if critic_trains and not has_critic:
        raise ConfigError(f"stage {config.name!r} ({kind}) trains a critic: set critic_from "
                          "(a stage name or 'fresh')")
    actor = ckpt.Side(parent_ref(run_dir, config.actor_from), actor_opt)
    if config.critic_from == ckpt.FRESH:
        fresh = models.fns.critic_params
        init_from = config.get("critic_init", "random")
        if init_from == "actor":
            fresh = critic_from_actor(fresh, run_dir, actor.source, models.fns.actor_params)
        elif init_from != "random":
            raise ConfigError(f"stage {config.name!r}: critic_init={init_from!r}; choose 'random' "
                              "or 'actor'")
        critic = ckpt.Side(ckpt.FRESH, critic_opt, fresh_params=fresh, frozen_hash=critic_frozen)
    elif config.critic_from:
        critic = ckpt.Side(parent_ref(run_dir, config.critic_from), critic_opt,
                           frozen_hash=critic_frozen)
    else:
        critic = ckpt.Side(None)
    init = create_train_state(actor_params=models.fns.actor_params, actor_optimizer=actor_opt,
                              critic_params=models.fns.critic_params if has_critic else None,
                              critic_optimizer=critic_opt, seed=int(config.seed))
    state, store = ckpt.start_stage(
        run_dir, config.name, kind=kind, target=abstract_state(init), actor=actor, critic=critic,
        config=config, seed=int(config.seed),
        store_options=ckpt.StoreOptions(save_every=int(config.checkpoint.save_every),
                                        async_save=bool(config.checkpoint.async_save)))
    steps = build_steps(train, actor_logprobs=models.fns.actor_logprobs,
                        critic_values=models.fns.critic_values if has_critic else None)
    return OpenStage(models, steps, state, store, pathlib.Path(run_dir) / config.name)


def finish_stage(opened: OpenStage, state: TrainState, summary: dict) -> dict:
    """Final save, manifest `finished_step`, and `summary.json` (with `retained_step`)."""
    manifest = opened.store.finish(state)
    summary = {"stage": opened.store.stage, "finished_step": manifest["finished_step"],
               "actor_hash": manifest.get("actor_hash_after"),
               "critic_hash": manifest.get("critic_hash_after"), **summary}
    if summary.get("retained_step") is None:
        summary["retained_step"] = manifest["finished_step"]
    path = opened.stage_dir / "summary.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(summary, indent=1, sort_keys=True, default=str))
    tmp.replace(path)
    opened.store.close()
    return summary

def init_base(stage_config, run_dir, **_) -> dict:
    """Stage kind `init`: freshly initialised actor and critic of the configured size, as a finished
    stage (an untrained Base for CPU runs; the gym's Base is an SFT stage)."""
    defaults = stage_defaults()
    defaults.init = {"critic_bias": 0.0}
    config = resolve_stage_config(stage_config, defaults)
    done = finished_summary(run_dir, config.name)
    if done is not None:
        return done
    inherit_from_parent(config, run_dir)
    models = stage_models(config)
    critic_params = models.fns.critic_params
    bias = float(config.get("init", {}).get("critic_bias", 0.0))
    if bias:   # a prior on the return: V = bias everywhere before any training
        critic_params = {**critic_params,
                         "value_bias": jax.numpy.full_like(critic_params["value_bias"], bias),
                         "value_start": jax.numpy.full_like(critic_params["value_start"], bias)}
    state = create_train_state(actor_params=models.fns.actor_params,
                               critic_params=critic_params, seed=int(config.seed))
    store = ckpt.StageStore(run_dir, config.name, async_save=False)
    store.create(kind="init", config=config)
    opened = OpenStage(models, None, state, store, pathlib.Path(run_dir) / config.name)
    return finish_stage(opened, state, {"kind": "init",
                                        "model": jax.tree.map(str, dict(config.model)),
                                        "tokenizer": config.tokenizer})
