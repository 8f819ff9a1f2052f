"""The rollout engine: many episodes at once over many sandboxes, one batched policy.

Each episode runs in its own thread (sandbox commands proceed concurrently); every generation goes
through one :class:`~tr.agent.policies.RequestBatcher`, so requests from all active episodes reach
the sampler as batches.  Groups of ``G`` rollouts per task (GRPO), over-sampling (launch ``N'``,
keep the first ``N`` to finish that count, cancel the rest and close their sandboxes), and
recovery rollouts (restore ``s_f``, prepend ``h_f`` and the recovery prompt ``r``).  An
episode-aware policy (``end_episode(episode_id)``, the model over an ``EpisodeSampler``) is told when
each episode ends or is cancelled, so its KV cache is freed.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, TextIO

from tr.agent.harness import RECOVERY_PROMPT, SYSTEM_PROMPT, Budgets, EpisodeSpec, run_episode
from tr.agent.policies import Policy, RequestBatcher
from tr.agent.policies import ScriptedPolicy, load_model_policy
from tr.agent.records import EpisodeRecord, EpisodeStatus
from tr.agent.records import write_shard
from tr.agent.transcript import ChatLayout
from tr.envs.backends import discard_snapshot, get_backend
from tr.envs.endpoints import EndpointPool
from tr.envs.sandbox import SandboxConfig, snapshot_fields
from tr.envs.tasks import load_suite
from tr.envs.tasks.runner import prepare, sandbox_config, verify
from tr.models.config import get_model_config
from tr.models.tokenizer import ByteTokenizer


# ----------------------------------------------------------------------------------------------
# The environment side: sandboxes + tasks.

class TaskEnv:
    """:class:`~tr.agent.harness.EpisodeEnv` over ``tr.envs``: a fresh sandbox with the task laid
    down, or (recovery) a sandbox restored from the parent's pre-verifier snapshot.

    ``docker_endpoints`` (docker only): spread sandboxes over these engines (URLs or docker
    context names, :class:`tr.envs.endpoints.EndpointPool`): each new sandbox goes to the healthy
    one with the fewest live sandboxes; one that stops answering is skipped until it answers
    again (``endpoint_cooldown_s``).  Its running episodes fail in their sandbox calls -- infra
    failures, as the harness classes them.  ``placements`` maps episode ids to endpoint names."""

    def __init__(self, backend: Any = "local", sandbox_config: Any = None,
                 docker_endpoints: Sequence[str] = (), *, endpoint_cooldown_s: float = 30.0):

        self.backend = get_backend(backend)     # a name or a tr.envs.backends.Backend
        self.sandbox_config = sandbox_config if sandbox_config is not None else SandboxConfig()
        self._lock = threading.Lock()
        self.open_sandboxes: set[int] = set()
        self.pool = None
        self.placements: dict[str, str] = {}
        self._endpoint_of: dict[int, Any] = {}
        if docker_endpoints:
            if not self.backend.endpoints:
                raise ValueError(f"docker_endpoints={list(docker_endpoints)!r} needs a backend "
                                 f"with engine endpoints ('docker'), not {self.backend.name!r}")
            self.pool = EndpointPool(docker_endpoints, cooldown_s=endpoint_cooldown_s)

    def _sandbox(self, config, image: str | None = None):
        """A started sandbox of ``config``; with a pool, on the least loaded healthy endpoint
        (``image`` made present there first); an endpoint that fails to start one and no longer
        answers is marked down and the next one is tried."""
        if self.pool is None:
            sandbox = self.backend.make(config)
            with self._lock:
                self.open_sandboxes.add(id(sandbox))
            try:
                return sandbox.start()
            except BaseException:
                self.close(sandbox)
                raise
        tried: list = []
        while True:
            endpoint = self.pool.acquire(exclude=tried)
            sandbox = self.backend.make(dataclasses.replace(
                config, docker_endpoint=endpoint.name))
            with self._lock:
                self.open_sandboxes.add(id(sandbox))
                self._endpoint_of[id(sandbox)] = endpoint
            try:
                self.pool.ensure_image(endpoint, config.image)   # None: the base image
                if image:
                    self.pool.ensure_image(endpoint, image)
                return sandbox.start()
            except BaseException as e:
                self.close(sandbox)
                if not isinstance(e, Exception) or self.pool.check(endpoint):
                    raise                           # it answers: the failure is not the engine's
                tried.append(endpoint)
                if len(tried) == len(self.pool.endpoints):
                    raise

    def endpoint_of(self, sandbox) -> str | None:
        """The endpoint name an open sandbox is on (None: the default engine)."""
        ep = self._endpoint_of.get(id(sandbox))
        return None if ep is None else ep.name

    def open(self, spec: EpisodeSpec):
        config = sandbox_config(spec.task, self.backend, self.sandbox_config)
        snapshot = None
        if spec.parent is not None:
            if spec.parent.snapshot_ref is None:
                raise ValueError(f"recovery from episode {spec.parent.episode_id}: its record has "
                                 "no snapshot (run it with snapshot_before_verify=True)")
            snapshot = snapshot_from_ref(spec.parent.snapshot_ref)
        sandbox = self._sandbox(config, image=snapshot.image if snapshot is not None else None)
        if self.pool is not None:
            with self._lock:
                self.placements[spec.episode_id] = self.endpoint_of(sandbox)
        try:
            if snapshot is None:
                prepare(spec.task, sandbox, self.backend)
            else:
                sandbox.restore(snapshot)
        except BaseException:
            self.close(sandbox)
            raise
        return sandbox

    def snapshot(self, spec: EpisodeSpec, sandbox) -> dict:
        return snapshot_to_ref(sandbox.snapshot(persist=True))

    def verify(self, spec: EpisodeSpec, sandbox):
        return verify(spec.task, sandbox)

    def verifier_fault(self, spec: EpisodeSpec, sandbox) -> tuple[str, str]:
        """After a verifier error: "harness" if the sandbox died or the verifier also fails on a
        fresh sandbox with the task laid down and nothing done (the canary), else "agent"."""

        if not sandbox.alive():
            where = self.endpoint_of(sandbox)
            return "harness", "the sandbox died" + (f" (docker endpoint {where})" if where else "")
        config = sandbox_config(spec.task, self.backend, self.sandbox_config)
        canary = self._sandbox(config)
        try:
            prepare(spec.task, canary, self.backend)
            result = verify(spec.task, canary)
        finally:
            self.close(canary)
        if result.error is not None:
            return "harness", (f"the untouched environment fails to verify too: {result.error}: "
                               f"{result.error_detail}")
        return "agent", "the untouched environment verifies cleanly"

    def close(self, sandbox) -> None:
        try:
            sandbox.close()
        finally:
            with self._lock:
                self.open_sandboxes.discard(id(sandbox))
                endpoint = self._endpoint_of.pop(id(sandbox), None)
            if endpoint is not None:
                self.pool.release(endpoint, getattr(sandbox, "unreleased", ()))

    def shutdown(self) -> None:
        """Last clean-up of what endpoints that went away kept (see EndpointPool.close)."""
        if self.pool is not None:
            self.pool.close()


def snapshot_to_ref(snapshot) -> dict:
    """A JSON reference to a sandbox snapshot (its plain fields)."""
    return dataclasses.asdict(snapshot)


def snapshot_from_ref(ref: dict):
    """Inverse of :func:`snapshot_to_ref`."""

    return snapshot_fields(ref)


def discard_snapshot_ref(ref: dict | None) -> None:
    """Deletes the snapshot a record points to (a cancelled or unwanted episode's)."""
    if ref:

        discard_snapshot(snapshot_from_ref(ref))


def _discard_unreturned(futures: Sequence[Future], discarded: Sequence[EpisodeRecord]) -> None:
    """Discard the snapshots of every finished episode among `futures` but those in `discarded`:
    `run_rollouts` is leaving by an exception, so no caller will ever release them."""
    done_ids = {id(rec) for rec in discarded}
    for f in futures:
        if f.done() and not f.cancelled() and f.exception() is None:
            rec = f.result()
            if rec is not None and id(rec) not in done_ids:
                try:
                    discard_snapshot_ref(rec.snapshot_ref)
                except Exception:  # noqa: BLE001 - the exception leaving run_rollouts matters more
                    pass


# ----------------------------------------------------------------------------------------------
# Specs.

def group_specs(tasks: Sequence, group_size: int, *, seed: int = 0, prefix: str = "ep") -> list[EpisodeSpec]:
    """``group_size`` rollouts of every task; rollouts of one task share ``group_id`` (GRPO)."""
    if group_size < 1:
        raise ValueError(f"group_size={group_size} must be >= 1")
    specs = []
    for t in tasks:
        for g in range(group_size):
            specs.append(EpisodeSpec(task=t, episode_id=f"{prefix}-{t.id}-{seed}-{g}",
                                     group_id=f"{prefix}-{t.id}-{seed}", rollout_index=g,
                                     seed=seed * 100_003 + g))
    return specs


def recovery_specs(task, parent: EpisodeRecord, group_size: int, *, seed: int = 0,
                   recovery_prompt: str = RECOVERY_PROMPT,
                   history_turns: int = 0) -> list[EpisodeSpec]:
    """A group of recovery rollouts from one failed attempt ``(x, h_f, s_f)``; ``history_turns``
    N > 0: each sees the task prompt and only the last N turns of h_f (0: all of its window)."""
    if parent.snapshot_ref is None:
        raise ValueError(f"episode {parent.episode_id}: no pre-verifier snapshot to recover from")
    return [EpisodeSpec(task=task, episode_id=f"rec-{parent.episode_id}-{seed}-{g}",
                        group_id=f"rec-{parent.episode_id}-{seed}", rollout_index=g,
                        seed=seed * 100_003 + g, parent=parent, recovery_prompt=recovery_prompt,
                        history_turns=history_turns)
            for g in range(group_size)]


# ----------------------------------------------------------------------------------------------
# Progress display.

class Progress:
    """One status line on stderr, rewritten in place: episodes done, pass rate, steps/s."""

    def __init__(self, total: int, *, label: str = "rollout", stream: TextIO | None = None,
                 enabled: bool | None = None, min_interval_s: float = 0.5):
        self.total, self.label = total, label
        self.stream = stream if stream is not None else sys.stderr
        is_tty = getattr(self.stream, "isatty", lambda: False)()
        self.enabled = enabled if enabled is not None else is_tty
        # On a terminal the line is rewritten in place; in a log file, a new line every 10 s.
        self.min_interval_s = min_interval_s if is_tty else max(min_interval_s, 10.0)
        self._start, self._end = ("\r", "") if is_tty else ("", "\n")
        self.t0 = time.monotonic()
        self.done = self.passed = self.counted = self.infra = self.steps = 0
        self._last = 0.0
        self._lock = threading.Lock()

    def update(self, rec: EpisodeRecord) -> None:
        with self._lock:
            self.done += 1
            self.steps += rec.num_turns
            if rec.status.counts:
                self.counted += 1
                self.passed += int(bool(rec.passed))
            elif rec.status is EpisodeStatus.INFRA_FAILURE:
                self.infra += 1
            now = time.monotonic()
            if self.enabled and (now - self._last >= self.min_interval_s or self.done == self.total):
                self._last = now
                end = "\n" if self.done == self.total else self._end
                self.stream.write(self._start + self.line() + end)
                self.stream.flush()

    def line(self) -> str:
        dt = max(time.monotonic() - self.t0, 1e-9)
        rate = 100.0 * self.passed / self.counted if self.counted else 0.0
        return (f"[{self.label}] {self.done}/{self.total} episodes · pass {rate:5.1f}% · "
                f"{self.steps / dt:6.2f} steps/s · {self.done / dt:5.2f} ep/s · infra {self.infra} · "
                f"{dt:6.1f}s")

    def finish(self) -> None:
        if self.enabled and self.done != self.total:
            self.stream.write(self._start + self.line() + "\n")
            self.stream.flush()


# ----------------------------------------------------------------------------------------------
# The engine.

@dataclasses.dataclass
class RolloutConfig:
    backend: str = "local"
    concurrency: int = 8
    budgets: Budgets = Budgets()
    snapshot_before_verify: bool = False
    sandbox_config: Any = None
    max_batch: int = 64
    batch_window_s: float = 0.02
    progress: bool | None = None  # None: only when stderr is a terminal
    # docker only: engines to spread sandboxes over (URLs or docker context names; see
    # tr.envs.endpoints).  Empty: every sandbox on the default engine ($DOCKER_HOST / the socket).
    docker_endpoints: tuple[str, ...] = ()
    endpoint_cooldown_s: float = 30.0  # seconds before an endpoint that stopped answering is asked again
    system_prompt: str = SYSTEM_PROMPT  # the episode's system message (the action format)


@dataclasses.dataclass
class RolloutResult:
    """``records``: the kept episodes in finishing order; ``cancelled``: launched but dropped."""

    records: list[EpisodeRecord]
    cancelled: list[EpisodeRecord]
    not_started: int
    wall_s: float
    generation_calls: int
    generation_s: float
    batch_sizes: list[int]


def run_rollouts(
    specs: Sequence[EpisodeSpec],
    policy: Policy,
    layout: ChatLayout,
    config: RolloutConfig = RolloutConfig(),
    *,
    keep_first: int | None = None,
    env: Any = None,
    on_record: Callable[[EpisodeRecord], None] | None = None,
) -> RolloutResult:
    """Runs ``specs`` with up to ``config.concurrency`` episodes at once.

    With ``keep_first = N`` (over-sampling), the engine stops as soon as ``N`` episodes that count
    (not infra failures) have finished: waiting generations fail with ``Cancelled``, running
    episodes stop at their next turn and close their sandboxes, queued ones never start.
    Returns when every started episode has closed its sandbox.
    """
    if config.concurrency < 1:
        raise ValueError(f"concurrency={config.concurrency} must be >= 1")
    if keep_first is not None and not 1 <= keep_first <= len(specs):
        raise ValueError(f"keep_first={keep_first} must be in [1, {len(specs)}]")
    own_env = env is None
    if own_env:
        env = TaskEnv(config.backend, config.sandbox_config, config.docker_endpoints,
                      endpoint_cooldown_s=config.endpoint_cooldown_s)
    batcher = RequestBatcher(policy, max_batch=config.max_batch, window_s=config.batch_window_s)
    cancel = threading.Event()
    progress = Progress(len(specs) if keep_first is None else keep_first, enabled=config.progress)
    t0 = time.monotonic()

    def one(spec: EpisodeSpec) -> EpisodeRecord | None:
        if cancel.is_set():
            return None
        batcher.register()
        try:
            return run_episode(spec, batcher.generate, env, layout, config.budgets,
                               snapshot_before_verify=config.snapshot_before_verify,
                               cancel=cancel, policy_name=policy.name,
                               system_prompt=config.system_prompt)
        finally:
            batcher.unregister()
            end_episode = getattr(policy, "end_episode", None)
            if end_episode is not None:  # ended or cancelled: an episode-aware sampler frees its cache
                end_episode(spec.episode_id)

    kept: list[EpisodeRecord] = []
    cancelled: list[EpisodeRecord] = []
    not_started = 0
    counted = 0
    pool = ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="episode")
    submitted: list[Future] = []
    returned = False
    try:
        submitted = [pool.submit(one, s) for s in specs]
        futures: set[Future] = set(submitted)
        while futures:
            done, futures = wait(futures, return_when=FIRST_COMPLETED)
            for f in done:
                rec = f.result()
                if rec is None:
                    not_started += 1
                    continue
                if rec.status is EpisodeStatus.CANCELLED or (cancel.is_set() and rec.status.counts):
                    discard_snapshot_ref(rec.snapshot_ref)
                    cancelled.append(rec)
                    continue
                kept.append(rec)
                progress.update(rec)
                if on_record is not None:
                    on_record(rec)
                counted += int(rec.status.counts)
                if keep_first is not None and counted >= keep_first and not cancel.is_set():
                    cancel.set()
                    batcher.cancel()
        returned = True
    finally:
        cancel.set()
        batcher.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
        if not returned:   # an exception (SIGTERM's SystemExit too): no caller will own these
            _discard_unreturned(submitted, cancelled)
        batcher.close()
        progress.finish()
        if own_env:
            env.shutdown()
    return RolloutResult(records=kept, cancelled=cancelled, not_started=not_started,
                         wall_s=time.monotonic() - t0, generation_calls=batcher.calls,
                         generation_s=batcher.busy_s, batch_sizes=list(batcher.batch_sizes))


