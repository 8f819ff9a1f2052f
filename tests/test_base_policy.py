"""The Base policy job (tr/stages/base.py, experiments/base_policy.py) and the embedded default
(tr/models/embedded.py; its assets made by tr/stages/embedded.py): selection, demo mixture, the shipped tokenizer, and the quick variant run
end to end through experiments/main.py (real sandboxes, real SFT, a real stage store)."""

import hashlib
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tr.agent import runbook as rb
from tr.data.episodes import packed_batches
from tr.envs import gym
from tr.models import embedded
from tr.stages import base
from tr.stages import embedded as make_assets

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_paths_recorded_before_the_assets_moved_still_load():
    """Runs before the move recorded `tr/stages/<file>` in manifests and configs: those still load
    the same files, and a pin made today names today's path."""
    old_tok, old_init = "tr/stages/gym_tokenizer.json", "tr/stages/gym_init.safetensors"
    assert embedded.canonical(old_tok) == embedded.TOKENIZER == "tr/models/assets/gym_tokenizer.json"
    assert embedded.canonical("tr/stages/gym_tokenizer_words.json") == embedded.WORDS_TOKENIZER
    assert embedded.canonical("elsewhere/tokenizer.json") == "elsewhere/tokenizer.json"
    pinned = embedded.pin_tokenizer(embedded.TOKENIZER)
    assert pinned.startswith(embedded.TOKENIZER + "#sha256=")
    assert embedded.pin_tokenizer(old_tok) == pinned
    pinned_old = old_tok + pinned[len(embedded.TOKENIZER):]
    text = "THOUGHT: Next step.\nCOMMAND:\n```bash\ncp /app/data/a.txt /app/keep/\n```"
    want = embedded.load_tokenizer().encode(text)
    for spec in (old_tok, pinned_old):
        assert embedded.load_tokenizer(spec).encode(text) == want, spec
    manifest = {"stage": "base", "config": {"model": "gym", "tokenizer": pinned_old}}
    assert embedded.from_manifest(manifest)[1].encode(text) == want
    shipped = hashlib.sha256(embedded.INIT_FILE.read_bytes()).hexdigest()
    assert embedded.file_digest(old_init) == embedded.file_digest(embedded.INIT) == shipped


def _eval(step, p, fams):
    return {"step": step, "pass_at_1": p, "by_family": fams}


def test_select_prefers_the_band_with_enough_families_then_the_target():
    four = lambda n: {f"f{i}": (0.5 if i < n else 0.0) for i in range(4)}
    evals = [_eval(10, 0.05, four(1)), _eval(20, 0.19, four(1)), _eval(30, 0.30, four(3)),
             _eval(40, 0.60, four(4))]
    # 0.19 is closest to 0.20 but has successes in 1 of 4 families; 0.30 qualifies.
    assert base.select(evals, target=0.2, band=(0.1, 0.35))["step"] == 30
    # Nothing qualifies: the closest overall.
    assert base.select(evals[:2] + evals[3:], target=0.2, band=(0.1, 0.35))["step"] == 20
    ties = [_eval(5, 0.25, four(2)), _eval(9, 0.15, four(2))]
    assert base.select(ties, target=0.2, band=(0.1, 0.35))["step"] == 5


def test_demo_plans_mix_clean_mistake_truncated_and_runbook(tmp_path, monkeypatch):
    monkeypatch.setenv("TR_GYM_DIR", str(tmp_path))
    tasks = gym.split_tasks("train", 70)
    plans = base.demo_plans(tasks, seed=3, p_mistake=0.3, p_truncate=0.2, p_runbook=0.2)
    assert plans == base.demo_plans(tasks, seed=3, p_mistake=0.3, p_truncate=0.2, p_runbook=0.2)
    kinds = [k for k, _ in plans.values()]
    assert {"clean", "mistake", "truncated", "runbook"} == set(kinds)
    for task, (kind, commands) in zip(tasks, plans.values()):
        if kind in ("clean", "runbook"):
            assert commands == gym.solution_commands(task)
            if kind == "runbook":     # the replay prompt RSR builds from the same commands
                shown = base.runbook_task(task, commands).instruction
                assert shown.startswith(task.instruction + rb.RUNBOOK_HEADER)
                assert all(f"Run: {c}" in shown for c in commands)
        elif kind == "mistake":
            assert commands[0] in gym.mistake_commands(task)
            assert commands[1:] == gym.repair_commands(task)
        else:
            assert commands != gym.solution_commands(task)


