"""The stage store: bitwise round trips, restore onto another mesh, handoff of actor and critic
between stages, the RSR critic guard, incomplete saves, and clear errors."""

import functools
import json
import shutil

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from tr.models import sharding as sharding_lib
from tr.models.config import get_model_config
from tr.models.critic import CriticModel
from tr.models.decoder import Decoder
from tr.train import checkpoint as ckpt
from tr.train.model_fns import nnx_model_fns
from tr.train.shardings import nnx_param_shardings, train_state_shardings
from tr.train.state import TrainState, abstract_state, create_train_state

OPT = optax.chain(optax.clip_by_global_norm(100.0), optax.adamw(1e-3))


def tiny_config():
    return get_model_config("tiny", n_layers=1, d_model=32, n_heads=2, n_kv_heads=1, head_dim=16,
                            d_ff=64, vocab_size=64)


@functools.lru_cache(maxsize=None)
def model_params(seed):
    actor = Decoder(tiny_config(), rngs=nnx.Rngs(seed))
    critic = CriticModel(tiny_config(), rngs=nnx.Rngs(seed + 100))
    fns = nnx_model_fns(actor, critic)
    return actor, critic, fns.actor_params, fns.critic_params


@jax.jit
def _one_update(params, opt_state, seed):
    grads = jax.tree.map(lambda p: jnp.sin(p * 3.0 + seed), params)
    updates, opt_state = OPT.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def trained_state(seed, *, with_critic=True, step=5):
    """A state whose optimizer moments are non-zero (one real update), at `step`."""
    _, _, actor_params, critic_params = model_params(seed)
    state = create_train_state(actor_params=actor_params, actor_optimizer=OPT,
                               critic_params=critic_params if with_critic else None,
                               critic_optimizer=OPT if with_critic else None, seed=seed)
    actor_params, actor_opt = _one_update(state.actor_params, state.actor_opt_state, seed)
    critic_params, critic_opt = (_one_update(state.critic_params, state.critic_opt_state, seed)
                                 if with_critic else (None, None))
    return state.replace(step=jnp.asarray(step, jnp.int32), actor_params=actor_params,
                         actor_opt_state=actor_opt, critic_params=critic_params,
                         critic_opt_state=critic_opt)


def assert_bitwise_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.tobytes() == y.tobytes()


def data_iterator():
    return iter(grain.MapDataset.range(1000).shuffle(seed=3).batch(4).to_iter_dataset())


def test_round_trip_is_bitwise_with_manifest_hashes_and_data_position(tmp_path):
    state = trained_state(0, step=7)
    it = data_iterator()
    for _ in range(3):
        next(it)
    with ckpt.StageStore(tmp_path, "rpr-1") as store:
        store.create(kind="rpr", config={"lr": 1e-3})
        assert store.save(state, it)
    expected_next = next(it)

    with ckpt.StageStore(tmp_path, "rpr-1") as store:   # a fresh manager, as after a restart
        assert store.latest_step() == 7
        resumed_it = data_iterator()
        restored = store.restore(abstract_state(state), data_iter=resumed_it)
        manifest = store.step_manifest()
    assert_bitwise_equal(restored, state)
    np.testing.assert_array_equal(next(resumed_it), expected_next)
    assert manifest["hashes"]["actor_params"] == ckpt.tree_hash(state.actor_params)
    assert manifest["hashes"]["critic_params"] == ckpt.tree_hash(state.critic_params)
    assert manifest["step"] == 7
    assert set(manifest["items"]) >= {"actor_params", "critic_opt_state", "data_iter", "train"}
    stage = json.loads((tmp_path / "rpr-1" / "stage.json").read_text())
    assert stage["config"] == {"lr": 1e-3} and stage["kind"] == "rpr"


