"""The run's config schemas: one dataclass per section, the only place defaults live (the YAML files
under conf/ hold the same values; tests/test_defaults.py compares them). ``rlrun.training.validate`` builds and
checks them and re-exports every name here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rlrun.config.multi_agent import MultiAgentConfig
from rlrun.config.offline import SAMPLER, OfflineConfig

# runs without a preset go to MLflow's own experiment 0, which every store has (a second, rlrun-made
# "default" beside MLflow's empty "Default" confused users)
DEFAULT_EXPERIMENT = "Default"


@dataclass
class OptimizerConfig:
    name: str = "adam"  # rlrun's fused Adam, or any torch.optim class name (SGD, RMSprop, AdamW, ...)
    kwargs: dict[str, Any] = field(default_factory=dict)  # its options besides lr (which is algo.lr)


@dataclass
class AlgoConfig:
    """Options every algorithm has. Subclasses (``PPOConfig``) add their own."""

    name: str = "ppo"
    lr: float = 3e-4
    # piecewise-linear schedule over env steps sampled: [[0, 3e-4], [100000, 0.0]]; overrides lr
    lr_schedule: list[list[float]] | None = None
    gamma: float = 0.99
    train_batch_size: int = 256  # env steps per training iteration (see rollout.*)
    num_sgd_iter: int = 1  # passes over the train batch per iteration
    sgd_minibatch_size: int | None = None  # None: the whole batch in one step
    grad_clip: float | None = 0.5  # global L2 norm; None: no clipping
    adam_eps: float = 1e-5  # eps of rlrun's Adam (optimizer.name: adam)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    # true: learn from each reward's sign (Atari); a number c: from each reward clipped to [-c, c] (RLlib's
    # clip_rewards both ways); the episode returns reported stay the env's
    clip_rewards: bool | float = False


@dataclass
class LossConfig:
    """Options every loss has; losses with coefficients subclass it."""

    name: str = "pg"


@dataclass
class ModelConfig:
    name: str = "mlp"


@dataclass
class EnvConfig:
    # an rlrun-registered env name or any gymnasium id; null: no env (spaces declared below; training
    # from `input` files or a policy server's clients, no online evaluation)
    id: str | None = "CartPole-v1"
    kwargs: dict[str, Any] = field(default_factory=dict)  # passed to the env constructor
    # how sub-envs are stepped: auto (the env's own numpy vector env if it has one, else sync);
    # envpool: EnvPool's C++ pool (optional package, its envs only: CartPole-v1, Pendulum-v1, ...)
    vectorize: Literal["auto", "vector_entry_point", "sync", "envpool"] = "auto"
    # gymnasium wrappers, applied in order: a name or {name: <wrapper>, <argument>: <value>} (rlrun/envs/wrappers.py)
    wrappers: list[Any] = field(default_factory=list)
    # a multi-agent env whose seats are alike (board games): each episode its agents take the seats in a new
    # random order, so a policy mapped to player_1 learns every seat (rlrun/envs/seats.py)
    shuffle_seats: bool = False
    # declared spaces ({type: Box, shape: [4]}, {type: Discrete, n: 2}; rlrun/data/spaces.py): both or
    # neither; required with id: null, checked against the env otherwise
    observation_space: dict[str, Any] | None = None
    action_space: dict[str, Any] | None = None

    @property
    def label(self) -> str:
        """The env's name for tags and run names (``spaces-only`` without an env)."""
        return self.id or "spaces-only"


@dataclass
class RayConfig:
    # null: start a private local Ray instance (loopback only) sized by num_cpus;
    # "auto" or "host:port" or "ray://host:port": join that existing cluster (never starts one)
    address: str | None = None
    num_cpus: int | None = None  # private instance only; null = all cores of this machine
    start_timeout_s: float = 120.0  # rollout actors not placed by then (CPUs all taken): the run fails, clearly
    # Ray's runtime_env for this run's workers, e.g. {py_modules: [my_plugins]} ships a package (paths
    # relative to the launch dir) to nodes that do not have the user's files; null: none
    runtime_env: dict[str, Any] | None = None
    # DEFAULT (Ray packs the workers) or SPREAD (over the cluster's nodes)
    scheduling_strategy: Literal["DEFAULT", "SPREAD"] = "DEFAULT"


@dataclass
class ServerConfig:
    """rollout=server: external clients drive the episodes (rlrun/serving/, rlrun/app/client.py)."""

    host: str = "127.0.0.1"  # anything else is reachable from other machines (a warning says so)
    port: int = 9900  # 0: any free port (the address is printed)
    # relative to the launch directory; created with a fresh token (mode 0600) when missing
    token_file: str = "server.token"
    max_clients: int = 64  # concurrent connections (more get 503)
    max_episodes: int = 10_000  # episodes open at once
    episode_timeout_s: float = 60.0  # an episode without a request this long is abandoned (its rows dropped)
    max_request_bytes: int = 1_048_576  # larger bodies get 413
    finish_grace_s: float = 2.0  # after the run: answer "run finished" (410) this long, then close


