"""`termrl` (tr/cli.py) and the one checkpoint loader (tr/stages/checkpoints.py), on real parts: a
real stage store on disk (a finished `init` stage of the embedded `gym` model and tokenizer), real
gym sandboxes, a real HTTP server, a real `pip install -e .` into a fresh virtualenv.

Each subcommand's happy path and its bad input (one line on stderr, exit status 2); an export
loads back as `hf:DIR` with bit-identical logits, and `termrl eval` of the stage and of its export
gives the same numbers and the same episodes."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import urllib.request

import jax.numpy as jnp
import numpy as np
import openai
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tr.agent.records import read_shard  # noqa: E402  pylint: disable=wrong-import-position
from tr.models import embedded  # noqa: E402  pylint: disable=wrong-import-position
from tr.stages import checkpoints, handoff  # noqa: E402  pylint: disable=wrong-import-position

# PYTHONPATH: `python -m tr` from any folder, as an installed `termrl` would run
ENV = {**os.environ, "JAX_PLATFORMS": "cpu",
       "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
SUBCOMMANDS = ("run", "eval", "serve", "export", "tasks", "gym", "rollout", "aot")
# a small evaluation: 2 gym test tasks, 2 attempts, 1 turn of at most 16 tokens
SMALL_EVAL = ("--tasks", "gym:test", "--count", "2", "--k", "2", "--max-turns", "1",
              "--max-output-tokens", "16", "--concurrency", "2")


def termrl(*args, timeout=900, cwd=ROOT, env=None):
    return subprocess.run([sys.executable, "-m", "tr", *map(str, args)], cwd=cwd, env=env or ENV,
                          capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(result, *fragments):
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    """A finished stage of a real run directory: the `gym` model (freshly initialised, seed 0)
    with the embedded tokenizer pinned to its sha256 and the embedded system prompt."""
    run_dir = tmp_path_factory.mktemp("run")
    handoff.init_base({"name": "init", "kind": "init", "model": {"name": "gym", "overrides": {}},
                       "tokenizer": embedded.pin_tokenizer(embedded.TOKENIZER),
                       "system_prompt": embedded.SYSTEM_PROMPT, "seed": 0}, run_dir)
    return run_dir / "init"


@pytest.fixture(scope="module")
def exported(stage, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "init-hf"
    result = termrl("export", "--checkpoint", stage, "--out", out)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"hf:{out}" in result.stdout
    return out


# ------------------------------------------------------------------------------------------------
# help and bad input


def test_help_lists_every_subcommand_and_each_has_help():
    result = termrl("--help")
    assert result.returncode == 0
    for name in SUBCOMMANDS:
        assert f"    {name} " in result.stdout, name
    for name in SUBCOMMANDS:
        sub = termrl(name, "--help")
        assert sub.returncode == 0, (name, sub.stderr[-1000:])
        assert "usage:" in sub.stdout, name


@pytest.mark.parametrize("args, fragment", [
    (("nosuch",), "invalid choice"),
    (("eval", "--tasks", "gym:test"), "--checkpoint"),
    (("eval", "--checkpoint", "/nonexistent/stage", "--tasks", "gym:test"), "no stage.json"),
    (("eval", "--checkpoint", "hf:/nonexistent", "--tasks", "gym:test"), "config.json"),
    (("eval", "--checkpoint", "openai:localhost:8000", "--tasks", "gym:test"), "openai:http"),
    (("eval", "--checkpoint", "/x", "--tasks", "gym:test", "--k", "0"), "--k 0"),
    (("export", "--checkpoint", "hf:/nonexistent", "--out", "/tmp/x"), "config.json"),
    (("serve", "--checkpoint", "/nonexistent/stage"), "no stage.json"),
    (("serve", "--checkpoint", "openai:http://h/v1#m"), "no weights"),
    (("run", "experiments/nosuch.py"), "does not exist"),
    (("run", "experiments/gae_demo.py", "stray"), "unexpected argument"),
    (("run", "experiments/gae_demo.py:nosuch", "--print_config"), "unknown variant"),
    (("eval", "--checkpoint", "/x", "--tasks", "gym:test", "--bogus"), "unrecognized"),
])
def test_bad_input_is_one_line_and_exit_2(args, fragment):
    assert_one_line_error(termrl(*args, timeout=300), fragment)


def test_eval_refuses_bad_tasks_and_a_run_folder_by_name(stage):
    assert_one_line_error(termrl("eval", "--checkpoint", stage, "--tasks", "gym:nosuch"),
                          "gym:test")
    assert_one_line_error(termrl("eval", "--checkpoint", stage, "--tasks", "/nonexistent"),
                          "no such directory")
    # the run folder, not a stage: the error names its stages
    assert_one_line_error(termrl("eval", "--checkpoint", stage.parent, "--tasks", "gym:test"),
                          "'init'")


def test_export_refuses_a_non_empty_out(stage, tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    assert_one_line_error(termrl("export", "--checkpoint", stage, "--out", tmp_path), "not an empty")
    assert (tmp_path / "keep.txt").read_text() == "x"


def test_rollout_unknown_policy_is_one_line():
    result = subprocess.run([sys.executable, "-m", "tr.agent.rollout", "--policy", "nosuch",
                             "--out", "/tmp/never.jsonl"], cwd=ROOT, env=ENV, capture_output=True,
                            text=True, timeout=300)
    assert_one_line_error(result, "'nosuch'", "known sizes")


# ------------------------------------------------------------------------------------------------
# the loader: the checkpoint's own graph and tokenizer, mismatches refused by name


def test_stage_loads_with_its_manifest_model_tokenizer_and_prompt(stage):
    loaded = checkpoints.load(str(stage))
    assert loaded.config.name == "gym" and loaded.config.vocab_size == 1024
    assert loaded.tokenizer.vocab_size == embedded.TOKENIZER_VOCAB
    assert loaded.tokenizer.encode("ls /app") == embedded.load_tokenizer().encode("ls /app")
    assert loaded.system_prompt == embedded.SYSTEM_PROMPT
    assert loaded.source["step"] == 0
    from tr.train.checkpoint import tree_hash
    summary = json.loads((stage / "summary.json").read_text())
    assert tree_hash(loaded.params) == summary["actor_hash"]


def test_export_loads_back_with_identical_logits(stage, exported):
    a = checkpoints.load(str(stage))
    b = checkpoints.load(f"hf:{exported}")
    assert sorted(p.name for p in exported.iterdir()) == ["config.json", "model.safetensors",
                                                          "tokenizer.json", "tr.json"]
    assert a.config == b.config and a.system_prompt == b.system_prompt
    text = "THOUGHT: look\nCOMMAND:\n```bash\nls -la /app && cat notes.txt\n```"
    assert a.tokenizer.encode(text) == b.tokenizer.encode(text)
    tokens = jnp.asarray([a.tokenizer.encode(text)], jnp.int32)
    la, lb = np.asarray(a.model(tokens)), np.asarray(b.model(tokens))
    assert la.shape == (1, tokens.shape[1], 1024)
    np.testing.assert_array_equal(la, lb)


def test_mismatches_are_refused_by_name(stage, exported, tmp_path):
    # the caller names another size than the checkpoint holds
    with pytest.raises(checkpoints.CheckpointError, match="holds model 'gym', not the 'tiny'"):
        checkpoints.load(str(stage), expect_model="tiny")
    with pytest.raises(checkpoints.CheckpointError, match="tokenizer"):
        checkpoints.load(str(stage), expect_tokenizer="byte")
    # tr.json names a size config.json does not describe
    bad = tmp_path / "bad-hf"
    shutil.copytree(exported, bad)
    sidecar = json.loads((bad / "tr.json").read_text())
    sidecar["model"] = {"name": "tiny", "overrides": {}}
    (bad / "tr.json").write_text(json.dumps(sidecar))
    with pytest.raises(checkpoints.CheckpointError, match="names model 'tiny'.*vocab_size"):
        checkpoints.load(f"hf:{bad}")
    # a tokenizer with more ids than the model's vocabulary
    small = tmp_path / "small-vocab"
    shutil.copytree(exported, small)
    config = json.loads((small / "config.json").read_text())
    (small / "tr.json").unlink()
    config["vocab_size"] = 512
    (small / "config.json").write_text(json.dumps(config))
    with pytest.raises(checkpoints.CheckpointError, match="1024 ids but model 'hf' has vocab_size 512"):
        checkpoints.load(f"hf:{small}")
    # a stage whose pinned tokenizer file changed since
    run = tmp_path / "run"
    shutil.copytree(stage.parent, run)
    manifest = json.loads((run / "init" / "stage.json").read_text())
    manifest["config"]["tokenizer"] = manifest["config"]["tokenizer"].split("#")[0] + "#sha256=" + "0" * 64
    (run / "init" / "stage.json").write_text(json.dumps(manifest))
    with pytest.raises(checkpoints.CheckpointError, match="tokenizer.*sha256"):
        checkpoints.load(str(run / "init"))


def test_rollout_checkpoint_of_another_size_is_refused_by_name(stage):
    result = subprocess.run([sys.executable, "-m", "tr", "rollout", "--checkpoint", str(stage),
                             "--policy", "tiny", "--out", "/tmp/never.jsonl"], cwd=ROOT, env=ENV,
                            capture_output=True, text=True, timeout=300)
    assert_one_line_error(result, "holds model 'gym'", "'tiny'")


# ------------------------------------------------------------------------------------------------
# eval, serve, run, tasks, gym


def _eval(checkpoint, out):
    result = termrl("eval", "--checkpoint", checkpoint, *SMALL_EVAL, "--json", "--out", out)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_eval_of_a_stage_and_of_its_export_give_the_same_numbers(stage, exported, tmp_path):
    a = _eval(stage, tmp_path / "a")
    b = _eval(f"hf:{exported}", tmp_path / "b")
    assert {"pass_at_1", "mean_at_k", "k", "episodes", "by_family", "by_tier"} <= set(a)
    assert a["k"] == 2 and a["episodes"] == 4 and len(a["task_ids"]) == 2
    assert a["checkpoint"]["kind"] == "stage" and b["checkpoint"]["kind"] == "hf"
    for key in ("pass_at_1", "mean_at_k", "episodes", "by_family", "by_tier", "statuses",
                "task_ids"):
        assert a[key] == b[key], key
    # the same episodes, word for word: same weights, tokenizer, prompt, sampler and keys
    ra = {r.episode_id: r for r in read_shard(tmp_path / "a" / "episodes-checkpoint.jsonl")}
    rb = {r.episode_id: r for r in read_shard(tmp_path / "b" / "episodes-checkpoint.jsonl")}
    assert sorted(ra) == sorted(rb) and len(ra) == 4
    for episode_id, record in ra.items():
        assert record.messages == rb[episode_id].messages
        assert record.messages[0]["content"] == embedded.SYSTEM_PROMPT
    # the table form names the families and tiers
    table = termrl("eval", "--checkpoint", stage, *SMALL_EVAL)
    assert table.returncode == 0, table.stderr[-2000:]
    assert "Pass@1" in table.stdout and "Mean@2" in table.stdout
    for family in a["by_family"]:
        assert f"family {family}" in table.stdout


def test_eval_of_a_task_directory_written_by_termrl_gym(stage, tmp_path):
    tasks = tmp_path / "tasks"
    written = termrl("gym", "write", tasks, "--split", "val", "--count", "2")
    assert written.returncode == 0, written.stderr[-2000:]
    result = termrl("eval", "--checkpoint", stage, "--tasks", tasks, "--k", "1", "--max-turns", "1",
                    "--max-output-tokens", "16", "--concurrency", "2", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["episodes"] == 2 and sorted(out["task_ids"]) == sorted(p.name for p in tasks.iterdir())


def test_tasks_and_gym_are_todays_clis():
    for args, module in ((("tasks", "list"), "tr.envs.tasks"), (("gym", "families"), "tr.envs.gym")):
        ours = termrl(*args)
        theirs = subprocess.run([sys.executable, "-m", module, *args[1:]], cwd=ROOT, env=ENV,
                                capture_output=True, text=True, timeout=300)
        assert ours.returncode == theirs.returncode == 0
        assert ours.stdout == theirs.stdout and ours.stdout.strip()
    assert termrl("tasks", "list", "/nonexistent").returncode == subprocess.run(
        [sys.executable, "-m", "tr.envs.tasks", "list", "/nonexistent"], cwd=ROOT, env=ENV,
        capture_output=True, text=True, timeout=300).returncode


def test_run_is_what_launch_run_sh_runs(tmp_path):
    printed = termrl("run", "experiments/gae_demo.py:unit_clock", "--print_config",
                     "--config.lam=0.5")
    assert printed.returncode == 0, printed.stderr[-2000:]
    config = json.loads(printed.stdout)
    assert config["job"] == "gae_demo" and config["lam"] == 0.5 and config["lam_turn"] == 1.0
    workdir = tmp_path / "gae"
    result = termrl("run", "experiments/gae_demo.py", "--workdir", workdir, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((workdir / "config.json").read_text())["job"] == "gae_demo"


def test_serve_answers_chat_completions_and_eval_of_the_endpoint(stage):
    proc = subprocess.Popen([sys.executable, "-m", "tr", "serve", "--checkpoint", str(stage),
                             "--port", "0", "--model-name", "gym-init", "--max-output-tokens", "16",
                             "--slots", "2"], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in proc.stderr:   # "serving ... at http://127.0.0.1:PORT/v1"
            if line.startswith("serving "):
                url = line.rsplit(" at ", 1)[1].strip()
                break
        assert url, "the server never said where it listens"
        with urllib.request.urlopen(f"{url}/models", timeout=60) as response:
            models = json.loads(response.read())
        assert [m["id"] for m in models["data"]] == ["gym-init"]
        body = json.dumps({"model": "gym-init", "max_tokens": 8, "messages": [
            {"role": "system", "content": embedded.SYSTEM_PROMPT},
            {"role": "user", "content": "Create /app/out.txt containing hello."}]}).encode()
        request = urllib.request.Request(f"{url}/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            reply = json.loads(response.read())
        assert isinstance(reply["choices"][0]["message"]["content"], str)
        assert reply["usage"]["completion_tokens"] <= 8 if "usage" in reply else True
        # the official client against the served stage: the same seeded reply whole and streamed
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)
        messages = json.loads(body)["messages"]
        whole = client.chat.completions.create(model="gym-init", messages=messages, max_tokens=8,
                                               seed=7)
        chunks = list(client.chat.completions.create(model="gym-init", messages=messages,
                                                     max_tokens=8, seed=7, stream=True))
        assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length"), chunks
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == whole.choices[0].message.content
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="gpt-nonexistent", messages=messages)
        # `termrl eval` of an OpenAI-compatible endpoint: the served stage, over real sandboxes
        result = termrl("eval", "--checkpoint", f"openai:{url}#gym-init", "--tasks", "gym:test",
                        "--count", "2", "--k", "1", "--max-turns", "1", "--max-output-tokens", "8",
                        "--concurrency", "2", "--json")
        assert result.returncode == 0, result.stderr[-3000:]
        out = json.loads(result.stdout.strip().splitlines()[-1])
        assert out["episodes"] == 2 and out["infra_failures"] == 0
        assert out["checkpoint"] == {"kind": "openai", "spec": f"openai:{url}#gym-init"}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_the_evaluate_job_takes_checkpoints(stage, tmp_path):
    workdir = tmp_path / "eval"
    result = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "main.py"),
         "--config=experiments/evaluate.py:quick", f"--workdir={workdir}",
         "--config.eval.policies=()", f"--config.eval.checkpoints=('{stage}',)",
         "--config.eval.tasks=('ft-normalize-whitespace',)",
         "--config.eval.checkpoint_eval.max_turns=1",
         "--config.eval.checkpoint_eval.max_output_tokens=16"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((workdir / "eval.json").read_text())
    assert list(data) == [str(stage)] and data[str(stage)]["episodes"] == 1
    bad = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "main.py"),
         "--config=experiments/evaluate.py:quick", f"--workdir={tmp_path / 'bad'}",
         "--config.eval.checkpoints=('/nonexistent/stage',)"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert bad.returncode == 2 and "config.eval.checkpoints" in bad.stderr
    assert "Traceback" not in bad.stderr


# ------------------------------------------------------------------------------------------------
# packaging


def test_pip_install_in_a_fresh_venv_gives_the_termrl_command(tmp_path):
    """`pip install -e .` in a fresh virtualenv, without the dependencies (`--no-deps`: `termrl
    --help` needs none of them); pip's build isolation fetches setuptools (the index or pip's
    cache: Python 3.11's bundled setuptools 65 has no `wheel` for an offline editable build)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-deps",
                          "-q", "-e", str(ROOT)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-2000:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run([str(venv / "bin" / "termrl"), "--help"], capture_output=True,
                            text=True, timeout=120, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    for name in SUBCOMMANDS:
        assert f"    {name} " in result.stdout, name
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import tr; print(tr.__file__)"],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert where.stdout.strip() == str(ROOT / "tr" / "__init__.py")


# ------------------------------------------------------------------------------------------------
# aot on the recipes' own configs


def _experiment(name, variant):
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"cfg_{name}", ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(variant)


def test_aot_plan_is_derived_from_the_recipes_paper_configs():
    from tr.models.config import get_model_config
    from tr.stages import pod_plan
    from tr.train import aot

    rsi = _experiment("terminal_rsi", "paper")
    plan = pod_plan.experiment_plan(rsi)
    d = rsi.stage_defaults
    assert plan.model.name == "qwen3-27b-32k" and plan.pod == rsi.pod and plan.aot.topology == "v5p-128"
    # 512 rows x 32,768 tokens in micro-batches of train.micro_batch_rows = 4 rows
    batch = {"rows": 512, "length": 32768, "micro_batches": 512 // 4}
    assert set(plan.shapes) == {"sft", "critic", "ppo", "sampler"}   # rsr, warmup, rpr stages
    for update in ("sft", "critic", "ppo"):
        assert plan.shapes[update].to_dict() == batch
    # the stages' episode sampler caches the model's whole context: 32,768 tokens
    assert get_model_config("qwen3-27b-32k").max_seq_len == d.rollout.context == 32768
    assert plan.shapes.sampler.to_dict() == {"rows": d.rollout.concurrency,
                                             "prompt_len": 32768 - 8192, "new_tokens": 8192}
    assert set(aot.planned_steps(plan)) == {"sampler_prefill", "sampler_decode", "sft", "critic", "ppo"}
    reterm = _experiment("reterm", "paper")
    plan = pod_plan.experiment_plan(reterm)
    assert plan.model.name == "qwen3-8b" and plan.train.grpo.group_size == 16
    assert plan.pod == reterm.pod and plan.aot.topology == "v5p-128"
    # GRPO rows are sft.length long (the stages' grpo.length), in micro-batches of 2 rows
    assert plan.shapes.grpo.to_dict() == {"rows": 160, "length": 65536, "micro_batches": 80}
    assert plan.shapes.sft.to_dict() == {"rows": 16, "length": 65536, "micro_batches": 8}
    assert plan.shapes.sampler.to_dict() == {"rows": 16, "prompt_len": 65536 - 8192,
                                             "new_tokens": 8192}
    assert set(aot.planned_steps(plan)) == {"sampler_prefill", "sampler_decode", "sft", "grpo"}


@pytest.mark.parametrize("recipe", ["terminal_rsi", "reterm"])
def test_termrl_aot_fits_the_recipes_paper_variant_on_its_own_topology(recipe):
    """The recipe's own paper config, the topology it names (no --topology), its sampler's decode
    step (the cheapest to compile; each recipe's docstring has every step on v5p-128): the shapes
    are the recipe's, the KV cache is split over fsdp x tensor, and the step fits the chip."""
    import importlib.util
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("LIBTPU IS NOT INSTALLED: the recipes' TPU compile is not checked "
                    "(`TR_AOT=1 bash launch/setup.sh` installs requirements-aot.txt)")
    from tr.models.config import get_model_config
    from tr.stages import pod_plan

    config = _experiment(recipe, "paper")
    plan = pod_plan.experiment_plan(config)
    result = termrl("aot", f"--config=experiments/{recipe}.py:paper", "--json",
                    "--steps=sampler_decode", timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert (report["topology"], report["chips"]) == ("v5p-128", 64)
    assert report["shapes"] == plan.shapes.to_dict() and list(report["steps"]) == ["sampler_decode"]
    model = get_model_config(plan.model.name)
    sampler = plan.shapes.sampler
    # keys and values [layers, rows, slots, kv heads, head_dim] in bf16, rows over fsdp (2 of the
    # 64 chips: 64 / (tensor 8 x context 4)) and kv heads over tensor (8)
    cache = 2 * model.n_layers * sampler.rows * (sampler.prompt_len + sampler.new_tokens) \
        * model.n_kv_heads * model.head_dim * 2 // (2 * 8)
    step = report["steps"]["sampler_decode"]
    assert cache <= step["argument_bytes"] <= cache + 2 * model.param_count()
    assert step["fits"] is True and step["total_bytes"] <= report["hbm_bytes"]


def test_termrl_aot_compiles_a_recipe_config(tmp_path):
    one_device = {k: v for k, v in ENV.items() if k != "XLA_FLAGS"}   # quick's 4 rows: one CPU
    result = termrl("aot", "--config=experiments/terminal_rsi.py:quick", "--topology=cpu", "--json",
                    "--steps=ppo", env=one_device)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert list(report["steps"]) == ["ppo"] and report["model"]["name"] == "gym"
    # quick: arrays 4 x 512, train.micro_batch_rows 2 -> 2 micro-batches
    assert report["shapes"]["ppo"] == {"rows": 4, "length": 512, "micro_batches": 2}
    assert report["steps"]["ppo"]["total_bytes"] > 0
    # python -m tr.train.aot is the same command: the same report
    module = subprocess.run([sys.executable, "-m", "tr.train.aot", "--config=experiments/terminal_rsi.py:quick",
                             "--topology=cpu", "--json", "--steps=ppo"], cwd=ROOT, env=one_device,
                            capture_output=True, text=True, timeout=900)
    assert module.returncode == 0, module.stderr[-3000:]
    assert json.loads(module.stdout) == report
    assert_one_line_error(termrl("aot", "--config=experiments/gae_demo.py", "--topology=cpu"),
                          "neither `shapes`")
    assert_one_line_error(subprocess.run(
        [sys.executable, "-m", "tr.train.aot", "--config=experiments/gae_demo.py", "--topology=cpu"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900), "neither `shapes`")
    assert_one_line_error(termrl("aot", "--config=experiments/terminal_rsi.py:quick",
                                 "--topology=v9z-3"), "termrl aot")
    # 4 rows over 8 fsdp devices: the step that cannot be laid out, named, in one line
    eight = {**one_device, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    bad = termrl("aot", "--config=experiments/terminal_rsi.py:quick", "--topology=cpu",
                 "--steps=ppo", env=eight)
    errors = [line for line in bad.stderr.splitlines() if not line.startswith("compiling ")]
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr[-2000:]
    assert len(errors) == 1 and errors[0].startswith("error: termrl aot: step ppo on cpu")
