"""MLflow models from actors the trainer traced (``rlrun/training/export.py: save_actors``), logged by
the writer process without importing torch.

The model is the one ``mlflow.pytorch`` would log for the TorchScript module (the ``pytorch`` and
``python_function`` flavors, ``data/model.pth``, signature, input example, pinned requirements), so
``mlflow.pyfunc.load_model`` and ``mlflow.pytorch.load_model`` load it as before. Writing the files
here instead of calling ``mlflow.pytorch.save_model`` keeps torch (1.6 s) and mlflow.pytorch out of
the writer: measured on this 2-core machine, the writer's imports were the last thing between the end
of training and a complete MLflow record.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from rlrun.core.actor_files import ACTOR_FILE, EXAMPLE_FILE, META_FILE

PICKLE_MODULE = "mlflow.pytorch.pickle_module"  # what mlflow.pytorch records for a TorchScript model


def log_saved_actors(tracking_uri: str, run_id: str, actors_dir: str | Path) -> list[str]:
    """Log every actor under ``actors_dir`` (in model order) to run ``run_id``; returns the model URIs."""
    import mlflow
    from mlflow.models import Model, infer_signature

    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment(experiment_id=mlflow.MlflowClient().get_run(run_id).info.experiment_id)
    uris = []
    for d in sorted(p for p in Path(actors_dir).iterdir() if p.is_dir()):
        meta = json.loads((d / META_FILE).read_text())
        with np.load(d / EXAMPLE_FILE) as ex:
            example, out = ex["input"], ex["output"]
        Model.log(artifact_path=None, name=meta["name"], flavor=TORCHSCRIPT_FILES, run_id=run_id, actor_dir=str(d),
                  torch_version=meta["torch_version"], input_example=example, signature=infer_signature(example, out),
                  pip_requirements=[f"torch=={meta['torch_version'].split('+')[0]}", f"mlflow=={mlflow.__version__}"],
                  metadata=meta["metadata"], validate_serving_input=False)  # validating would load torch
        uris.append(f"runs:/{run_id}/{meta['name']}")
    return uris


def _save_model(path: str, mlflow_model: Any, actor_dir: str, torch_version: str, input_example: Any,
            signature: Any, pip_requirements: list[str], **_: Any) -> None:
    """Lay out a saved TorchScript actor as ``mlflow.pytorch.save_model`` does for a ScriptModule."""
    import yaml
    from mlflow import pyfunc
    from mlflow.models.utils import _save_example
    from mlflow.utils.environment import _mlflow_conda_env, _PythonEnv

    os.makedirs(path, exist_ok=True)
    _save_example(mlflow_model, input_example, path)
    mlflow_model.signature = signature
    data = Path(path) / "data"
    data.mkdir()
    shutil.copyfile(Path(actor_dir) / ACTOR_FILE, data / "model.pth")
    (data / "pickle_module_info.txt").write_text(PICKLE_MODULE)
    mlflow_model.add_flavor("pytorch", model_data="data", pytorch_version=torch_version, code=None)
    pyfunc.add_to_model(mlflow_model, loader_module="mlflow.pytorch", data="data", pickle_module_name=PICKLE_MODULE,
                        code=None, conda_env="conda.yaml", python_env="python_env.yaml",
                        model_config={"device": None})
    mlflow_model.model_size_bytes = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
    mlflow_model.save(os.path.join(path, "MLmodel"))
    # the requirements pin the versions this process runs (mlflow's; torch's from the trainer), so
    # MLflow's _process_pip_requirements, whose check of them against the installed packages builds a
    # map of every distribution (0.43 s of CPU per run here, 2026-11-26), has nothing to find
    conda_env = _mlflow_conda_env(additional_pip_deps=pip_requirements, install_mlflow=False)
    with open(os.path.join(path, "conda.yaml"), "w") as f:
        yaml.safe_dump(conda_env, stream=f, default_flow_style=False)
    Path(path, "requirements.txt").write_text("\n".join(pip_requirements))
    _PythonEnv.current().to_yaml(os.path.join(path, "python_env.yaml"))


# the flavor module Model.log is given: its name is what Model.log records
TORCHSCRIPT_FILES = SimpleNamespace(__name__="mlflow.pytorch", save_model=_save_model)


def warm_up() -> None:
    """Do ahead of time what makes the first model log slow: MLflow's model modules and its run-context
    tags (the writer keeps IPython out of its notebook check: rlrun/tracking/writer.py)."""
    from mlflow import pyfunc  # noqa: F401
    from mlflow.models import Model, infer_signature  # noqa: F401
    from mlflow.models.utils import _save_example  # noqa: F401

    try:  # a private helper; a later MLflow without it only loses the head start
        from mlflow.tracking.context.registry import resolve_tags

        resolve_tags()
    except (ImportError, AttributeError):
        pass
