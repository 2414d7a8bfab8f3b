"""A plugin experience source, written against rlrun's public surface only: it replays a fixed list
of CartPole transitions (recorded once, at construction, from a scripted controller that balances the
pole) in order, forever. ``input=fixed_transitions`` selects it; ``bc_cartpole`` learns from it.
"""

import gymnasium as gym
import numpy as np

from rlrun import SOURCES, SampleBatch, concat_samples, postprocess_episodes

SB = SampleBatch


def controller(obs: np.ndarray) -> int:
    """Push towards where the pole falls: balances CartPole-v1 for its 500 steps."""
    return int(obs[2] + 0.5 * obs[3] > 0)


def record(env_id: str, episodes: int, seed: int, noise: float = 0.2) -> SampleBatch:
    """``episodes`` episodes of the controller, which takes a random action with probability ``noise``
    (so the data also shows how to recover); the labels are the controller's own actions."""
    env = gym.make(env_id)
    rng = np.random.default_rng(seed)
    rows: dict[str, list] = {k: [] for k in (SB.OBS, SB.ACTIONS, SB.REWARDS, SB.TERMINATEDS, SB.TRUNCATEDS,
                                              SB.EPS_ID, SB.NEXT_OBS)}
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        done = False
        while not done:
            action = controller(obs)
            nxt, reward, term, trunc, _ = env.step(int(rng.integers(2)) if rng.random() < noise else action)
            for k, v in ((SB.OBS, obs), (SB.ACTIONS, action), (SB.REWARDS, reward), (SB.TERMINATEDS, term),
                         (SB.TRUNCATEDS, trunc), (SB.EPS_ID, ep), (SB.NEXT_OBS, nxt)):
                rows[k].append(v)
            obs, done = nxt, term or trunc
    dtypes = {SB.OBS: np.float32, SB.NEXT_OBS: np.float32, SB.ACTIONS: np.int64, SB.REWARDS: np.float32,
              SB.TERMINATEDS: bool, SB.TRUNCATEDS: bool, SB.EPS_ID: np.int64}
    return SampleBatch({k: np.asarray(v, dtype=dtypes[k]) for k, v in rows.items()})


@SOURCES.register("fixed_transitions")
class FixedTransitions:
    def __init__(self, ctx):
        self.policy = ctx.policy
        self.data = record(ctx.cfg.env.id, episodes=8, seed=ctx.seed)
        self.pos = 0
        self.served = 0

    def next_batch(self, rows: int) -> SampleBatch:
        take = (self.pos + np.arange(rows)) % len(self.data)
        self.pos = int(take[-1] + 1) % len(self.data)
        pieces = np.split(take, np.flatnonzero(np.diff(take) != 1) + 1)  # a wrap-around starts a new piece
        out = [postprocess_episodes(self.policy, self.data.slice(slice(p[0], p[-1] + 1))) for p in pieces]
        self.served += rows
        return out[0] if len(out) == 1 else concat_samples(out)

    def metrics(self) -> dict[str, float]:
        return {"offline/rows_read": float(self.served)}
