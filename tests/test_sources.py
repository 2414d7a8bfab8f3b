"""The experience seam (rlrun/sources/source.py): a source registered by a plugin outside rlrun/ is
selected from YAML (``input=<name>``), built from a SourceContext and trains a real run."""

from pathlib import Path

import pytest

from rlrun.app.compose import compose
from rlrun.app.runner import run
from rlrun.config.offline import FILES, source_name
from rlrun.config.typed import ConfigError
from rlrun.sources.plugins import load_builtins

PLUGINS = Path(__file__).parent / "plugins"


def test_an_input_entry_names_its_source():
    load_builtins()
    assert source_name("minari:cartpole/expert-v0") == "minari"
    assert source_name("data/cartpole") == FILES


def test_a_plugin_source_trains_behaviour_cloning_to_the_target(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    cfg = compose(["+experiment=bc_cartpole", "input=fixed_transitions", "plugins=[fixed_source]", "tracking=none",
                   f"output_dir={tmp_path / 'run'}", "progress=false", "stop.timesteps_total=204800"])
    out = run(cfg, launch_dir=tmp_path)
    m = out.metrics
    assert m["offline/rows_read"] == m["training_iteration"] * cfg.algo.train_batch_size  # every row: the plugin's
    assert out.target_met and m["eval/episode_return_mean"] >= 475, m  # cloned from a controller that balances


def test_a_misspelled_source_is_refused_with_one_line_that_suggests_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(PLUGINS))
    with pytest.raises(ConfigError) as e:
        compose(["+experiment=bc_cartpole", "input=fixed_transitionz", "plugins=[fixed_source]", "tracking=none"])
    assert str(e.value).startswith("input: no such directory or file 'fixed_transitionz'")
    assert "did you mean 'fixed_transitions'?" in str(e.value) and "\n" not in str(e.value)


def test_the_sampler_and_a_plugin_source_mix_by_weight(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    cfg = compose(["+experiment=bc_cartpole", "input={sampler: 1, fixed_transitions: 3}", "plugins=[fixed_source]",
                   "tracking=none", f"output_dir={tmp_path / 'run'}", "progress=false", "stop.timesteps_total=4096",
                   "evaluation.interval=0"])
    m = run(cfg, launch_dir=tmp_path).metrics
    assert m["training_iteration"] == 2
    share = m["offline/rows_read"] / (2 * cfg.algo.train_batch_size)  # the plugin's share of the batches:
    assert 0.7 <= share <= 0.75, share  # 3/4, less what the workers' whole rounds took beyond their 1/4
    assert m["episodes_total"] > 0  # and the workers sampled the rest
