"""Hand-off from the parent manifest: a stage whose `actor_from` names a stage takes that stage's
model size (with overrides), tokenizer and system prompt unless its own config sets them, records
them in its own manifest, and its rollouts use them.

The pipeline test is real: an `init` parent of the gym's model shape (shrunk by overrides) with the
gym's BPE tokenizer and system prompt, then a `warmup` child with no model fields, on gym tasks in
local sandboxes.
"""

import json
import pathlib

import ml_collections
import pytest

from tr.agent.harness import SYSTEM_PROMPT as HARNESS_PROMPT
from tr.models import embedded
from tr.stages.stage_config import resolve_stage_config
from tr.stages.stage_models import build_models, inherit_from_parent
from tr.stages.registry import ConfigError

SMALL = dict(n_layers=1, d_model=32, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64)


def write_manifest(run_dir: pathlib.Path, stage: str, config: dict) -> None:
    (run_dir / stage).mkdir(parents=True)
    (run_dir / stage / "stage.json").write_text(json.dumps({"stage": stage, "config": config}))


def child(**entry) -> ml_collections.ConfigDict:
    return resolve_stage_config({"name": "child", **entry})


def test_unset_fields_come_from_the_actor_parent_manifest(tmp_path):
    write_manifest(tmp_path, "gymbase", embedded.manifest_config())      # Base: model as a name
    config = inherit_from_parent(child(actor_from="gymbase"), tmp_path)
    assert config.model.name == "gym" and dict(config.model.overrides) == {}
    assert config.tokenizer == embedded.TOKENIZER
    assert config.system_prompt == embedded.SYSTEM_PROMPT

    write_manifest(tmp_path, "small", {"model": {"name": "gym", "overrides": SMALL},
                                       "tokenizer": "byte"})            # a loop stage: {name, overrides}
    config = inherit_from_parent(child(actor_from="small"), tmp_path)
    assert dict(config.model.overrides) == SMALL and config.tokenizer == "byte"
    assert config.system_prompt == HARNESS_PROMPT                        # none recorded: the fallback


def test_the_stage_config_wins_over_the_parent(tmp_path):
    write_manifest(tmp_path, "gymbase", embedded.manifest_config())
    config = inherit_from_parent(
        child(actor_from="gymbase", tokenizer="byte", system_prompt="Be brief.",
              model={"name": "tiny", "overrides": {"n_layers": 1}}), tmp_path)
    assert (config.model.name, dict(config.model.overrides)) == ("tiny", {"n_layers": 1})
    assert (config.tokenizer, config.system_prompt) == ("byte", "Be brief.")


def test_no_parent_gets_the_fallbacks_and_bad_parents_raise(tmp_path):
    config = inherit_from_parent(child(), tmp_path)
    assert (config.model.name, config.tokenizer, config.system_prompt) == (
        "tiny", "byte", HARNESS_PROMPT)
    with pytest.raises(ConfigError, match="'missing' has no manifest"):
        inherit_from_parent(child(actor_from="missing"), tmp_path)
    write_manifest(tmp_path, "nomodel", {"tokenizer": "byte"})
    with pytest.raises(ConfigError, match="config.model = None"):
        inherit_from_parent(child(actor_from="nomodel"), tmp_path)
    write_manifest(tmp_path, "gymbase", embedded.manifest_config())
    write_manifest(tmp_path, "bytecritic", {"model": {"name": "gym", "overrides": {}},
                                            "tokenizer": "byte"})
    with pytest.raises(ConfigError, match="critic_from='bytecritic'"):
        inherit_from_parent(child(actor_from="gymbase", critic_from="bytecritic"), tmp_path)


def test_a_tokenizer_larger_than_the_model_vocabulary_is_refused():
    with pytest.raises(ConfigError, match="vocab_size 512"):
        build_models(ml_collections.ConfigDict({"name": "tiny", "overrides": {}}),
                     tokenizer=embedded.TOKENIZER)