def test_tree_hash_is_layout_independent_and_value_and_name_sensitive():
    _, _, params, _ = model_params(0)
    mesh = sharding_lib.make_mesh((1, 8, 1, 1))
    actor = Decoder(tiny_config(), rngs=nnx.Rngs(0))
    sharded = jax.device_put(params, nnx_param_shardings(actor, mesh))
    assert ckpt.tree_hash(sharded) == ckpt.tree_hash(params)
    leaf_path, leaf = jax.tree_util.tree_flatten_with_path(params)[0][0]
    bits = np.asarray(leaf).copy().view(np.uint32)
    bits.flat[0] ^= 1   # one bit of one parameter
    changed = jax.tree_util.tree_map_with_path(
        lambda p, x: jnp.asarray(bits.view(np.float32)) if p == leaf_path else x, params)
    assert ckpt.tree_hash(changed) != ckpt.tree_hash(params)
    assert ckpt.tree_hash({"a": jnp.ones(3)}) != ckpt.tree_hash({"b": jnp.ones(3)})
    assert ckpt.tree_hash(None) is None


def test_restore_onto_an_8_device_mesh(tmp_path):
    assert jax.device_count() == 8
    state = jax.device_put(trained_state(1), jax.devices()[0])
    with ckpt.StageStore(tmp_path, "s") as store:
        store.create(kind="sft")
        store.save(state)
    mesh = sharding_lib.make_mesh((2, 2, 2, 1))
    actor, critic, _, _ = model_params(1)
    shardings = train_state_shardings(
        state, mesh, actor_param_shardings=nnx_param_shardings(actor, mesh),
        critic_param_shardings=nnx_param_shardings(critic, mesh))
    with ckpt.StageStore(tmp_path, "s") as store:
        restored = store.restore(abstract_state(state, shardings))
    assert_bitwise_equal(jax.device_get(restored), jax.device_get(state))
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(shardings)):
        assert got.sharding == want
    assert any(not x.sharding.is_fully_replicated for x in jax.tree.leaves(restored.actor_params))
    mu = restored.actor_opt_state[1][0].mu
    assert any(not x.sharding.is_fully_replicated for x in jax.tree.leaves(mu))


@pytest.fixture
def two_parent_stages(tmp_path):
    """`warmup` (actor A0, critic C with optimizer) and `rsr-1` (a different actor A1, no critic)."""
    warmup = trained_state(10, step=3)
    rsr = trained_state(20, with_critic=False, step=8)
    with ckpt.StageStore(tmp_path, "warmup") as store:
        store.create(kind="critic_warmup")
        store.save(warmup)
    with ckpt.StageStore(tmp_path, "rsr-1") as store:
        store.create(kind="rsr")
        store.save(trained_state(21, with_critic=False, step=4))
        store.save(rsr)
    return tmp_path, warmup, rsr


def test_handoff_takes_actor_and_critic_from_different_stages(two_parent_stages):
    run, warmup, rsr = two_parent_stages
    target = abstract_state(warmup)
    state, store = ckpt.start_stage(
        run, "rpr-1", kind="rpr", target=target,
        actor=ckpt.Side(ckpt.StageRef("rsr-1"), OPT),
        critic=ckpt.Side(ckpt.StageRef("warmup"), OPT, restore_optimizer=True),
        config={"critic_optimizer": "restore"})
    store.close()
    assert_bitwise_equal(state.actor_params, rsr.actor_params)        # latest step (8) of rsr-1
    assert_bitwise_equal(state.critic_params, warmup.critic_params)
    assert_bitwise_equal(state.critic_opt_state, warmup.critic_opt_state)   # restored
    assert_bitwise_equal(state.actor_opt_state, OPT.init(rsr.actor_params))  # re-initialised
    assert int(state.step) == 0
    manifest = json.loads((run / "rpr-1" / "stage.json").read_text())
    assert manifest["parents"]["actor"] == {
        "stage": "rsr-1", "step": 8, "hash": ckpt.tree_hash(rsr.actor_params)}
    assert manifest["parents"]["critic"] == {
        "stage": "warmup", "step": 3, "hash": ckpt.tree_hash(warmup.critic_params)}
    assert manifest["optimizers"] == {"actor": "reinitialised", "critic": "restored"}
    # The handoff itself is checkpointed as step 0 of the new stage.
    with ckpt.StageStore(run, "rpr-1") as reopened:
        assert reopened.all_steps() == [0]


