"""The stage store: Orbax checkpoints of actor and critic, per stage, with handoff between stages.

A run directory holds one folder per stage (`base`, `rsr-1`, `warmup`, `rpr-1`, ...):

    <run_dir>/<stage>/stage.json                   manifest: kind, config, parents, hashes
    <run_dir>/<stage>/checkpoints/<step>/          one Orbax checkpoint per saved step:
        actor_params/ actor_opt_state/ critic_params/ critic_opt_state/   (StandardSave, sharded)
        train/        {step, rng}                                          (StandardSave)
        data_iter/    the grain iterator's state                           (grain CheckpointSave)
        manifest/     {stage, step, items, hashes}                         (JsonSave)

Orbax writes each step into `<step>.orbax-checkpoint-tmp` and renames it when complete, so a process
killed at any moment (SIGKILL included, also in the middle of a save) leaves either a complete step
or a temporary folder that the next writable `StageStore` of the stage deletes; `latest_step()` only sees complete steps.

**Handoff** (`start_stage`): a new stage is built from one `Side` spec per side: the actor of one
stage and the critic of another (or a fresh critic, or none); each optimizer state is restored
from its parent or re-initialised (`hand_off`, one function for both sides). The parents and their
parameter hashes go in `stage.json`. A critic opened with `Side(frozen_hash=True)` (RSR,
actor-only SFT/GRPO) has its hash recorded at the start; the store refuses to save or finish if
the critic changed (`CriticChangedError`): Δφ|RSR = 0.

Parameter hash: sha256 over the leaves in the order of their sorted key paths, each contributing its
key path, dtype, shape and C-order bytes, so the hash depends on values and names only, not on how
the arrays are sharded or which process wrote them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import re
import shutil
from typing import Any, NamedTuple

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from tr.train.state import MODEL_ITEMS, TrainState

PyTree = Any

FRESH = "fresh"  # `Side(source=FRESH)`: the new stage gets freshly initialised critic parameters.
# a stage name (also its folder): a letter or digit, then letters, digits, ".", "_", "-"
STAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_FORMAT = 1
_INCOMPLETE = ".orbax-checkpoint-tmp"  # Orbax's suffix for a step folder not yet renamed in place


class CheckpointError(RuntimeError):
    """A checkpoint or stage manifest is missing, incomplete or inconsistent with the request."""


class CriticChangedError(CheckpointError):
    """A stage that must not touch the critic (RSR: Δφ = 0) ended with different critic params."""


@dataclasses.dataclass(frozen=True)
class StageRef:
    """A saved step of a stage: `step=None` means the stage's latest complete checkpoint."""

    stage: str
    step: int | None = None


