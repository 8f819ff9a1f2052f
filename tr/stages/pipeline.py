"""The `pipeline` job: runs `config.stages` in order in one run directory (the workdir).

Each entry is `{name, kind, actor_from, critic_from, ...}` over `config.stage_defaults` (fields every
stage shares: model, tasks, rollout sizes ...) and the kind's own defaults. A finished stage
(manifest `finished_step` and `summary.json`) is not run again; a killed one resumes from its last
checkpoint. `actor_from` / `critic_from` name an earlier entry or a stage another job finished in
the same workdir (the gym's Base of the `base` job). `pipeline.json` collects the stages'
summaries.
"""

from __future__ import annotations

import json
import pathlib

from tr.stages import progress
from tr.stages.registry import ConfigError, stage_kind


def run(config, workdir: pathlib.Path) -> dict:
    if "stages" not in config or not config.stages:
        raise ConfigError("config.stages is empty: list the stages to run "
                          "({name, kind, actor_from, critic_from, ...})")
    shared = config.get("stage_defaults", None)
    shared = shared.to_dict() if hasattr(shared, "to_dict") else dict(shared or {})
    summaries, names = {}, set()
    for index, entry in enumerate(config.stages):
        entry = entry.to_dict() if hasattr(entry, "to_dict") else dict(entry)
        for field in ("name", "kind"):
            if not entry.get(field):
                raise ConfigError(f"config.stages[{index}] has no {field!r}")
        if entry["name"] in names:
            raise ConfigError(f"config.stages[{index}]: stage name {entry['name']!r} is used twice")
        for parent in ("actor_from", "critic_from"):
            source = entry.get(parent)
            if source and source != "fresh" and source not in names and not _finished(
                    workdir, source):
                raise ConfigError(f"config.stages[{index}] ({entry['name']}): {parent}={source!r} "
                                  f"is not an earlier stage (earlier: {sorted(names)}) nor a "
                                  f"finished stage in {workdir}")
        names.add(entry["name"])
        merged = merge_entry(shared, entry)
        with progress.stage(index, len(config.stages), entry["name"], entry["kind"]):
            summaries[entry["name"]] = stage_kind(entry["kind"])(merged, pathlib.Path(workdir))
        (pathlib.Path(workdir) / "pipeline.json").write_text(
            json.dumps(summaries, indent=1, sort_keys=True, default=str))
    return summaries


def _finished(workdir, stage: str) -> bool:
    """A stage another job finished in the workdir (e.g. the gym's Base, job `base`): its manifest
    has `finished_step`."""
    manifest = pathlib.Path(workdir) / stage / "stage.json"
    try:
        return json.loads(manifest.read_text()).get("finished_step") is not None
    except (OSError, ValueError):
        return False


def merge_entry(base: dict, over: dict) -> dict:
    """`over` laid on `base`, nested dicts merged key by key (a model's `overrides` replaced whole)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key != "overrides":
            out[key] = merge_entry(out[key], value)
        else:
            out[key] = value
    return out
