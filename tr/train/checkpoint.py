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

**Handoff** (`start_stage`): a new stage is built from the actor of one stage and the critic of
another (or a fresh critic, or none); each optimizer state is restored from its parent or
re-initialised, as the caller says. The parents and their parameter hashes go in `stage.json`.
A stage opened with `critic_frozen=True` (RSR, actor-only SFT/GRPO) records the critic's hash at
the start and refuses to save or finish if the critic changed (`CriticChangedError`): Δφ|RSR = 0.

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
from typing import Any

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from tr.train.state import MODEL_ITEMS, TrainState

PyTree = Any

FRESH = "fresh"  # `critic_from=FRESH`: the new stage gets freshly initialised critic parameters.
_STAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
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
        if not _STAGE_NAME.match(stage or ""):
            raise ValueError(f"stage name {stage!r} must match {_STAGE_NAME.pattern}")
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
        step = self._resolve_step(step)
        return self._manager.restore(
            step, args=ocp.args.Composite(manifest=ocp.args.JsonRestore())).manifest

    def restore(self, target: TrainState, *, step: int | None = None, data_iter=None) -> TrainState:
        """The state saved at `step` (default: latest), laid out as `target` says.

        `target` is a TrainState of `jax.ShapeDtypeStruct` (see `state.abstract_state`), with the
        shardings to restore onto (any mesh shape). Parts that are None in `target` are not read
        (they come back None). `data_iter`, if given, is moved to the saved position in place.
        """
        step = self._resolve_step(step)
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
        step = self._resolve_step(step)
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

    # -- internals --------------------------------------------------------------------------------

    def _resolve_step(self, step: int | None) -> int:
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


def start_stage(
    run_dir,
    stage: str,
    *,
    kind: str,
    target: TrainState,
    actor_from: StageRef | None,
    critic_from: StageRef | str | None,
    actor_optimizer=None,
    critic_optimizer=None,
    restore_actor_optimizer: bool = False,
    restore_critic_optimizer: bool = False,
    fresh_critic_params: PyTree = None,
    critic_frozen: bool = False,
    config=None,
    seed: int = 0,
    data_iter=None,
    save_every: int = 1,
    max_to_keep: int | None = None,
    async_save: bool = True,
    hash_on_save: bool = True,
) -> tuple[TrainState, StageStore]:
    """Opens stage `stage` of the run: resumes it if it has checkpoints, else builds it by handoff.

    Handoff: the actor parameters come from `actor_from` (a saved step of another stage), the critic
    parameters from `critic_from` (a saved step, `FRESH` to use `fresh_critic_params`, or None for a
    stage without critic). Each optimizer state is restored from the same parent
    (`restore_*_optimizer=True`) or re-initialised with `*_optimizer.init` (None: no optimizer,
    the side is frozen). Restored parameters must match the hash recorded when they were saved.
    `target` gives the shapes, dtypes and shardings of the new stage's state
    (its optimizer-state parts are used only when restoring them). The stage's step 0 is saved at
    once, so a run killed before its first periodic save resumes from the handoff itself.

    Returns the state and the open `StageStore` (close it, or use it as a context manager).
    """
    store = StageStore(run_dir, stage, save_every=save_every, max_to_keep=max_to_keep,
                       async_save=async_save, hash_on_save=hash_on_save)
    try:
        return _resume_or_hand_off(
            store, run_dir, kind=kind, target=target, actor_from=actor_from,
            critic_from=critic_from, actor_optimizer=actor_optimizer,
            critic_optimizer=critic_optimizer, restore_actor_optimizer=restore_actor_optimizer,
            restore_critic_optimizer=restore_critic_optimizer,
            fresh_critic_params=fresh_critic_params, critic_frozen=critic_frozen, config=config,
            seed=seed, data_iter=data_iter), store
    except BaseException:
        store.close()
        raise


