"""The estimators' and losses' jaxtyping annotations checked at run time (``typechecked``,
tests/conftest.py): each function accepts the arrays its callers pass, and refuses a float mask
where ``Bool[...]`` is declared, an integer reward where ``Float[...]`` is, and arguments whose
shared dimensions disagree."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import TypeCheckError

from tr.rl import advantages, losses

B, L = 4, 6


def arrays(seed=0):
    rng = np.random.default_rng(seed)
    f = lambda: jnp.asarray(rng.normal(size=(B, L)), jnp.float32)  # noqa: E731
    mask = jnp.asarray(rng.random((B, L)) < 0.7)
    return dict(f=f, mask=mask, turn_ids=jnp.asarray(np.cumsum(rng.random((B, L)) < 0.3, axis=1), jnp.int32),
                dones=jnp.zeros((B, L), bool).at[:, -1].set(True),
                group_ids=jnp.asarray([0, 0, 1, 1], jnp.int32), is_recovery=jnp.asarray([False, False, True, True]))


def calls():
    """(function, positional args, keyword args, name of its Bool mask argument) per checked function."""
    a = arrays()
    f, mask = a["f"], a["mask"]
    return [
        (advantages.tb_gae, (f(), f(), mask, a["turn_ids"], a["dones"]), dict(gamma_turn=0.9, lam_turn=0.8), 2),
        (advantages.token_gae, (f(), f(), mask, a["dones"]), dict(gamma=0.99, lam=0.95), 2),
        (advantages.grpo_row_advantages, (f(), mask), dict(group_size=2), 1),
        (advantages.explained_variance, (f(), f(), mask), {}, 2),
        (losses.ppo_policy_loss_terms, (f(), f(), f(), mask), {}, 3),
        (losses.ppo_policy_loss, (f(), f(), f(), mask), {}, 3),
        (losses.value_loss_terms, (f(), f(), f(), mask), {}, 3),
        (losses.value_loss, (f(), f(), f(), mask), {}, 3),
        (losses.sft_loss_terms, (f(), mask), {}, 1),
        (losses.sft_loss, (f(), mask), {}, 1),
        (losses.reterm_token_weights, (a["group_ids"], a["is_recovery"], mask), {}, 2),
    ]


IDS = [fn.__name__ for fn, *_ in calls()]


@pytest.mark.parametrize("index", range(len(IDS)), ids=IDS)
def test_checked_function_accepts_its_callers_arrays_and_gives_the_same_answer(typechecked, index):
    fn, args, kwargs, _ = calls()[index]
    got, want = typechecked(fn)(*args, **kwargs), fn(*args, **kwargs)
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), got, want)


@pytest.mark.parametrize("index", range(len(IDS)), ids=IDS)
def test_a_float_mask_is_refused(typechecked, index):
    fn, args, kwargs, at = calls()[index]
    args = list(args)
    args[at] = args[at].astype(jnp.float32)
    fn(*args, **kwargs)                                    # unchecked, the float mask passes
    with pytest.raises(TypeCheckError, match="Bool"):
        typechecked(fn)(*args, **kwargs)


def test_integer_rewards_and_disagreeing_shapes_are_refused(typechecked):
    a = arrays()
    f, mask = a["f"], a["mask"]
    tb_gae = typechecked(advantages.tb_gae)
    with pytest.raises(TypeCheckError, match="rewards"):
        tb_gae(jnp.ones((B, L), jnp.int32), f(), mask, a["turn_ids"], a["dones"], gamma_turn=0.9, lam_turn=0.8)
    with pytest.raises(TypeCheckError, match="values"):    # "b l" of rewards binds l = 6
        tb_gae(f(), jnp.zeros((B, L + 1), jnp.float32), mask, a["turn_ids"], a["dones"],
               gamma_turn=0.9, lam_turn=0.8)
    with pytest.raises(TypeCheckError, match="mask"):
        typechecked(losses.sft_loss)(f(), jnp.ones((B + 1, L), bool))
    with pytest.raises(TypeCheckError, match="group_ids"):
        typechecked(losses.reterm_token_weights)(jnp.zeros((B,), jnp.float32), a["is_recovery"], mask)
