"""The `pipeline` job: runs `config.stages` in order in one run directory (the workdir).

Each entry is `{name, kind, actor_from, critic_from, ...}` over `config.stage_defaults` (fields every
stage shares: model, tasks, rollout sizes ...) and the kind's own defaults. A finished stage
(manifest `finished_step` and `summary.json`) is not run again; a killed one resumes from its last
checkpoint. `pipeline.json` collects the stages' summaries.
"""

from __future__ import annotations

import json
import pathlib

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
            if source and source != "fresh" and source not in names:
                raise ConfigError(f"config.stages[{index}] ({entry['name']}): {parent}={source!r} "
                                  f"is not an earlier stage (earlier: {sorted(names)})")
        names.add(entry["name"])
        merged = _merge(shared, entry)
        summaries[entry["name"]] = stage_kind(entry["kind"])(merged, pathlib.Path(workdir))
        (pathlib.Path(workdir) / "pipeline.json").write_text(
            json.dumps(summaries, indent=1, sort_keys=True, default=str))
    return summaries


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key != "overrides":
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out
