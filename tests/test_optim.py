import pytest
import torch

from rlrun.optim import Adam


@pytest.mark.parametrize("fused", [True, False])
def test_matches_torch_adam(fused):
    torch.manual_seed(0)
    a = [torch.randn(5, 3, requires_grad=True), torch.randn(3, requires_grad=True)]
    b = [t.detach().clone().requires_grad_(True) for t in a]
    ours = Adam(a, lr=1e-2, eps=1e-5)
    ours._fused = fused
    ref = torch.optim.Adam(b, lr=1e-2, eps=1e-5)
    for _ in range(5):
        for params, opt in ((a, ours), (b, ref)):
            opt.zero_grad()
            (params[0].sum() ** 2 + (params[1] ** 3).sum()).backward()
            opt.step()
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