# ----------------------------------------------------------------------------------------------
# CLI: roll a policy out over a suite and write the records as a shard.

def main(argv=None, *, load_checkpoint=None) -> int:
    """``python -m tr.agent.rollout --policy scripted --group-size 4 --out DIR/shard-0.jsonl``.

    ``load_checkpoint(spec, expect_model, concurrency, seed) -> (policy, system_prompt)`` is given
    by ``termrl rollout`` (tr/cli.py): the checkpoint loader reads stage stores, a room above this
    one, so the agent room never imports it; without it ``--checkpoint`` says to use termrl."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m tr.agent.rollout",
                                description="Roll a policy out over a task suite; write episode records (JSONL)")
    p.add_argument("--policy", default=None,
                   help="'scripted' (default), a model size ('tiny': untrained weights), or with "
                        "--checkpoint the size it must hold")
    p.add_argument("--checkpoint", default=None,
                   help="trained weights: a stage of a run W/STAGE[@STEP] or hf:DIR, with its own "
                        "model config, tokenizer and system prompt (tr.stages.checkpoints)")
    p.add_argument("--out", required=True, help="shard path (.jsonl)")
    p.add_argument("--suite", default=None)
    p.add_argument("--tasks", nargs="*", default=None, help="only these task ids")
    p.add_argument("--group-size", type=int, default=1, help="rollouts per task (G)")
    p.add_argument("--keep-first", type=int, default=None, help="over-sampling: keep the first N")
    p.add_argument("--mistake-prob", type=float, default=0.0, help="scripted: injected mistakes")
    p.add_argument("--snapshot", action="store_true", help="snapshot before the verifier (ReTerm)")
    p.add_argument("--backend", default="local",
                   help="local, docker, or a module defining a tr.envs.backends BACKEND")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--docker-endpoint", action="append", default=[], metavar="URL_OR_CONTEXT",
                   help="docker: spread sandboxes over these engines (repeat; default: the "
                        "local engine)")
    p.add_argument("--max-turns", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        get_backend(args.backend)
    except ValueError as exc:
        p.error(f"--backend: {exc}")

    tasks = load_suite(args.suite)
    if args.tasks:
        unknown = sorted(set(args.tasks) - {t.id for t in tasks})
        if unknown:
            p.error(f"--tasks: unknown task id(s) {unknown}")
        tasks = [t for t in tasks if t.id in set(args.tasks)]
    if args.docker_endpoint and not get_backend(args.backend).endpoints:
        p.error("--docker-endpoint needs --backend docker")
    system_prompt = None
    if args.checkpoint:
        if args.policy == "scripted":
            p.error("--checkpoint loads a model: drop --policy scripted")
        if load_checkpoint is None:
            p.error("--checkpoint: run it as `termrl rollout --checkpoint ...` (the checkpoint "
                    "loader sits above the agent room)")
        try:
            policy, system_prompt = load_checkpoint(args.checkpoint, args.policy,
                                                    args.concurrency, args.seed)
        except ValueError as exc:
            print(f"error: --checkpoint: {' '.join(str(exc).split())}", file=sys.stderr)
            return 2
        layout, budgets = policy.layout, policy.budgets(256, max_turns=args.max_turns)
    elif args.policy in (None, "scripted"):

        policy = ScriptedPolicy(tasks, mistake_prob=args.mistake_prob, seed=args.seed)
        layout, budgets = ChatLayout(ByteTokenizer()), Budgets(max_turns=args.max_turns)
    else:

        try:
            get_model_config(args.policy)
        except ValueError as exc:
            print(f"error: --policy {args.policy!r}: expected 'scripted' or a model size ({exc})",
                  file=sys.stderr)
            return 2
        policy = load_model_policy(args.policy, seed=args.seed)
        layout, budgets = policy.layout, policy.budgets(256, max_turns=args.max_turns)
    cfg = RolloutConfig(backend=args.backend, concurrency=args.concurrency, budgets=budgets,
                        snapshot_before_verify=args.snapshot,
                        docker_endpoints=tuple(args.docker_endpoint))
    if system_prompt is not None:
        cfg.system_prompt = system_prompt
    out = run_rollouts(group_specs(tasks, args.group_size, seed=args.seed), policy, layout, cfg,
                       keep_first=args.keep_first)
    n = write_shard(out.records, args.out)
    passed = sum(bool(r.passed) for r in out.records)
    print(f"wrote {n} episodes to {args.out} ({passed} passed, {len(out.cancelled)} cancelled, "
          f"{out.wall_s:.1f}s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
