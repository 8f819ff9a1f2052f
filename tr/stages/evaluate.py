"""The evaluation job (SPEC §6): Mean@k and Pass@1 of policies on a task suite, by family and tier.

Runs `tr.agent.evaluation.evaluate` with the policies the config names ('scripted': the teacher that
replays each task's reference solution; a model size such as 'tiny': that model, untrained unless a
checkpoint is given) and writes WORKDIR/eval.json, eval.txt and episodes-<policy>.jsonl.
"""

import pathlib

from tr.agent import evaluation
from tr.envs.tasks import TaskError, load_suite
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
    from tr.envs.backends import get_backend
    try:
        backend = get_backend(settings.backend)
    except ValueError as error:
        raise ConfigError(f"config.eval.backend = {settings.backend!r}: {error}") from None
    if not backend.endpoints:
        raise ConfigError(f"config.eval.docker_endpoints = {endpoints!r} needs a backend with "
                          f"engine endpoints (config.eval.backend = 'docker'); the "
                          f"{backend.name!r} backend has none")
    from tr.envs.endpoints import resolve_endpoint
    for endpoint in endpoints:
        try:
            resolve_endpoint(endpoint)
        except ValueError as error:
            raise ConfigError(f"config.eval.docker_endpoints: {error}") from None
    return endpoints


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
                                  docker_endpoints=endpoints)
    print(evaluation.format_table(results))
    print(f"wrote {workdir / 'eval.json'}, {workdir / 'eval.txt'} and the episode records")
    return results