def _resume_or_hand_off(store: StageStore, run_dir, *, kind, target, actor_from, critic_from,
                        actor_optimizer, critic_optimizer, restore_actor_optimizer,
                        restore_critic_optimizer, fresh_critic_params, critic_frozen, config,
                        seed, data_iter) -> TrainState:
    """The body of `start_stage` once its store is open."""
    stage = store.stage
    if store.latest_step() is not None:
        if store.manifest is None:
            raise CheckpointError(f"{store.checkpoint_dir} has checkpoints but {store.manifest_path} "
                                  "is missing")
        resume_target = dataclasses.replace(
            target,
            actor_params=None if actor_from is None else target.actor_params,
            critic_params=None if critic_from is None else target.critic_params,
            actor_opt_state=None if actor_optimizer is None else target.actor_opt_state,
            critic_opt_state=None if critic_optimizer is None else target.critic_opt_state,
        )
        return store.restore(resume_target, data_iter=data_iter)

    parents: dict[str, Any] = {"actor": None, "critic": None}
    optimizers: dict[str, str | None] = {"actor": None, "critic": None}

    actor_params = actor_opt_state = None
    if actor_from is not None:
        with StageStore(run_dir, actor_from.stage, read_only=True) as parent:
            step = parent._resolve_step(actor_from.step)  # pylint: disable=protected-access
            actor_params = parent.restore_item("actor_params", target.actor_params, step)
            parents["actor"] = _parent_record(parent, step, "actor_params", actor_params)
            if actor_optimizer is not None and restore_actor_optimizer:
                actor_opt_state = parent.restore_item("actor_opt_state", target.actor_opt_state,
                                                    step)
                optimizers["actor"] = "restored"
    if actor_optimizer is not None and actor_opt_state is None:
        if actor_params is None:
            raise ValueError(f"start_stage({stage!r}): an actor optimizer needs actor_from")
        actor_opt_state = _init_optimizer(actor_optimizer, actor_params, target.actor_opt_state)
        optimizers["actor"] = "reinitialised"

    critic_params = critic_opt_state = None
    if isinstance(critic_from, StageRef):
        with StageStore(run_dir, critic_from.stage, read_only=True) as parent:
            step = parent._resolve_step(critic_from.step)  # pylint: disable=protected-access
            critic_params = parent.restore_item("critic_params", target.critic_params, step)
            parents["critic"] = _parent_record(parent, step, "critic_params", critic_params)
            if critic_optimizer is not None and restore_critic_optimizer:
                critic_opt_state = parent.restore_item("critic_opt_state", target.critic_opt_state,
                                                    step)
                optimizers["critic"] = "restored"
    elif critic_from == FRESH:
        if fresh_critic_params is None:
            raise ValueError(f"start_stage({stage!r}): critic_from=FRESH needs fresh_critic_params")
        critic_params = fresh_critic_params
        parents["critic"] = {"fresh": True, "hash": tree_hash(critic_params)}
        if restore_critic_optimizer:
            raise ValueError(f"start_stage({stage!r}): a fresh critic has no optimizer to restore")
    elif critic_from is not None:
        raise ValueError(f"start_stage({stage!r}): critic_from must be a StageRef, FRESH or None, "
                         f"got {critic_from!r}")
    if critic_optimizer is not None and critic_opt_state is None:
        if critic_params is None:
            raise ValueError(f"start_stage({stage!r}): a critic optimizer needs a critic")
        critic_opt_state = _init_optimizer(critic_optimizer, critic_params, target.critic_opt_state)
        optimizers["critic"] = "reinitialised"

    state = TrainState(
        step=jax.numpy.zeros((), jax.numpy.int32),
        actor_params=actor_params, actor_opt_state=actor_opt_state,
        critic_params=critic_params, critic_opt_state=critic_opt_state,
        rng=jax.random.key_data(jax.random.key(seed)),
    )
    store.create(kind=kind, config=config, parents=parents, optimizers=optimizers,
                 critic_frozen=critic_frozen,
                 critic_hash_before=tree_hash(critic_params) if critic_frozen else None)
    store.save(state, data_iter, force=True)
    return state


def _init_optimizer(optimizer, params: PyTree, target: PyTree) -> PyTree:
    """`optimizer.init(params)`, laid out with the shardings of `target` when it has them."""
    shardings = None
    if target is not None:
        shardings = jax.tree.map(lambda x: getattr(x, "sharding", None), target)
        if any(s is None for s in jax.tree.leaves(shardings, is_leaf=lambda x: x is None)):
            shardings = None
    return jax.jit(optimizer.init, out_shardings=shardings)(params)