def test_shipped_tokenizer_is_rebuilt_identically_and_round_trips(tmp_path, monkeypatch):
    monkeypatch.setenv("TR_GYM_DIR", str(tmp_path / "gym"))
    rebuilt = make_assets.train_tokenizer(tmp_path / "tokenizer.json")
    assert rebuilt.read_text() == embedded.TOKENIZER_FILE.read_text()
    words = make_assets.train_tokenizer(tmp_path / "words.json", words=True)
    assert words.read_text() == embedded.WORDS_TOKENIZER_FILE.read_text()
    wtok = embedded.load_tokenizer(embedded.WORDS_TOKENIZER)
    piece = lambda s: [wtok.decode([i]) for i in wtok.encode(s)]
    # a name or number is the same tokens in an instruction, an observation and a command
    assert piece("/app/cache/x")[3] == piece("mkdir cache")[2] == "cache"
    assert piece("willow:9548")[2:] == piece("echo 9548")[2:] == ["9", "5", "4", "8"]
    tok = embedded.load_tokenizer()
    cfg = embedded.model_config()
    assert tok.vocab_size <= cfg.vocab_size
    text = "THOUGHT: x\nCOMMAND:\n```bash\ncp -f snap/notes.12 notes.txt <|im_end|> é\n```"
    ids = tok.encode(text)
    assert tok.decode(ids) == text and tok.eos_id not in ids      # specials never come from text
    sizes = make_assets.measure(n_per_family=2)
    assert sizes["bpe"]["episode_tokens"] < sizes["byte"]["episode_tokens"] / 1.5


