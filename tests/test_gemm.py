"""The hand-derived updates' products (rlrun/models/gemm.py): oneDNN's equal torch's BLAS's to float32 rounding
in every layout the updates use, above and below the size where they switch; ``auto``'s choice; the SAC and TD3
hand-derived gradients on oneDNN against autograd's, SAC's eager and compiled by inductor; a run records the backend
it chose."""

from __future__ import annotations

import pytest
import torch

from rlrun.algos.sac import sac_hand_stages
from rlrun.config.typed import ConfigError
from rlrun.models import gemm
from rlrun.models.twin_q_compiled import CompiledTwinQGrad
from tests.test_td3_grad import assert_the_hand_gradient_equals_autograds as assert_td3_hand_equals_autograd
from tests.test_td3_grad import policy as td3_policy
from tests.test_twin_q_grad import assert_the_hand_stages_equal_autograds
from tests.test_twin_q_grad import policy as sac_policy


@pytest.fixture
def onednn(monkeypatch):
    """oneDNN for the test's products; yields the list of the shapes oneDNN multiplied (``x`` of ``x @ w.T``)."""
    calls: list[tuple[int, ...]] = []
    real = gemm._pointwise  # what every oneDNN product calls, eager or from a compiled graph's operator
    monkeypatch.setattr(gemm, "_pointwise", lambda x, w, b, r: calls.append(tuple(x.shape)) or real(x, w, b, r))
    gemm.set_backend("onednn")
    yield calls
    gemm.set_backend("blas")


def rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


SIZES = [(256, 256, 256), (64, 256, 400), (256, 17, 256), (8, 32, 16)]  # the last two under ONEDNN_MIN_MACS


@pytest.mark.parametrize(("m", "k", "n"), SIZES)
def test_onednn_products_equal_torchs_in_every_layout_the_updates_use(onednn, m, k, n):
    a, b, bias = rand(m, k, seed=0), rand(k, n, seed=1), rand(n, seed=2)
    close = {"rtol": 1e-5, "atol": 1e-4}
    torch.testing.assert_close(gemm.mm(a, b), a @ b, **close)
    torch.testing.assert_close(gemm.mm(a.t().contiguous().t(), b.t().contiguous().t()), a @ b, **close)  # views
    out = torch.full((m, n), float("nan"))
    assert gemm.mm(a, b, out=out) is out
    torch.testing.assert_close(out, a @ b, **close)
    for relu, act in ((True, torch.relu), (False, torch.tanh), (None, lambda x: x)):
        torch.testing.assert_close(gemm.addmm_act(bias, a, b, relu), act(torch.addmm(bias, a, b)), **close)
    a3, b3, bias3 = torch.stack([a, 2 * a]), torch.stack([b, -b]), torch.stack([bias, bias]).unsqueeze(1)
    torch.testing.assert_close(gemm.bmm(a3, b3), torch.bmm(a3, b3), **close)
    torch.testing.assert_close(gemm.bmm(a3.transpose(1, 2).contiguous().transpose(1, 2), b3), torch.bmm(a3, b3),
                               **close)
    for relu, act in ((True, torch.relu), (False, torch.tanh)):
        out3 = torch.full((2, m, n), float("nan"))
        assert gemm.baddbmm_act(bias3, a3, b3, relu, out3) is out3
        torch.testing.assert_close(out3, act(torch.baddbmm(bias3, a3, b3)), **close)


def test_a_large_product_goes_to_onednn_and_a_small_one_stays_with_blas(onednn):
    calls = onednn
    gemm.mm(rand(256, 256, seed=0), rand(256, 256, seed=1))
    gemm.mm(rand(256, 17, seed=0), rand(17, 256, seed=1))
    assert calls == [(256, 256)]
    gemm.set_backend("blas")
    gemm.mm(rand(256, 256, seed=0), rand(256, 256, seed=1))
    assert calls == [(256, 256)]


@pytest.mark.parametrize(("vendor", "capability", "precision", "chosen"), [
    ("AuthenticAMD", "AVX512", "highest", "onednn"), ("AuthenticAMD", "AVX512", "high", "onednn"),
    ("AuthenticAMD", "AVX512", "medium", "blas"), ("AuthenticAMD", "AVX2", "highest", "blas"),
    ("GenuineIntel", "AVX512", "highest", "blas"), ("", "AVX512", "highest", "blas")])
