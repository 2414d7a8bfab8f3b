import pytest
import torch

from rlrun.policy.optim import Adam


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize(("both", "counts"), [((True,) * 5, [5.0, 5.0]), ((True, False, True, True), [4.0, 3.0])],
                         ids=["every_step", "one_step_without_a_gradient"])
def test_matches_torch_adam(fused, both, counts):
    """The step counts share one tensor (one add_ when every parameter has a gradient); a parameter
    left without one in a step is not stepped and its count stays, as in torch.optim.Adam."""
    torch.manual_seed(0)
    a = [torch.randn(5, 3, requires_grad=True), torch.randn(3, requires_grad=True)]
    b = [t.detach().clone().requires_grad_(True) for t in a]
    ours = Adam(a, lr=1e-2, eps=1e-5)
    ours._fused = fused
    ref = torch.optim.Adam(b, lr=1e-2, eps=1e-5)
    for second in both:
        for params, opt in ((a, ours), (b, ref)):
            opt.zero_grad()
            (params[0].sum() ** 2 + ((params[1] ** 3).sum() if second else 0.0)).backward()
            opt.step()
    assert [float(s) for s in ours.steps] == counts
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def test_state_round_trip():
    p = [torch.randn(4, requires_grad=True)]
    opt = Adam(p, lr=0.1)
    p[0].sum().backward()
    opt.step()
    q = [p[0].detach().clone().requires_grad_(True)]
    opt2 = Adam(q, lr=0.5)
    opt2.load_state_dict(opt.state_dict())
    assert opt2.lr == 0.1 and float(opt2.steps[0]) == 1.0
    torch.testing.assert_close(opt2.exp_avg[0], opt.exp_avg[0])


def test_any_torch_optimizer_by_name_with_its_options(tmp_path):
    from rlrun.app.cli import compose
    from rlrun.app.runner import make_trainer_from

    cfg = compose(["+experiment=ppo_cartpole", "tracking=none", "algo.optimizer.name=SGD",
                   "+algo.optimizer.kwargs.momentum=0.9"], str(tmp_path))
    t = make_trainer_from(cfg, tmp_path)
    try:
        assert isinstance(t.policy.optimizer, torch.optim.SGD)
        t.train()
        group = t.policy.optimizer.param_groups[0]
        assert group["momentum"] == 0.9 and group["lr"] == pytest.approx(t.policy.current_lr())
    finally:
        t.stop()


@pytest.mark.parametrize(("override", "message"), [
    ("algo.optimizer.name=Adamm", "algo.optimizer.name: unknown optimizer 'Adamm' (did you mean 'Adam'?)"),
    ("+algo.optimizer.kwargs.momentun=0.9", "algo.optimizer.kwargs.momentun: optimizer 'adam' takes no 'momentun'"),
    ("+algo.optimizer.kwargs.lr=0.1", "(the learning rate is algo.lr)"),
])
def test_bad_optimizer_settings_are_refused_before_compute(override, message, refuse):
    p = refuse("+experiment=ppo_cartpole", "tracking=none", override)
    assert p.returncode == 2 and message in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
