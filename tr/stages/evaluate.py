"""The evaluation job (SPEC §6): Mean@k and Pass@1 of policies on a task suite, by family and tier.

Runs `tr.agent.evaluation.evaluate` with the policies the config names ('scripted': the teacher that
replays each task's reference solution; a model size such as 'tiny': that model, untrained) and the
checkpoints `config.eval.checkpoints` names (`W/STAGE`, `hf:DIR`: `tr.stages.checkpoints`, each with
its own model, tokenizer and system prompt), and writes WORKDIR/eval.json, eval.txt and
episodes-<policy>.jsonl.

`evaluate_loaded` is the one evaluation of a loaded checkpoint: the Terminal-RSI report's test
evaluations and `termrl eval` run it.
"""

import pathlib

from tr.agent import evaluation
from tr.envs.backends import get_backend
from tr.envs.endpoints import resolve_endpoint
from tr.envs.tasks import TaskError, load_suite
from tr.stages import checkpoints
from tr.stages.registry import ConfigError


def select_tasks(suite: str, task_ids):
    """The suite's tasks (the built-in one for ""), restricted to `task_ids` when given."""
    try:
        tasks = load_suite(suite or None)
    except TaskError as error:
        raise ConfigError(f"config.eval.suite = {suite!r}: {error}") from None
    if task_ids:
        known = {t.id for t in tasks}
        unknown = sorted(set(task_ids) - known)
        if unknown:
            raise ConfigError(f"config.eval.tasks names unknown task id(s) {unknown}; "
                             f"see `python -m tr.envs.tasks list`")
        tasks = [t for t in tasks if t.id in set(task_ids)]
    return tasks


def docker_endpoints(settings) -> tuple[str, ...]:
    """``config.eval.docker_endpoints``, checked: each a Docker URL or a docker context name, and
    only with a backend whose sandboxes can be placed on engines (``Backend.endpoints``)."""
    endpoints = tuple(settings.get("docker_endpoints", ()) or ())
    if not endpoints:
        return ()
    try:
        backend = get_backend(settings.backend)
    except ValueError as error:
        raise ConfigError(f"config.eval.backend = {settings.backend!r}: {error}") from None
    if not backend.endpoints:
        raise ConfigError(f"config.eval.docker_endpoints = {endpoints!r} needs a backend with "
                          f"engine endpoints (config.eval.backend = 'docker'); the "
                          f"{backend.name!r} backend has none")
    for endpoint in endpoints:
        try:
            resolve_endpoint(endpoint)
        except ValueError as error:
            raise ConfigError(f"config.eval.docker_endpoints: {error}") from None
    return endpoints


def model_budgets(policy, settings):
    """Harness budgets of a checkpoint's evaluation: turns and tokens end the episodes; the
    wall-clock cap is far above need (a loaded machine never changes an evaluation)."""
    return policy.budgets(int(settings["max_output_tokens"]), max_turns=int(settings["max_turns"]),
                          context=int(settings.get("context", 0) or 0), summarise_at_tokens=None,
                          wall_time_s=float(settings.get("wall_time_s", 1800.0) or 1800.0))


def evaluate_loaded(loaded: checkpoints.Loaded, tasks, settings, *, workdir: pathlib.Path,
                    seed: int, name: str, backend: str = "local", docker_endpoints=()) -> dict:
    """Mean@k / Pass@1 of a loaded checkpoint's actor on `tasks` (`evaluation.evaluate`; its
    summary), at `settings`' `k`, `temperature`, `top_p`, `max_turns`, `max_output_tokens`,
    `context`, `concurrency`, with the checkpoint's own tokenizer and system prompt.  The sampler is
    the stages' batch-invariant one: the outcome is a function of (parameters, tasks, seed)."""
    policy = checkpoints.model_policy(loaded, concurrency=int(settings["concurrency"]),
                                      max_new_tokens=int(settings["max_output_tokens"]),
                                      temperature=float(settings["temperature"]),
                                      top_p=float(settings["top_p"]), seed=seed, name=name)
    try:
        return evaluation.evaluate({name: policy}, tasks, k=int(settings["k"]), workdir=workdir,
                                   backend=backend, concurrency=int(settings["concurrency"]),
                                   budgets=model_budgets(policy, settings), seed=seed,
                                   progress=False, system_prompt=loaded.system_prompt,
                                   docker_endpoints=tuple(docker_endpoints))[name]
    finally:
        policy.sampler.close()


def run(config, workdir: pathlib.Path):
    settings = config.eval
    endpoints = docker_endpoints(settings)
    tasks = select_tasks(settings.suite, tuple(settings.tasks))
    policies, budgets = evaluation.build_policies(
        tuple(settings.policies), tasks, seed=config.seed,
        max_turns=settings.max_turns or None,
        model_max_turns=settings.model_max_turns or settings.max_turns or None,
        model_output_tokens=settings.model_output_tokens)
    results = evaluation.evaluate(policies, tasks, k=settings.k, workdir=workdir,
                                  backend=settings.backend, concurrency=settings.concurrency,
                                  budgets=budgets, seed=config.seed, progress=True,
                                  docker_endpoints=endpoints) if policies else {}
    for spec in tuple(settings.get("checkpoints", ()) or ()):
        try:
            loaded = checkpoints.load(spec)
        except checkpoints.CheckpointError as error:
            raise ConfigError(f"config.eval.checkpoints: {error}") from None
        ckpt_settings = {"k": settings.k, "concurrency": settings.concurrency,
                         **dict(settings.checkpoint_eval)}
        results[spec] = evaluate_loaded(loaded, tasks, ckpt_settings, workdir=workdir,
                                        seed=config.seed, name=spec, backend=settings.backend,
                                        docker_endpoints=endpoints)
    if not results:
        raise ConfigError("config.eval.policies and config.eval.checkpoints are both empty")
    evaluation.write_results(results, workdir)
    print(evaluation.format_table(results))
    print(f"wrote {workdir / 'eval.json'}, {workdir / 'eval.txt'} and the episode records")
    return results
