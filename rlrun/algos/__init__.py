"""Built-in algorithms: each module is a config schema + a registered loss + a postprocess fn + one
``register_algorithm(Algorithm(...))``. Importing this package registers them all."""

from rlrun.algos import a2c, appo, dqn, marwil, pg, ppo, sac, td3

__all__ = ["a2c", "appo", "dqn", "marwil", "pg", "ppo", "sac", "td3"]