@dataclass
class RolloutConfig:
    num_workers: int = 0  # remote rollout workers (Ray actors); 0 = sample in-process, no Ray
    # sub-envs per worker, stepped as one vector env; "auto" = train_batch_size / (fragment x max(workers, 1))
    num_envs_per_worker: int | Literal["auto"] = 8
    # vector steps per sub-env per sample() call; "auto" = train_batch_size / (envs x max(workers, 1))
    rollout_fragment_length: int | Literal["auto"] = 32
    batch_mode: Literal["truncate_episodes", "complete_episodes"] = "truncate_episodes"
    num_cpus_per_worker: float = 1.0
    max_worker_restarts: int = 10  # over the whole run; past it the run stops (FAILED)
    sample_timeout_s: float = 300.0  # a remote sample() slower than this counts as a dead worker
    # none, or mean_std: running mean/std normalisation of observations (synced across workers, in
    # checkpoints and in the exported model; frozen in evaluation)
    observation_filter: Literal["none", "mean_std"] = "none"
    observation_filter_clip: float = 10.0  # mean_std: normalised observations are clipped to +-this
    ray: RayConfig = field(default_factory=RayConfig)
    server: ServerConfig | None = None  # set by rollout=server: sample from external clients


@dataclass
class TrackingConfig:
    backend: Literal["mlflow", "none"] = "mlflow"
    tracking_uri: str | None = None  # None: sqlite:///<launch dir>/mlflow.db
    artifact_location: str | None = None  # None: <dir of the sqlite file>/mlartifacts
    experiment_name: str | None = None  # None: the +experiment config's name, else DEFAULT_EXPERIMENT
    run_name: str | None = None
    log_model: bool = True  # the final policy as MLflow model `model` (greedy actions; ~0.2 s at the end)
    # true: `rlrun` returns once MLflow holds the whole run (metrics, artifacts, model, curve, status).
    # false (detach, for interactive use): a finished run returns once training ends; its writer process
    # finishes the record in the background and `rlrun-wait` waits for it. Sweeps and the Python API always wait.
    wait: bool = True


@dataclass
class CheckpointConfig:
    every_n_iters: int = 0  # also every N iterations (0: only at the end)
    keep_last: int = 3  # local checkpoint dirs kept (MLflow keeps every one it was sent)
    include_replay: bool = False  # DQN: store the replay buffer too (large)


@dataclass
class EvaluationConfig:
    interval: int = 0  # evaluate every N iterations (0: never); greedy actions on separate envs
    num_episodes: int = 10
    num_envs: int = 5
    final: bool = True  # with an interval: evaluate the stopping iteration too, if it was not one of them


@dataclass
class RunConfig:
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    multiagent: MultiAgentConfig = field(default_factory=MultiAgentConfig)
    # where experience comes from: sampler (the rollout workers), a directory or glob of rlrun Parquet
    # files, or a weighted mix {sampler: 0.5, data/dir: 0.5} (rlrun/offline/)
    input: Any = SAMPLER
    output: str | None = None  # also write every sampled batch as Parquet files to this directory
    offline: OfflineConfig = field(default_factory=OfflineConfig)
    seed: int = 0
    # stop when ANY criterion is met: counters (STOP_COUNTERS) or metric thresholds (metric >= value)
    stop: dict[str, float] = field(default_factory=lambda: {"timesteps_total": 100_000})
    plugins: list[str] = field(default_factory=list)  # modules imported before registries are read
    callbacks: list[str] = field(default_factory=list)  # registered Callbacks (sources/callbacks.py), in order
    output_dir: str | None = None  # None: Hydra's run dir (cli) or a temp dir
    torch_threads: int = 1  # intra-op threads; small MLPs are fastest single-threaded
    # torch.set_float32_matmul_precision: "highest" computes float32 matmuls and convolutions in float32;
    # "medium" lets both run in bfloat16 where the CPU has it (AMX, AVX512-BF16); "high": matmuls only
    torch_matmul_precision: str = "highest"
    # the hand-derived updates' float32 products: "blas" (torch's: MKL), "onednn" (torch's oneDNN), "auto" (oneDNN
    # on AMD CPUs with AVX-512, where MKL runs its AVX2 kernels, unless torch_matmul_precision is "medium";
    # rlrun/models/gemm.py); the run records its choice
    torch_matmul_backend: str = "auto"
    # rollout/episode_* are over this many of the latest completed episodes (RLlib's key)
    metrics_num_episodes_for_smoothing: int = 100
    # an iteration repeats sampling train_batch_size rows and learning on them until it has sampled this
    # many env steps (RLlib's key; 0: once): one update per env step, reported per thousand
    min_sample_timesteps_per_iteration: int = 0
    # ... and until it has run this many seconds (RLlib's key; 0: no minimum): a report, an evaluation check and
    # an MLflow row per second, say, however short a round is
    min_time_s_per_iteration: float = 0.0
    progress: bool = True  # live console progress line
    experiment: str | None = None  # name of the +experiment preset, set by the cli
    resume: str | None = None  # a checkpoint dir, an MLflow run id, or "latest"
    # a sweep job's return value: a metric, steps_to_target or time_to_target (rlrun/core/sweep_info.py)
    objective: str = "rollout/episode_return_mean"
