"""Worker kinds (rlrun/sources/worker_kinds.py): the WORKERS registry picks a run's worker class, and a
plugin outside rlrun/ adds a kind that a training run then uses, with no change inside rlrun/."""

import sys
from pathlib import Path

from rlrun.app.compose import compose
from rlrun.app.runner import run
from rlrun.core.registry import ENVS, WORKERS
from rlrun.sources.plugins import load_builtins
from rlrun.sources.worker_kinds import worker_kind

PLUGINS = Path(__file__).parent / "plugins"


def test_each_built_in_kind_takes_its_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    load_builtins()
    assert worker_kind(compose(["+experiment=ppo_cartpole", "tracking=none"])) == "env"
    ma = compose(["+experiment=ppo_multi_cartpole", "tracking=none"])
    assert worker_kind(ma) == worker_kind(ma, local=True) == "env"  # one sampling loop for both
    served = compose(["+experiment=ppo_cartpole", "rollout=server", "tracking=none"])
    assert worker_kind(served) == worker_kind(served, local=True) == "server"
    on_ray = compose(["+experiment=ppo_cartpole", "rollout=server", "rollout.num_workers=2", "tracking=none"])
    assert (worker_kind(on_ray), worker_kind(on_ray, local=True)) == ("server", "spaces_only")
    assert set(WORKERS.names()) >= {"env", "server", "spaces_only"}


def test_a_plugin_worker_kind_samples_a_training_run(tmp_path, monkeypatch):
    for registry in (WORKERS, ENVS):  # the plugin's kind and env leave with the test
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.delitem(sys.modules, "counting_worker", raising=False)
    cfg = compose(["+experiment=ppo_cartpole", "env.id=CountingCartPole", "plugins=[counting_worker]",
                   "tracking=none", f"output_dir={tmp_path / 'run'}", "progress=false", "stop.training_iteration=3",
                   "evaluation.interval=0"])
    assert worker_kind(cfg) == "counting"
    out = run(cfg, launch_dir=tmp_path)
    sampled = sys.modules["counting_worker"].SAMPLED
    assert out.metrics["training_iteration"] == 3 and out.metrics["episodes_total"] > 0
    assert sampled and sampled[-1] >= 3, sampled  # the run's local worker was the plugin's, and it sampled