def test_quick_variant_writes_base_json_and_an_actor_stage(tmp_path):
    work = tmp_path / "run"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TR_GYM_DIR": str(tmp_path / "gym")}
    proc = subprocess.run([sys.executable, "experiments/main.py",
                           "--config=experiments/base_policy.py:quick", f"--workdir={work}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((work / "base.json").read_text())
    assert 0.0 <= result["val"]["pass_at_1"] <= 1.0 and result["wall_s"] > 0
    assert set(result["test"]["by_family"]) == set(gym.FAMILIES)
    assert set(result["test"]["by_tier"]) == {"easy", "medium", "hard", "extreme"}
    assert result["selected_step"] in {e["step"] for e in result["evals"]}
    assert result["demos"]["episodes"] == 24 and result["demos"]["sequences"] > 0
    manifest = json.loads((work / "base" / "stage.json").read_text())
    # the copy warm-up has its own optimizer state: the checkpoint's step counts demo updates only
    assert manifest["kind"] == "sft" and manifest["finished_step"] == result["selected_step"]
    # it starts from the shipped copy-pretrained init, recorded by digest
    assert result["copy"] == {"steps": 0} and result["init"] == embedded.INIT
    assert manifest["config"]["init_digest"] == result["init_digest"] == embedded.file_digest(embedded.INIT)
    summary = json.loads((work / "base" / "summary.json").read_text())
    assert summary["retained_step"] == manifest["finished_step"]
    assert manifest["config"]["model"] == "gym"
    assert manifest["config"]["tokenizer"] == embedded.pin_tokenizer(embedded.TOKENIZER)
    model_cfg, tok, prompt = embedded.from_manifest(manifest)
    assert model_cfg.name == "gym" and tok.vocab_size == embedded.load_tokenizer().vocab_size
    assert prompt == embedded.SYSTEM_PROMPT
    steps = sorted(p.name for p in (work / "base" / "checkpoints").iterdir())
    assert steps == [str(result["selected_step"])]
    saved = sorted(p.name for p in (work / "base" / "checkpoints" / steps[0]).iterdir())
    assert "actor_params" in saved and "critic_params" not in saved
    assert "Pass@1" in (work / "base-test.txt").read_text()


def test_bad_band_is_one_clear_error(tmp_path):
    proc = subprocess.run([sys.executable, "experiments/main.py",
                           "--config=experiments/base_policy.py:quick", f"--workdir={tmp_path}",
                           "--config.select.target=0.5", "--config.select.band=(0.1, 0.3)"],
                          cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "config.select" in proc.stderr


def test_base_stage_kind_in_a_pipeline_is_a_finished_actor_stage_run_once(tmp_path, monkeypatch):
    import ml_collections

    from tr.stages import handoff, pipeline

    monkeypatch.setenv("TR_GYM_DIR", str(tmp_path / "gym"))
    config = ml_collections.ConfigDict({
        "job": "pipeline",
        # shared fields of other kinds reach the Base stage through the merge and are ignored
        "stage_defaults": {"model": {"name": "gym", "overrides": {}}, "eval": {"every": 1},
                           "rollout": {"concurrency": 2}},
        "stages": [{"name": "sft0", "kind": "base", "variant": "smoke", "concurrency": 4,
                    "sft": {"steps": 3, "eval_start": 2, "eval_every": 1}}]})
    run_dir = tmp_path / "run"
    summaries = pipeline.run(config, run_dir)
    summary = summaries["sft0"]
    stage = run_dir / "sft0"
    manifest = json.loads((stage / "stage.json").read_text())
    result = json.loads((stage / "base.json").read_text())
    assert manifest["kind"] == "sft" and manifest["config"]["model"] == "gym"
    assert manifest["config"]["tokenizer"] == embedded.pin_tokenizer(embedded.TOKENIZER)
    assert manifest["config"]["system_prompt"] == embedded.SYSTEM_PROMPT
    assert summary["retained_step"] == manifest["finished_step"] == result["selected_step"]
    assert [e["step"] for e in result["evals"]] == [2, 3]
    assert summary["val"] == result["val"] and summary["test"] == result["test"]
    assert json.loads((stage / "summary.json").read_text()) == summary
    assert "Pass@1" in (stage / "base-test.txt").read_text()
    assert (stage / "base-evals" / "test").is_dir()
    saved = sorted(p.name for p in (stage / "checkpoints" / str(summary["retained_step"])).iterdir())
    assert "actor_params" in saved and "critic_params" not in saved
    assert handoff.parent_ref(run_dir, "sft0").step == summary["retained_step"]
    assert json.loads((run_dir / "pipeline.json").read_text())["sft0"] == summary

    def no_training(*_a, **_k):
        raise AssertionError("a finished base stage was trained again")

    monkeypatch.setattr(base, "train", no_training)
    assert pipeline.run(config, run_dir)["sft0"] == summary


def test_base_stage_config_takes_sections_and_names_bad_fields():
    config = base.stage_config({"name": "b", "kind": "base", "seed": 3, "variant": "quick",
                                "model": {"name": "", "overrides": {}}, "tokenizer": "",
                                "system_prompt": "",
                                "sft": {"steps": 9, "learning_rate": 1e-3},
                                "select": {"band": [0.05, 0.4]}, "tasks": {"source": "gym"}})
    assert (config.stage, config.seed, config.sft.steps, config.sft.batch) == ("b", 3, 9, 4)
    assert config.select.band == (0.05, 0.4) and config.model == embedded.MODEL
    assert (config.tokenizer, config.system_prompt) == (embedded.TOKENIZER, embedded.SYSTEM_PROMPT)
    for entry, words in [({"sft": {"stepz": 3}}, "sft.stepz"), ({"lr": 1}, "'lr'"),
                         ({"actor_from": "sft0"}, "actor_from"), ({"variant": "big"}, "big"),
                         ({"model": {"name": "gym", "overrides": {"d_model": 64}}}, "overrides")]:
        with pytest.raises(base.ConfigError, match=words):
            base.stage_config({"name": "b", "kind": "base", **entry})


def test_evaluation_is_the_same_at_any_concurrency(tmp_path, monkeypatch):
    """Every request's key is (seed, episode, turn), the sampler's shapes are fixed: evaluating the
    same tasks with 1 or 4 sandboxes at once gives the same episodes, token for token."""
    from flax import nnx

    from tr.agent.records import read_shard
    from tr.models.decoder import Decoder

    monkeypatch.setenv("TR_GYM_DIR", str(tmp_path / "gym"))
    config = base.defaults("smoke")
    config.eval.max_turns, config.eval.max_output_tokens, config.seed = 2, 16, 5
    tok = embedded.load_tokenizer()
    model = Decoder(embedded.model_config(), rngs=nnx.Rngs(1))
    tasks = gym.split_tasks("val", 4)
    evaluator = base.Evaluator(config, model, tok)
    try:
        runs = []
        for concurrency in (1, 4):
            work = tmp_path / f"c{concurrency}-{len(runs)}"
            evaluator(tasks, work, concurrency=concurrency)
            records = sorted(read_shard(work / "episodes-base.jsonl"), key=lambda r: r.episode_id)
            runs.append([(r.episode_id, r.passed, [t.text for t in r.turns],
                          [(s.kind, s.tokens, s.logprobs) for s in r.segments]) for r in records])
    finally:
        evaluator.close()
    assert len(runs[0]) == len(tasks) and all(len(r[2]) >= 1 for r in runs[0])
    assert runs[0] == runs[1]
    # a different seed samples differently (the key is not constant)
    config.seed = 6
    other = base.Evaluator(config, model, tok)
    try:
        other(tasks, tmp_path / "s6", concurrency=4)
    finally:
        other.close()
    records = sorted(read_shard(tmp_path / "s6" / "episodes-base.jsonl"), key=lambda r: r.episode_id)
    assert [[t.text for t in r.turns] for r in records] != [x[2] for x in runs[0]]


def test_demo_shares_over_one_are_one_clear_error():
    config = base.defaults("quick")
    config.demos.p_runbook = 0.9             # 0.3 + 0.2 + 0.9 > 1
    with pytest.raises(base.ConfigError, match=r"config\.demos shares .*p_runbook"):
        base.check_config(config)


def test_a_mistake_demos_wrong_action_is_context_not_a_target():
    import numpy as np
    seq = {"tokens": np.arange(8, dtype=np.int32),
           "turn_ids": np.array([0, 0, 1, 1, 1, 2, 2, 2], np.int32),     # prompt, action 1, action 2
           "actor_mask": np.array([0, 0, 1, 1, 0, 1, 1, 0], bool)}       # (an observation token each)
    seq["loss_mask"] = seq["actor_mask"].copy()
    out = base.mask_first_action(seq)
    assert out["loss_mask"].tolist() == [0, 0, 0, 0, 0, 1, 1, 0]
    assert out["actor_mask"].tolist() == seq["actor_mask"].tolist()   # still the actor's tokens
    assert seq["loss_mask"].tolist() == seq["actor_mask"].tolist()    # the input is not changed


def test_copy_batches_previous_token_rows_then_packed_span_repeats():
    tok = embedded.load_tokenizer()
    ordinary = base.ordinary_ids(tok)
    assert tok.pad_id not in ordinary and tok.eos_id not in ordinary
    assert len(ordinary) == tok.vocab_size - 4
    batch = next(base.copy_batches(ordinary, batch=3, length=64, span=(3, 7), prev_rows=1, seed=0))
    row, mask = batch["tokens"][0], batch["loss_mask"][0]
    assert (row[0::2] == row[1::2]).all() and mask[1::2].all() and not mask[0::2].any()
    assert set(row) <= set(ordinary)
    for r in (1, 2):
        row, mask, seg = batch["tokens"][r], batch["loss_mask"][r], batch["segment_ids"][r]
        segments = [k for k in np.unique(seg) if k]
        assert len(segments) >= 64 // 14
        for k in segments:
            at = np.flatnonzero(seg == k)
            n = len(at) // 2
            assert len(at) == 2 * n and 3 <= n <= 7 and (np.diff(at) == 1).all()
            span = row[at]
            assert (span[:n] == span[n:]).all() and set(span) <= set(ordinary)
            # loss on the repeat after its first token (the first is not predictable)
            assert mask[at].tolist() == [False] * (n + 1) + [True] * (n - 1)
        assert not mask[seg == 0].any()


def test_with_copy_rows_appends_copy_rows_below_each_demo_batch():
    tok = embedded.load_tokenizer()
    ordinary = base.ordinary_ids(tok)
    seqs = [{"tokens": [5, 6, 7, 8] * 10, "loss_mask": [True] * 40}] * 8
    plain = iter(packed_batches(seqs, batch=3, length=64, pad_id=tok.pad_id, seed=0))
    mixed = base.with_copy_rows(iter(packed_batches(seqs, batch=3, length=64, pad_id=tok.pad_id,
                                                    seed=0)),
                                rows=1, ordinary_ids=ordinary, span=(4, 8), seed=0)
    for _ in range(3):
        a, b = next(plain), next(mixed)
        assert b["tokens"].shape == (4, 64) and set(b) == set(a)
        for key in a:                                                    # demo rows untouched
            assert (a[key] == b[key][:3]).all(), key
        assert set(b["tokens"][3][b["segment_ids"][3] > 0]) <= set(ordinary)
        assert b["segment_ids"][3].max() >= 4 and b["loss_mask"][3].any()


def test_copy_config_errors_name_the_field():
    config = base.defaults("quick")
    config.copy.rows = config.sft.batch
    with pytest.raises(base.ConfigError, match=r"config\.copy\.rows"):
        base.check_config(config)
    config.copy.rows, config.copy.steps = 0, -1
    with pytest.raises(base.ConfigError, match=r"config\.copy\.steps"):
        base.check_config(config)
    config.copy.steps, config.copy.span = 4, (8, 4)
    with pytest.raises(base.ConfigError, match=r"config\.copy\.span"):
        base.check_config(config)
    config.copy.span, config.copy.prev_rows = (4, 8), config.copy.batch
    with pytest.raises(base.ConfigError, match=r"config\.copy\.prev_rows"):
        base.check_config(config)
    config.copy.prev_rows = 1
    config.init = "tr/stages/no-such-init.safetensors"
    with pytest.raises(base.ConfigError, match=r"config\.init .*no such file"):
        base.check_config(config)
    config.init, config.model = embedded.INIT, "tiny"
    with pytest.raises(base.ConfigError, match=r"config\.init .*'gym', not 'tiny'"):
        base.check_config(config)


def _copy_loss(model, params, tokenizer) -> float:
    """Mean NLL of the repeats of span-copy rows (`copy_batches`, no previous-token rows)."""
    from tr.train.model_fns import nnx_model_fns

    batch = next(base.copy_batches(base.ordinary_ids(tokenizer), batch=8, length=128, span=(4, 24),
                                   prev_rows=0, seed=123))
    logp = np.asarray(nnx_model_fns(model).actor_logprobs(params, batch))
    return float(-(logp * batch["loss_mask"]).sum() / batch["loss_mask"].sum())


def test_shipped_init_copies_in_context_and_pretrain_rewrites_it(tmp_path):
    """The shipped init (`python -m tr.stages.embedded pretrain`) is the gym model after its copy
    updates: it predicts the repeat of a random span (an induction head), a random init cannot;
    the command writes a file that loads into the model and is not the shipped one."""
    from flax import nnx

    from tr.models.decoder import Decoder
    from tr.train.model_fns import nnx_model_fns

    tok = embedded.load_tokenizer()
    fresh = lambda: Decoder(embedded.model_config(), rngs=nnx.Rngs(0))
    random_model = fresh()
    shipped = embedded.load_init(fresh(), embedded.INIT)
    random_loss = _copy_loss(random_model, nnx_model_fns(random_model).actor_params, tok)
    shipped_loss = _copy_loss(shipped, nnx_model_fns(shipped).actor_params, tok)
    assert random_loss > 5.0 and shipped_loss < 1.5, (random_loss, shipped_loss)

    stats = make_assets.pretrain(tmp_path / "init.safetensors", steps=2, seed=1)
    assert stats["steps"] == 2 and stats["sha256"] == embedded.file_digest(str(tmp_path / "init.safetensors"))
    again = embedded.load_init(fresh(), str(tmp_path / "init.safetensors"))
    written = nnx_model_fns(again).actor_params
    assert stats["sha256"] != embedded.file_digest(embedded.INIT)
    # two updates from a random init: still no copying, and not the shipped weights
    assert _copy_loss(again, written, tok) > 4.0
    with pytest.raises(ValueError, match=r"config\.init .*no file"):
        embedded.load_init(fresh(), str(tmp_path / "missing.safetensors"))
    tiny = Decoder(embedded.model_config("tiny"), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"config\.init .* does not fit model 'tiny'"):
        embedded.load_init(tiny, embedded.INIT)