def test_handoff_with_fresh_critic_reinitialised_optimizer_or_no_critic(two_parent_stages):
    run, warmup, rsr = two_parent_stages
    _, _, _, fresh = model_params(99)
    state, store = ckpt.start_stage(
        run, "rpr-fresh", kind="rpr", target=abstract_state(warmup),
        actor=ckpt.Side(ckpt.StageRef("warmup"), OPT),
        critic=ckpt.Side(ckpt.FRESH, OPT, fresh_params=fresh))
    store.close()
    assert_bitwise_equal(state.critic_params, fresh)
    assert_bitwise_equal(state.critic_opt_state, OPT.init(fresh))
    assert_bitwise_equal(state.actor_params, warmup.actor_params)
    manifest = json.loads((run / "rpr-fresh" / "stage.json").read_text())
    assert manifest["parents"]["critic"] == {"fresh": True, "hash": ckpt.tree_hash(fresh)}

    state, store = ckpt.start_stage(
        run, "grpo-1", kind="grpo", target=abstract_state(warmup),
        actor=ckpt.Side(ckpt.StageRef("rsr-1", step=4), OPT), critic=ckpt.Side(None))
    store.close()
    assert state.critic_params is None and state.critic_opt_state is None
    assert_bitwise_equal(state.actor_params, trained_state(21, with_critic=False).actor_params)


def test_reopening_a_started_stage_resumes_instead_of_handing_off_again(two_parent_stages):
    run, warmup, _ = two_parent_stages
    kwargs = dict(kind="rpr", target=abstract_state(warmup),
                  actor=ckpt.Side(ckpt.StageRef("rsr-1"), OPT),
                  critic=ckpt.Side(ckpt.StageRef("warmup"), OPT))
    state, store = ckpt.start_stage(run, "rpr-1", **kwargs)
    advanced = state.replace(step=state.step + 2,
                             actor_params=jax.tree.map(lambda x: x + 1, state.actor_params))
    store.save(advanced)
    store.close()
    resumed, store = ckpt.start_stage(run, "rpr-1", **kwargs)
    store.close()
    assert int(resumed.step) == 2
    assert_bitwise_equal(resumed.actor_params, advanced.actor_params)


def test_rsr_stage_fails_loudly_when_the_critic_changes(two_parent_stages):
    run, warmup, _ = two_parent_stages
    state, store = ckpt.start_stage(
        run, "rsr-2", kind="rsr", target=abstract_state(warmup),
        actor=ckpt.Side(ckpt.StageRef("rsr-1"), OPT),
        critic=ckpt.Side(ckpt.StageRef("warmup"), None, frozen_hash=True))
    assert store.manifest["critic_hash_before"] == ckpt.tree_hash(warmup.critic_params)
    bumped = state.replace(step=state.step + 1, critic_params=jax.tree.map(
        lambda x: x.at[(0,) * x.ndim].add(1e-3) if x.ndim else x, state.critic_params))
    with pytest.raises(ckpt.CriticChangedError, match="rsr-2.*must leave the critic unchanged"):
        store.save(bumped)
    with pytest.raises(ckpt.CriticChangedError):
        store.finish(bumped)
    trained_actor = state.replace(step=state.step + 3,
                                  actor_params=jax.tree.map(lambda x: x * 2, state.actor_params))
    manifest = store.finish(trained_actor)
    store.close()
    assert manifest["critic_hash_after"] == manifest["critic_hash_before"]
    assert manifest["finished_step"] == 3
    assert json.loads((run / "rsr-2" / "stage.json").read_text())["critic_hash_after"] == \
        ckpt.tree_hash(warmup.critic_params)


