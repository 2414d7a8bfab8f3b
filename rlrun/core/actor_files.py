"""The files of a policy's traced greedy actor, as ``rlrun/training/export.py: save_actors`` writes them
(with torch) and ``rlrun/tracking/model_files.py`` logs them as an MLflow model (without torch): one
place for both sides."""

ACTOR_FILE = "model.pth"  # the TorchScript module
EXAMPLE_FILE = "example.npz"  # an input example and the actor's output for it (the model's signature)
META_FILE = "meta.json"  # the model's name, torch version and metadata