def test_auto_takes_onednn_on_amd_cpus_with_avx512_in_float32_only(monkeypatch, vendor, capability, precision,
                                                                   chosen):
    """``medium`` lets torch's own products run in bfloat16, which oneDNN's float32 products would not."""
    monkeypatch.setattr(gemm, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    try:
        assert gemm.set_backend("auto", precision) == chosen == gemm.backend()
    finally:
        gemm.set_backend("blas")


def test_onednn_where_torch_has_none_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(gemm, "onednn_available", lambda: False)
    with pytest.raises(ConfigError, match="torch_matmul_backend: onednn, but this torch build has no oneDNN"):
        gemm.set_backend("onednn")
    assert gemm.set_backend("auto") == "blas"


WIDE = ([256, 256], [256, 256])  # 64 rows x 256 x 256: over ONEDNN_MIN_MACS, so these go to oneDNN


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_sacs_hand_gradient_on_onednn_equals_autograds(onednn, activation):
    assert_the_hand_stages_equal_autograds(sac_policy(True, activation=activation, hiddens=WIDE), rtol=1e-4,
                                           atol=1e-5)
    assert len(onednn) >= 10  # the critics' and the actor's 256-wide products, forward and backward


def test_td3s_hand_gradient_on_onednn_equals_autograds(onednn):
    assert_td3_hand_equals_autograd(td3_policy(True, hiddens=WIDE), rtol=1e-4, atol=1e-5)
    assert len(onednn) >= 10


def test_sacs_update_for_the_compiler_on_onednn_run_eagerly_equals_autograds(onednn):
    """``algo.compile_update``'s two stages (rlrun/models/twin_q_compiled.py) take their products from here too."""
    p = sac_policy(True, hiddens=WIDE)
    p.hand_gradient = sac_hand_stages(p, CompiledTwinQGrad(p.model, p.state.target_model, compile=False))
    assert_the_hand_stages_equal_autograds(p, rtol=1e-4, atol=1e-5)
    assert len(onednn) >= 10


@pytest.mark.slow  # ~35 s of compiling
def test_sacs_update_compiled_by_inductor_calls_onednn_and_equals_autograds(onednn):
    """Inductor lowers oneDNN's product only for weights it froze: the compiled graph calls it through rlrun's own
    operator (``rlrun::onednn_linear``), at every update."""
    p = sac_policy(True, compile_update=True, hiddens=WIDE)
    cells = [c.cell_contents for c in p.hand_gradient[0].__closure__ or ()]  # type: ignore[index, union-attr]
    assert any(isinstance(c, CompiledTwinQGrad) for c in cells)
    assert_the_hand_stages_equal_autograds(p, rtol=1e-4, atol=5e-5)  # the fused loops' ulp (test_twin_q_compiled)
    first = len(onednn)
    assert first >= 10
    assert_the_hand_stages_equal_autograds(p, rtol=1e-4, atol=5e-5)
    assert len(onednn) >= 2 * first  # the cached compiled graph calls oneDNN again at the next update


def test_a_run_records_the_backend_auto_chose(tmp_path, monkeypatch):
    from rlrun.app.runner import make_trainer

    # auto chooses oneDNN here on any CPU (sac_pendulum's 64-wide products stay with torch's BLAS all the same)
    monkeypatch.setattr(gemm, "cpu_vendor", lambda: "AuthenticAMD")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(gemm, "onednn_available", lambda: True)
    try:
        tr = make_trainer(["+experiment=sac_pendulum", "tracking=none", "progress=false"], tmp_path)
        assert tr.cfg.torch_matmul_backend == "onednn" == gemm.backend()
        tr = make_trainer(["+experiment=sac_pendulum", "tracking=none", "progress=false",
                           "torch_matmul_precision=medium"], tmp_path)
        assert tr.cfg.torch_matmul_backend == "blas" == gemm.backend()
        tr = make_trainer(["+experiment=sac_pendulum", "tracking=none", "progress=false",  # precision back to highest
                           "torch_matmul_backend=blas"], tmp_path)
        assert tr.cfg.torch_matmul_backend == "blas" == gemm.backend()
    finally:
        gemm.set_backend("blas")
