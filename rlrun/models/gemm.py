"""The matrix products of the hand-derived updates (``mlp_grad``'s torso, ``twin_q_grad``, ``td3_grad``,
``q_mlp_grad``, ``c51_grad``): torch's BLAS (MKL in torch's x86 wheels) or oneDNN (the copy inside torch,
``torch.ops.mkldnn._linear_pointwise``), chosen once per run by ``torch_matmul_backend`` (``set_backend``).

Why: MKL picks its kernels by CPU vendor, and on an AMD CPU with AVX-512 it runs its AVX2 ones; oneDNN
picks by instruction set. On a 2-core AMD EPYC (Zen 5, 2026-12-07, two threads) a 256x256x256 product took
163 us in MKL and 83 us in oneDNN, a 256x400x300 one 295 and 143 us, and a round of ``sac_halfcheetah``
(one env step, one update) 3.64 ms against 4.41 ms (0.79-0.94x over the session; experiments/continuous_control).
Both compute in float32 (they round differently, as two BLAS libraries do). Small products stay with torch's BLAS:
oneDNN's call costs ~15 us (256x64x64: 13 us in MKL, 16 us in oneDNN), hence ``ONEDNN_MIN_MACS``. Without AVX-512
(a Zen 3 EPYC, 2026-12-08, two threads) MKL is the faster: 224 against 267 us for 256x256x256, so ``auto`` keeps it.
Autograd's products (``nn.Linear``) are torch's as always; only the hand-derived updates call these (SAC's compiled
by ``torch.compile`` too, ``twin_q_compiled``: oneDNN's product is then an operator of rlrun's own,
``rlrun::onednn_linear``).
"""

from __future__ import annotations

import torch

from rlrun.config.typed import ConfigError

BACKENDS = ("auto", "blas", "onednn")
ONEDNN_MIN_MACS = 1 << 21  # below 2M multiply-adds (256x64x128) a product stays with torch's BLAS

_onednn = False  # set_backend's choice for this process


def cpu_vendor() -> str:
    """The CPU's vendor string (``AuthenticAMD``, ``GenuineIntel``) where Linux says it, else ''."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def auto_backend(precision: str = "highest") -> str:
    """``auto``'s choice on this machine: oneDNN on an AMD CPU with AVX-512 (where it was measured twice as
    fast as MKL's AVX2 kernels), torch's BLAS elsewhere (its products are MKL's own AVX-512 ones on Intel), and
    torch's own products under ``torch_matmul_precision: medium``, which lets them run in bfloat16 (oneDNN's
    float32 ``_linear_pointwise`` would not; torch routes them to oneDNN itself then: a 256x256x256 ``torch.mm``
    took 83 us under ``medium`` on the Zen 5 above, 163 us under ``highest``)."""
    avx512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    amd = onednn_available() and avx512 and cpu_vendor() == "AuthenticAMD"
    return "onednn" if amd and precision != "medium" else "blas"


def onednn_available() -> bool:
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def set_backend(name: str, precision: str = "highest") -> str:
    """Use ``name`` (``BACKENDS``; ``auto``: ``auto_backend(precision)``, ``precision`` the run's
    ``torch_matmul_precision``) for this process's hand-derived products; returns the one chosen (``blas`` or
    ``onednn``)."""
    global _onednn
    chosen = auto_backend(precision) if name == "auto" else name
    if chosen == "onednn" and not onednn_available():
        raise ConfigError("torch_matmul_backend: onednn, but this torch build has no oneDNN "
                         "(torch.backends.mkldnn.is_available() is False); use blas or auto")
    _onednn = chosen == "onednn"
    return chosen


def backend() -> str:
    return "onednn" if _onednn else "blas"


def _dnn(m: int, k: int, n: int) -> bool:
    return _onednn and m * k * n >= ONEDNN_MIN_MACS


def _pointwise(x: torch.Tensor, w_t: torch.Tensor, bias: torch.Tensor | None, relu: bool) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w_t, bias, "relu" if relu else "none", [None] if relu else [], "")


# The same product as an operator of rlrun's own for a graph torch.compile traces (``twin_q_compiled``): inductor
# lowers mkldnn._linear_pointwise only for weights it has frozen as constants, and this one stays an opaque call
_LIB = torch.library.Library("rlrun", "FRAGMENT")
_LIB.define("onednn_linear(Tensor x, Tensor w_t, Tensor? bias, bool relu) -> Tensor")
_LIB.impl("onednn_linear", lambda x, w_t, bias, relu: _pointwise(x, w_t, bias, relu), "CPU")
_LIB.impl("onednn_linear", lambda x, w_t, bias, relu: x.new_empty((x.shape[0], w_t.shape[0])), "Meta")


def _linear(x: torch.Tensor, w_t: torch.Tensor, bias: torch.Tensor | None, relu: bool) -> torch.Tensor:
    """oneDNN's ``x @ w_t.T (+ bias)``, ReLU'd in the same pass when ``relu`` (``w_t``: ``[N, K]``; ``bias``: ``N``
    values in any shape)."""
    b = None if bias is None else bias.reshape(-1)
    if torch.compiler.is_compiling():
        return torch.ops.rlrun.onednn_linear(x, w_t, b, relu)
    return _pointwise(x, w_t, b, relu)


def mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b`` (``[M, K] @ [K, N]``), into ``out`` where given."""
    if _dnn(a.shape[0], a.shape[1], b.shape[1]):
        y = _linear(a, b.t(), None, False)
        return y if out is None else out.copy_(y)
    return torch.mm(a, b) if out is None else torch.mm(a, b, out=out)


