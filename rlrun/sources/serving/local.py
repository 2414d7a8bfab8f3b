"""One action of a policy for one observation, and its log-probability and value: how the policy
server acts for its clients, and how a client's local copy (``rlrun/app/client_local.py``) acts."""

from __future__ import annotations

from typing import Any

import numpy as np


def act_one(policy: Any, obs: np.ndarray, action: Any = None, explore: bool = True) -> tuple[Any, float, float,
                                                                                            np.ndarray]:
    """One observation through a Policy: (action, logp, V(s), dist inputs); with ``action`` given (the
    client chose it), that action's log-probability. The server's and the local client's torch path."""
    out = policy.compute_actions(obs[None], explore, [])
    if action is None:
        return out.actions[0], float(out.logp[0]), float(out.values[0]), out.dist_inputs[0]
    logp = policy.logp_of(out.dist_inputs, np.asarray(action)[None])
    return action, float(logp[0]), float(out.values[0]), out.dist_inputs[0]
