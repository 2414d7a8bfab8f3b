"""``env.vectorize: envpool``: EnvPool's C++ envs behind the same sampler (rlrun/envs/envpool.py)."""

import numpy as np
import pytest

from rlrun.core.registry import RegistryError
from rlrun.envs.make import make_vector_env

from .conftest import run_cli, run_summary


def test_the_pool_seeds_on_reset_and_autoresets_on_the_next_step():
    env = make_vector_env("CartPole-v1", 4, vectorize="envpool")
    try:
        assert env.num_envs == 4 and env.single_observation_space.shape == (4,) and env.single_action_space.n == 2
        first, _ = env.reset(seed=3)
        again, _ = env.reset(seed=3)
        other, _ = env.reset(seed=4)
        np.testing.assert_array_equal(first, again)
        assert not np.array_equal(first, other)
        env.reset(seed=0)
        ones = np.ones(4, dtype=np.int64)  # always push right: every episode ends within ~10 steps
        ended = None
        for _ in range(40):
            obs, rew, term, _, info = env.step(ones)
            assert rew.dtype == np.float64 and info == {}
            if ended is not None:  # the step after an episode's end: gymnasium's next-step autoreset
                assert rew[ended] == 0.0 and not term[ended] and np.abs(obs[ended]).max() <= 0.05
                break
            if term.any():
                ended = int(np.flatnonzero(term)[0])
                assert abs(obs[ended][2]) > 0.2 or abs(obs[ended][0]) > 2.4  # the pole fell
        assert ended is not None
    finally:
        env.close()


def test_ids_envpool_lacks_and_bad_kwargs_are_one_line():
    with pytest.raises(RegistryError, match=r"envpool has no env 'Taxi-v4' \(did you mean 'Taxi-v3'\?\)"):
        make_vector_env("Taxi-v4", 2, vectorize="envpool")
    with pytest.raises(RegistryError, match=r"env.kwargs: envpool's CartPole-v1 rejected \{'bogus': 1\}"):
        make_vector_env("CartPole-v1", 2, {"bogus": 1}, vectorize="envpool")


@pytest.mark.parametrize(("args", "expect"), [
    (["env.id=Taxi-v4"], "env.vectorize: envpool has no env 'Taxi-v4'"),
    (["+env.kwargs.bogus=1"], "env.kwargs: envpool's CartPole-v1 rejected {'bogus': 1}"),
])
def test_the_cli_refuses_them_before_training(refuse, args, expect):
    p = refuse("+experiment=ppo_cartpole", "env.vectorize=envpool", "tracking=none", *args)
    assert p.returncode == 2, p.stderr[-2000:]
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("rlrun: error:")]
    assert len(errors) == 1 and expect in errors[0] and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "iter " not in p.stdout


@pytest.mark.slow
def test_ppo_cartpole_on_envpool_reaches_475(tmp_path):
    p = run_cli(["+experiment=ppo_cartpole", "env.vectorize=envpool", "seed=0", "tracking=none"], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = run_summary(p.stdout)
    assert summary["stopped"].startswith("rollout/episode_return_mean"), summary
    assert float(summary["final"]) >= 475 and int(summary["steps"].replace(",", "")) <= 150_000, summary