def tree_hash(tree: PyTree) -> str | None:
    """sha256 hex digest of a pytree's leaves (see module docstring); None for an empty tree."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    if not leaves:
        return None
    digest = hashlib.sha256()
    for path, leaf in sorted(leaves, key=lambda item: jax.tree_util.keystr(item[0])):
        array = _to_host(leaf)
        digest.update(jax.tree_util.keystr(path).encode())
        digest.update(f"|{array.dtype.str}|{array.shape}|".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def _to_host(leaf) -> np.ndarray:
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        leaf = multihost_utils.process_allgather(leaf, tiled=True)
    array = np.asarray(jax.device_get(leaf))
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return array


def _json_config(config) -> Any:
    """An ml_collections ConfigDict / dict / None as plain JSON data."""
    if config is None:
        return None
    if hasattr(config, "to_json_best_effort"):
        return json.loads(config.to_json_best_effort(sort_keys=True))
    return json.loads(json.dumps(config, sort_keys=True, default=str))


def _write_json_atomically(path: pathlib.Path, data: dict) -> None:
    if jax.process_index() != 0:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)


class StageStore:
    """Checkpoints of one stage of a run (`<run_dir>/<stage>/`), on an Orbax CheckpointManager.

    save_every:  `save(state)` writes when `state.step % save_every == 0` (or when forced).
    max_to_keep: keep only the newest complete checkpoints (None: keep all).
    async_save:  write arrays in a background thread; `wait()`/`close()` block until done.
    read_only:   only read (a parent stage in a handoff): never deletes or writes anything.
    hash_on_save: record the parameter hashes in every step's manifest (a full read of the
                 parameters to the host; turn off for very large models, the handoff and
                 `finish` still hash).

    A writable store deletes the leftovers of saves that never completed when it opens (one
    process per stage writes; a reader must open with `read_only=True`).
    """

    def __init__(self, run_dir, stage: str, *, save_every: int = 1, max_to_keep: int | None = None,
                 async_save: bool = True, read_only: bool = False, hash_on_save: bool = True):
        if not STAGE_NAME.match(stage or ""):
            raise ValueError(f"stage name {stage!r} must match {STAGE_NAME.pattern}")
        if save_every < 1:
            raise ValueError(f"StageStore({stage!r}): save_every must be >= 1, got {save_every}")
        self.run_dir = pathlib.Path(run_dir)
        self.stage = stage
        self.stage_dir = self.run_dir / stage
        self.checkpoint_dir = self.stage_dir / "checkpoints"
        self.manifest_path = self.stage_dir / "stage.json"
        self.save_every = save_every
        self.read_only = read_only
        self.hash_on_save = hash_on_save
        if read_only and not self.checkpoint_dir.is_dir():
            raise CheckpointError(f"stage {stage!r} has no checkpoints ({self.checkpoint_dir} "
                                  "does not exist)")
        if not read_only:
            self._remove_incomplete_saves()
        self._manager = ocp.CheckpointManager(
            self.checkpoint_dir.absolute(),
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep,
                create=not read_only,
                read_only=read_only,
                enable_async_checkpointing=async_save,
            ),
        )

    def _remove_incomplete_saves(self) -> None:
        """Deletes step folders a killed process left half-written (before Orbax lists steps)."""
        if jax.process_index() != 0 or not self.checkpoint_dir.is_dir():
            return
        for path in self.checkpoint_dir.iterdir():
            if _INCOMPLETE in path.name and path.is_dir():
                shutil.rmtree(path)

    # -- manifest ---------------------------------------------------------------------------------

    @property
    def manifest(self) -> dict | None:
        """The stage manifest (`stage.json`), or None before `create`."""
        if not self.manifest_path.exists():
            return None
        try:
            return json.loads(self.manifest_path.read_text())
        except json.JSONDecodeError as error:
            raise CheckpointError(f"{self.manifest_path}: not valid JSON ({error})") from None

    def create(self, *, kind: str, config=None, parents: dict | None = None,
               critic_frozen: bool = False, critic_hash_before: str | None = None,
               optimizers: dict | None = None) -> dict:
        """Writes `stage.json`; idempotent when it exists with the same kind, config and parents."""
        manifest = {
            "format": _FORMAT,
            "stage": self.stage,
            "kind": kind,
            "config": _json_config(config),
            "parents": parents or {},
            "optimizers": optimizers or {},
            "critic_frozen": bool(critic_frozen),
            "critic_hash_before": critic_hash_before,
            "critic_hash_after": None,
            "finished_step": None,
        }
        existing = self.manifest
        if jax.process_count() > 1:  # every host has read the same state before process 0 writes
            multihost_utils.sync_global_devices(f"tr.train.checkpoint.create-read:{self.stage}")
        if existing is not None:
            for field in ("kind", "config", "parents", "optimizers", "critic_frozen",
                          "critic_hash_before"):
                if existing.get(field) != manifest[field]:
                    raise CheckpointError(
                        f"{self.manifest_path}: stage {self.stage!r} already exists with "
                        f"{field}={existing.get(field)!r}, not {manifest[field]!r}; use a new stage "
                        "name or delete the folder")
            return existing
        if self.read_only:
            raise CheckpointError(f"stage {self.stage!r} was opened read-only; cannot create it")
        self.stage_dir.mkdir(parents=True, exist_ok=True)
        _write_json_atomically(self.manifest_path, manifest)
        if jax.process_count() > 1:   # every host reads stage.json (e.g. the critic guard)
            multihost_utils.sync_global_devices(f"tr.train.checkpoint.create:{self.stage}")
        return manifest

    # -- checkpoints ------------------------------------------------------------------------------

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def save(self, state: TrainState, data_iter=None, *, force: bool = False) -> bool:
        """Saves `state` (and the grain iterator's position) if its step is due; True if it did."""
        if self.read_only:
            raise CheckpointError(f"stage {self.stage!r} was opened read-only; cannot save")
        step = int(jax.device_get(state.step))
        if not force and step % self.save_every:
            return False
        if step in self._manager.all_steps():
            return False
        self._check_critic_unchanged(state, "save")
        items = {name: ocp.args.StandardSave(getattr(state, name))
                 for name in MODEL_ITEMS if getattr(state, name) is not None}
        items["train"] = ocp.args.StandardSave({"step": state.step, "rng": state.rng})
        if data_iter is not None:
            items["data_iter"] = grain.checkpoint.CheckpointSave(data_iter)
        manifest = {
            "stage": self.stage,
            "step": step,
            "items": sorted(items),
            "hashes": {name: tree_hash(getattr(state, name)) if self.hash_on_save else None
                       for name in ("actor_params", "critic_params")},
        }
        items["manifest"] = ocp.args.JsonSave(manifest)
        self._manager.save(step, args=ocp.args.Composite(**items), force=True)
        return True

    def step_manifest(self, step: int | None = None) -> dict:
        """The JSON manifest saved with `step` (default: the latest)."""
        step = self.resolve_step(step)
        return self._manager.restore(
            step, args=ocp.args.Composite(manifest=ocp.args.JsonRestore())).manifest

    def restore(self, target: TrainState, *, step: int | None = None, data_iter=None) -> TrainState:
        """The state saved at `step` (default: latest), laid out as `target` says.

        `target` is a TrainState of `jax.ShapeDtypeStruct` (see `state.abstract_state`), with the
        shardings to restore onto (any mesh shape). Parts that are None in `target` are not read
        (they come back None). `data_iter`, if given, is moved to the saved position in place.
        """
        step = self.resolve_step(step)
        saved = set(self.step_manifest(step)["items"])
        wanted = {name: getattr(target, name) for name in MODEL_ITEMS
                  if getattr(target, name) is not None}
        missing = sorted(set(wanted) - saved)
        if missing:
            raise CheckpointError(
                f"{self.checkpoint_dir / str(step)}: the target asks for {missing} but the checkpoint "
                f"holds only {sorted(saved)}")
        args = {name: ocp.args.StandardRestore(tree) for name, tree in wanted.items()}
        args["train"] = ocp.args.StandardRestore({"step": target.step, "rng": target.rng})
        if data_iter is not None:
            if "data_iter" not in saved:
                raise CheckpointError(f"{self.checkpoint_dir / str(step)} holds no data iterator "
                                      "state, but a data_iter was passed to restore")
            args["data_iter"] = grain.checkpoint.CheckpointRestore(data_iter)
        restored = self._manager.restore(step, args=ocp.args.Composite(**args))
        parts = {name: restored[name] if name in wanted else None for name in MODEL_ITEMS}
        return TrainState(step=restored["train"]["step"], rng=restored["train"]["rng"], **parts)

    def restore_item(self, name: str, target: PyTree, step: int | None = None) -> PyTree:
        """One part (e.g. `critic_params`) of the checkpoint at `step`, laid out as `target`."""
        if name not in MODEL_ITEMS:
            raise ValueError(f"restore_item: {name!r} is not one of {MODEL_ITEMS}")
        step = self.resolve_step(step)
        if name not in self.step_manifest(step)["items"]:
            raise CheckpointError(f"{self.checkpoint_dir / str(step)} holds no {name!r}")
        restored = self._manager.restore(
            step, args=ocp.args.Composite(**{name: ocp.args.StandardRestore(target)}))
        return restored[name]

    def finish(self, state: TrainState) -> dict:
        """Saves the final state, checks a frozen critic is unchanged, records the final hashes."""
        self._check_critic_unchanged(state, "finish")
        self.save(state, force=True)
        self.wait()
        manifest = self.manifest
        if manifest is None:
            raise CheckpointError(f"{self.manifest_path} is missing: call create() before finish()")
        manifest["critic_hash_after"] = tree_hash(state.critic_params)
        manifest["actor_hash_after"] = tree_hash(state.actor_params)
        manifest["finished_step"] = int(jax.device_get(state.step))
        _write_json_atomically(self.manifest_path, manifest)
        return manifest

    def wait(self) -> None:
        """Blocks until a pending asynchronous save is complete on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> "StageStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def resolve_step(self, step: int | None) -> int:
        """The complete checkpoint step `step` names (None: the latest); CheckpointError when the
        stage has none or not that one."""
        steps = self._manager.all_steps()
        if step is None:
            if not steps:
                raise CheckpointError(f"{self.checkpoint_dir}: stage {self.stage!r} has no complete "
                                      "checkpoint")
            return max(steps)
        if step not in steps:
            raise CheckpointError(f"{self.checkpoint_dir}: no complete checkpoint for step {step} "
                                  f"(complete steps: {sorted(steps)})")
        return step

    def _check_critic_unchanged(self, state: TrainState, when: str) -> None:
        manifest = self.manifest
        if not manifest or not manifest.get("critic_frozen"):
            return
        before, now = manifest.get("critic_hash_before"), tree_hash(state.critic_params)
        if now != before:
            raise CriticChangedError(
                f"stage {self.stage!r} ({manifest.get('kind')}) must leave the critic unchanged, "
                f"but at {when} (step {int(jax.device_get(state.step))}) its hash is {now} instead "
                f"of {before} ({self.manifest_path})")


def _parent_record(store: StageStore, step: int, name: str, params: PyTree) -> dict:
    """`{stage, step, hash}` of restored `params`; raises if they differ from the saved hash."""
    digest = tree_hash(params)
    saved = store.step_manifest(step)["hashes"].get(name)
    if saved is not None and saved != digest:
        raise CheckpointError(
            f"{store.checkpoint_dir / str(step)}: restored {name} hash {digest} differs from the "
            f"hash {saved} recorded when it was saved (corrupted or mismatched checkpoint)")
    return {"stage": store.stage, "step": step, "hash": digest}


@dataclasses.dataclass(frozen=True)
class Side:
    """Where one side (actor or critic) of a new stage comes from, and whether it trains.

    source:            a `StageRef` (a saved step of another stage), `FRESH` (use `fresh_params`)
                       or None (the stage has no such side).
    optimizer:         the side's optax optimizer, or None: the side is frozen (no optimizer state).
    restore_optimizer: take the optimizer state from the same parent step instead of `init`.
    fresh_params:      the parameters when `source` is `FRESH`.
    frozen_hash:       record the side's hash at the start and refuse to save or finish if it
                       changed (`CriticChangedError`; the critic of RSR: Δφ = 0). Critic only.
    """

    source: StageRef | str | None = None
    optimizer: Any = None
    restore_optimizer: bool = False
    fresh_params: PyTree = None
    frozen_hash: bool = False


@dataclasses.dataclass(frozen=True)
class StoreOptions:
    """How the new stage's `StageStore` saves (see `StageStore`)."""

    save_every: int = 1
    max_to_keep: int | None = None
    async_save: bool = True
    hash_on_save: bool = True


def start_stage(run_dir, stage: str, *, kind: str, target: TrainState, actor: Side = Side(),
                critic: Side = Side(), config=None, seed: int = 0, data_iter=None,
                store_options: StoreOptions = StoreOptions()) -> tuple[TrainState, StageStore]:
    """Opens stage `stage` of the run: resumes it if it has checkpoints, else builds it by handoff.

    Handoff (`hand_off`, the same for both sides): each side's parameters come from its `Side`
    source; its optimizer state is restored from the same parent or re-initialised; restored
    parameters must match the hash recorded when they were saved. `target` gives the shapes,
    dtypes and shardings of the new stage's state. The stage's step 0 is saved at once, so a run
    killed before its first periodic save resumes from the handoff itself.

    Returns the state and the open `StageStore` (close it, or use it as a context manager).
    """
    if actor.frozen_hash:
        raise ValueError(f"start_stage({stage!r}): frozen_hash is checked for the critic only")
    store = StageStore(run_dir, stage, save_every=store_options.save_every,
                       max_to_keep=store_options.max_to_keep, async_save=store_options.async_save,
                       hash_on_save=store_options.hash_on_save)
    try:
        if store.latest_step() is not None:
            return _resume(store, target, actor, critic, data_iter), store
        actor_part = hand_off(run_dir, stage, "actor", actor, target)
        critic_part = hand_off(run_dir, stage, "critic", critic, target)
        state = TrainState(
            step=jax.numpy.zeros((), jax.numpy.int32),
            actor_params=actor_part.params, actor_opt_state=actor_part.opt_state,
            critic_params=critic_part.params, critic_opt_state=critic_part.opt_state,
            rng=jax.random.key_data(jax.random.key(seed)))
        store.create(kind=kind, config=config,
                     parents={"actor": actor_part.parent, "critic": critic_part.parent},
                     optimizers={"actor": actor_part.optimizer, "critic": critic_part.optimizer},
                     critic_frozen=critic.frozen_hash,
                     critic_hash_before=tree_hash(critic_part.params) if critic.frozen_hash else None)
        store.save(state, data_iter, force=True)
        return state, store
    except BaseException:
        store.close()
        raise


def _resume(store: StageStore, target: TrainState, actor: Side, critic: Side, data_iter):
    if store.manifest is None:
        raise CheckpointError(f"{store.checkpoint_dir} has checkpoints but {store.manifest_path} "
                              "is missing")
    resume_target = dataclasses.replace(
        target,
        actor_params=None if actor.source is None else target.actor_params,
        critic_params=None if critic.source is None else target.critic_params,
        actor_opt_state=None if actor.optimizer is None else target.actor_opt_state,
        critic_opt_state=None if critic.optimizer is None else target.critic_opt_state,
    )
    return store.restore(resume_target, data_iter=data_iter)


class SidePart(NamedTuple):
    """One side of a handed-off state and what the manifest records about it."""

    params: PyTree
    opt_state: PyTree
    parent: dict | None      # {stage, step, hash} | {fresh, hash} | None
    optimizer: str | None    # "restored" | "reinitialised" | None (frozen)


def hand_off(run_dir, stage: str, name: str, side: Side, target: TrainState) -> SidePart:
    """The `name` side (`actor` | `critic`) of a new stage, from `side` (see `Side`)."""
    target_params = getattr(target, f"{name}_params")
    target_opt = getattr(target, f"{name}_opt_state")
    params = opt_state = parent = optimizer = None
    if isinstance(side.source, StageRef):
        with StageStore(run_dir, side.source.stage, read_only=True) as store:
            step = store.resolve_step(side.source.step)
            params = store.restore_item(f"{name}_params", target_params, step)
            parent = _parent_record(store, step, f"{name}_params", params)
            if side.optimizer is not None and side.restore_optimizer:
                opt_state = store.restore_item(f"{name}_opt_state", target_opt, step)
                optimizer = "restored"
    elif side.source == FRESH:
        if side.fresh_params is None:
            raise ValueError(f"start_stage({stage!r}): {name} source FRESH needs fresh_params")
        if side.restore_optimizer:
            raise ValueError(f"start_stage({stage!r}): a fresh {name} has no optimizer to restore")
        params = side.fresh_params
        parent = {"fresh": True, "hash": tree_hash(params)}
    elif side.source is not None:
        raise ValueError(f"start_stage({stage!r}): the {name}'s source must be a StageRef, FRESH "
                         f"or None, got {side.source!r}")
    if side.optimizer is not None and opt_state is None:
        if params is None:
            raise ValueError(f"start_stage({stage!r}): a {name} optimizer needs a {name} source")
        opt_state = _init_optimizer(side.optimizer, params, target_opt)
        optimizer = "reinitialised"
    return SidePart(params, opt_state, parent, optimizer)


def _init_optimizer(optimizer, params: PyTree, target: PyTree) -> PyTree:
    """`optimizer.init(params)`, laid out with the shardings of `target` when it has them."""
    shardings = None
    if target is not None:
        shardings = jax.tree.map(lambda x: getattr(x, "sharding", None), target)
        if any(s is None for s in jax.tree.leaves(shardings, is_leaf=lambda x: x is None)):
            shardings = None
    return jax.jit(optimizer.init, out_shardings=shardings)(params)