def addmm_act(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, relu: bool | None,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """``act(bias + a @ b)``, ``act`` ReLU (``relu`` True), tanh (False) or none (None); in ``out`` where given
    on torch's BLAS, in a tensor of oneDNN's own otherwise (its op has no ``out``, and an MLP torso's activations
    are read through what this returns, not through the buffer)."""
    if _dnn(a.shape[0], a.shape[1], b.shape[1]):
        y = _linear(a, b.t(), bias, relu is True)
        return y.tanh_() if relu is False else y
    y = torch.addmm(bias, a, b) if out is None else torch.addmm(bias, a, b, out=out)
    return y if relu is None else y.relu_() if relu else y.tanh_()


def _each(bias: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, relu: bool, out: torch.Tensor | None
          ) -> torch.Tensor:
    """oneDNN's ``bias + a[c] @ b[c]`` (ReLU'd when ``relu``) for each ``c``, into ``out[c]``: it has no batched
    product, and the callers' stacked buffers are what the rest of the update reads; stacked into a new tensor
    without ``out`` (a compiled graph's)."""
    ys = (_linear(a[c], b[c].t(), None if bias is None else bias[c], relu) for c in range(a.shape[0]))
    if out is None:
        return torch.stack(list(ys))
    for c, y in enumerate(ys):
        out[c] = y
    return out


def bmm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b`` batched (``[C, M, K] @ [C, K, N]``), into ``out`` where given."""
    if _dnn(a.shape[1], a.shape[2], b.shape[2]):
        return _each(None, a, b, False, out)
    return torch.bmm(a, b) if out is None else torch.bmm(a, b, out=out)


def baddbmm_act(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, relu: bool, out: torch.Tensor | None = None
                ) -> torch.Tensor:
    """``act(bias + a @ b)`` batched (``bias [C, 1, N]``), ReLU or tanh, into ``out`` where given."""
    if _dnn(a.shape[1], a.shape[2], b.shape[2]):
        g = _each(bias, a, b, relu, out)  # the ReLU fused into oneDNN's pass
        return g if relu else g.tanh_()
    g = torch.baddbmm(bias, a, b) if out is None else torch.baddbmm(bias, a, b, out=out)
    return g.relu_() if relu else g.tanh_()