def test_pipeline_child_runs_with_the_bpe_parent_tokenizer_and_prompt(tmp_path):
    from tr.agent.records import read_shard
    from tr.stages import pipeline

    config = ml_collections.ConfigDict({
        "job": "pipeline",
        "stage_defaults": {
            "tasks": {"source": "gym", "count": 2},
            "rollout": {"concurrency": 2, "tasks_per_iteration": 2, "max_output_tokens": 16,
                        "max_turns": 2},
            "arrays": {"rows": 4, "length": 1024},
            "eval": {"count": 1, "every": 0},
            "train": {"ppo": {"epochs": 1, "mini_batches": 1}, "logprob_chunk_size": 512},
        },
        "stages": [
            {"name": "base", "kind": "init", "model": {"name": "gym", "overrides": SMALL},
             "tokenizer": embedded.TOKENIZER, "system_prompt": embedded.SYSTEM_PROMPT},
            {"name": "warmup", "kind": "warmup", "actor_from": "base", "critic_from": "fresh"},
        ],
    })
    summaries = pipeline.run(config, tmp_path)
    assert summaries["warmup"]["actor_hash"] == summaries["base"]["actor_hash"]
    recorded = json.loads((tmp_path / "warmup" / "stage.json").read_text())["config"]
    assert recorded["model"] == {"name": "gym", "overrides": SMALL}
    assert recorded["tokenizer"] == embedded.TOKENIZER
    assert recorded["system_prompt"] == embedded.SYSTEM_PROMPT

    records = read_shard(tmp_path / "warmup" / "rollouts" / "00000.jsonl")
    assert records and all(r.messages[0]["content"] == embedded.SYSTEM_PROMPT for r in records)
    bpe = embedded.load_tokenizer()
    prompt_ids = bpe.encode(embedded.SYSTEM_PROMPT)
    for record in records:       # the token view is the BPE encoding (byte ids would be ~3.5x more)
        tokens = [t for seg in record.segments for t in seg.tokens]
        assert max(tokens) < bpe.vocab_size
        flat = ",".join(map(str, tokens))
        assert ",".join(map(str, prompt_ids)) in flat
    assert json.loads((tmp_path / "warmup" / "eval-val.json").read_text())["episodes"] == 1


def test_a_fresh_critic_can_start_from_the_actor_parent(tmp_path):
    """`critic_init: actor`: the fresh critic's backbone is the actor parent's retained weights and
    its value head is zero; `random` keeps an initialised backbone; anything else is named."""
    import jax
    import numpy as np

    from tr.stages import handoff, pipeline

    pipeline.run(ml_collections.ConfigDict({
        "job": "pipeline", "stage_defaults": {},
        "stages": [{"name": "base", "kind": "init", "model": {"name": "gym", "overrides": SMALL},
                    "tokenizer": embedded.TOKENIZER}]}), tmp_path)
    states = {}
    for init in ("random", "actor"):
        config = resolve_stage_config({"name": f"critic_{init}", "kind": "warmup",
                                       "actor_from": "base", "critic_from": "fresh",
                                       "critic_init": init})
        opened = handoff.open_stage(config, tmp_path, kind="warmup", actor_trains=False,
                                    critic_trains=True)
        states[init] = opened.state
        opened.store.close()

    def equal(a, b):
        return all(jax.tree.leaves(jax.tree.map(lambda x, y: bool(np.array_equal(x, y)), a, b)))

    from_actor = states["actor"].critic_params
    assert equal(from_actor["backbone"], states["actor"].actor_params)
    assert not np.asarray(from_actor["value_head"]).any() and float(from_actor["value_bias"]) == 0.0
    assert not equal(states["random"].critic_params["backbone"], states["random"].actor_params)
    bad = resolve_stage_config({"name": "critic_bad", "kind": "warmup", "actor_from": "base",
                                "critic_from": "fresh", "critic_init": "reward_model"})
    with pytest.raises(ConfigError, match="critic_init='reward_model'"):
        handoff.open_stage(bad, tmp_path, kind="warmup", actor_trains=False, critic_trains=True)
