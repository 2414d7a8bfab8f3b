"""SAC's hand-derived update compiled by torch.compile (rlrun/models/twin_q_compiled.py, ``algo.compile_update``):
its two stages, run eagerly, against autograd for every option the eager hand gradient covers; compiled for
real by inductor, against autograd and over a learn call; the set-ups it refuses."""

from __future__ import annotations

import pytest

from rlrun.algos.sac import sac_hand_stages
from rlrun.models.twin_q_compiled import CompiledTwinQGrad
from tests.conftest import run_cli
from tests.test_twin_q_grad import CASES, assert_a_learn_call_agrees, assert_the_hand_stages_equal_autograds, policy


@pytest.mark.parametrize(("activation", "alpha", "num_critics", "hiddens"), CASES)
def test_the_compiled_stages_run_eagerly_equal_autograds(activation, alpha, num_critics, hiddens):
    p = policy(True, activation=activation, alpha=alpha, num_critics=num_critics, hiddens=hiddens)
    p.hand_gradient = sac_hand_stages(p, CompiledTwinQGrad(p.model, p.state.target_model, compile=False))
    assert_the_hand_stages_equal_autograds(p)


@pytest.mark.slow  # ~35 s of compiling
def test_the_update_compiled_by_inductor_equals_autograds_and_learns_as_the_eager_one():
    """Compiled for real (a C++ compiler, inductor's cache in the suite's temp dir): each stage's gradients
    against autograd's, then 256 updates of a learn call against the eager hand gradient's."""
    p = policy(True, compile_update=True)
    assert isinstance(p.hand_gradient, tuple)
    cells = [c.cell_contents for c in p.hand_gradient[0].__closure__ or ()]  # the stages close over their grad
    assert any(isinstance(c, CompiledTwinQGrad) for c in cells)
    # the actor's gradients to 5e-5 of their ~0.4 scale: where the case saturates an action, 2a / (1 - a^2 + 1e-6)
    # is ~1e6 and the fused loop rounds it an ulp away from the eager kernels (the critics' agree to 3e-7)
    assert_the_hand_stages_equal_autograds(p, atol=5e-5)
    assert_a_learn_call_agrees(policy(True, compile_update=True, seed=1), policy(True, seed=1), 256)


@pytest.mark.parametrize(("overrides", "env", "says"), [
    (["algo.hand_gradient=false"], {}, "algo.compile_update: true compiles the hand-derived update"),
    (["model.activation=elu"], {}, "algo.compile_update: true compiles the hand-derived update"),
    ([], {"CXX": "no-such-cxx"}, "algo.compile_update: torch.compile needs a C++ compiler and 'no-such-cxx'"),
])
def test_set_ups_it_cannot_compile_get_one_line(overrides, env, says, refuse, monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    p = refuse("+experiment=sac_pendulum", "tracking=none", "algo.compile_update=true", *overrides)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], p.stderr


def test_a_compiler_that_fails_stops_the_run_with_one_line(tmp_path):
    """``CXX`` names a program that exists but compiles nothing: the first update says so, exit 2."""
    p = run_cli(["+experiment=sac_pendulum", "tracking=none", "progress=false", "algo.compile_update=true",
                 "algo.learning_starts=64", "stop.timesteps_total=256", f"output_dir={tmp_path}/out"], tmp_path,
                env={"CXX": "false"})
    assert p.returncode == 2, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlrun: error: algo.compile_update: torch.compile could not "
                                                   "compile SAC's update (InductorError: InvalidCxxCompiler"), lines