def test_incomplete_save_is_invisible_and_cleaned_up(tmp_path):
    state = trained_state(2)
    with ckpt.StageStore(tmp_path, "s", async_save=False) as store:
        store.create(kind="sft")
        store.save(state.replace(step=jnp.asarray(1, jnp.int32)))
        store.save(state.replace(step=jnp.asarray(2, jnp.int32)))
    checkpoints = tmp_path / "s" / "checkpoints"
    # What a kill half-way through saving step 3 leaves: a temporary folder, partly written.
    partial = checkpoints / "3.orbax-checkpoint-tmp"
    shutil.copytree(checkpoints / "2", partial)
    shutil.rmtree(partial / "critic_params")
    with ckpt.StageStore(tmp_path, "s", read_only=True) as reader:   # a reader deletes nothing
        assert reader.latest_step() == 2
        with pytest.raises(ckpt.CheckpointError, match="read-only"):
            reader.save(state)
    assert partial.exists()
    with ckpt.StageStore(tmp_path, "s") as store:
        assert store.latest_step() == 2
        restored = store.restore(abstract_state(state))
    assert not partial.exists()
    assert int(restored.step) == 2


def test_bad_requests_name_the_fault(tmp_path):
    with pytest.raises(ValueError, match="stage name '../x'"):
        ckpt.StageStore(tmp_path, "../x")
    state = trained_state(3, with_critic=False)
    with ckpt.StageStore(tmp_path, "s") as store:
        with pytest.raises(ckpt.CheckpointError, match="has no complete checkpoint"):
            store.restore(abstract_state(state))
        store.create(kind="sft", config={"lr": 1.0})
        with pytest.raises(ckpt.CheckpointError, match="already exists with config"):
            store.create(kind="sft", config={"lr": 2.0})
        store.save(state)
        store.wait()
        with pytest.raises(ckpt.CheckpointError, match=r"no complete checkpoint for step 9 "
                                                        r"\(complete steps: \[5\]\)"):
            store.restore(abstract_state(state), step=9)
        with_critic = abstract_state(trained_state(3))
        with pytest.raises(ckpt.CheckpointError, match="asks for \\['critic_opt_state', "
                                                       "'critic_params'\\]"):
            store.restore(with_critic)
    (tmp_path / "s" / "stage.json").write_text("{not json")
    with pytest.raises(ckpt.CheckpointError, match="stage.json: not valid JSON"):
        ckpt.StageStore(tmp_path, "s").manifest
    with pytest.raises(ValueError, match="critic's source must be a StageRef, FRESH or None"):
        ckpt.start_stage(tmp_path, "t", kind="rpr", target=abstract_state(state),
                         critic=ckpt.Side("warmup"))


def test_train_state_is_a_pytree_of_arrays_only():
    state = trained_state(4)
    assert isinstance(state, TrainState)
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(state))
    assert state.rng.dtype == jnp.uint32


def test_handoff_refuses_params_that_do_not_match_their_recorded_hash(two_parent_stages):
    run, warmup, _ = two_parent_stages
    manifest_file = run / "warmup" / "checkpoints" / "3" / "manifest" / "metadata"
    manifest = json.loads(manifest_file.read_text())
    manifest["hashes"]["critic_params"] = "0" * 64   # as if the arrays on disk had changed
    manifest_file.write_text(json.dumps(manifest))
    with pytest.raises(ckpt.CheckpointError, match="restored critic_params hash .* differs"):
        ckpt.start_stage(run, "rpr-x", kind="rpr", target=abstract_state(warmup),
                         actor=ckpt.Side(ckpt.StageRef("rsr-1")),
                         critic=ckpt.Side(ckpt.StageRef("warmup")))
