"""RLlib's classic experiment specs and config dicts -> rlrun command-line overrides.

An RLlib tuned-example file is ``<name>: {env, run, stop, config}``; ``translate`` turns one entry
into the overrides ``rlrun`` composes (so a file's run is an ordinary rlrun run, recorded alike), with
the keys it accepted without use and the notes said once on the console. RLlib's defaults apply to
keys a file leaves unset (``RLLIB_DEFAULTS``: the classic stack's, Ray 2.x), so a file trains as it
did in RLlib; the one deliberate difference: RLlib's default rollout workers become as many env
copies in-process (the same samples; Ray workers only when the file sets ``num_workers``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rlrun.app.rllib_defaults import ENV_SUCCESSORS
from rlrun.config.typed import ConfigError
from rlrun.core.errors import suggest

# run -> the config groups it selects
ALGOS: dict[str, tuple[str, ...]] = {
    "PG": ("algo=pg", "loss=pg", "model=mlp"), "A2C": ("algo=a2c", "loss=a2c", "model=mlp"),
    "A3C": ("algo=a2c", "loss=a2c", "model=mlp"), "PPO": ("algo=ppo", "loss=ppo_clip", "model=mlp"),
    "APPO": ("algo=appo", "loss=ppo_clip", "model=mlp"), "DQN": ("algo=dqn", "loss=dqn_td", "model=q_mlp"),
    "SAC": ("algo=sac", "loss=sac", "model=twin_q_mlp"), "TD3": ("algo=td3", "loss=td3", "model=twin_q_mlp",
                                                                "model.action_dist=deterministic"),
    "DDPG": ("algo=td3", "loss=td3", "model=twin_q_mlp", "model.action_dist=deterministic"),
    "BC": ("algo=bc", "loss=marwil", "model=mlp"), "MARWIL": ("algo=marwil", "loss=marwil", "model=mlp"),
}
OFF_POLICY = ("DQN", "SAC", "TD3", "DDPG")


# RLlib's names (newest first) for the CPUs of the process that learns: under Ray Tune each trial's own
# share (``RLrunTrainable.default_resource_request``); outside Tune they mean nothing (listed as ignored)
DRIVER_CPU_KEYS = ("num_cpus_for_main_process", "num_cpus_for_local_worker", "num_cpus_for_driver")

# RLlib's names (newest first) for the CPUs of each rollout worker: rollout.num_cpus_per_worker where the file asks
# for Ray workers (num_workers / num_env_runners), else accepted without use (the env copies run in-process)
WORKER_CPU_KEYS = ("num_cpus_per_env_runner", "num_cpus_per_worker")



def check_cpus(key: str, value: Any, upper: float = math.inf, what: str = "a number of CPUs") -> None:
    """One line naming ``config.<key>`` unless ``value`` is a finite number of CPUs in (0, ``upper``]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (0 < value <= upper
                                                                               and math.isfinite(value)):
        bound = f" in (0, {upper}]" if math.isfinite(upper) else ""
        raise ConfigError(f"config.{key}: expected {what}{bound}, got {value!r}")


# keys that only meant something to TensorFlow, to RLlib's own machinery or to its reporting:
# accepted and listed once as ignored
IGNORED = {"framework", "eager_tracing", "num_gpus", "enable_connectors", "log_level", *WORKER_CPU_KEYS,
           "num_gpus_per_worker", "tf_session_args", "local_tf_session_args", "soft_horizon", "no_done_at_end",
           "worker_side_prioritization", "type", "_fake_gpus", "min_train_timesteps_per_iteration",
           "simple_optimizer", "compress_observations", "metrics_smoothing_episodes_unused", *DRIVER_CPU_KEYS}

ACTIVATIONS = {"tanh": "tanh", "relu": "relu", "elu": "elu", "swish": "silu", "silu": "silu", "linear": "linear",
               None: "linear", "gelu": "gelu"}
FILTERS = {"NoFilter": "none", "MeanStdFilter": "mean_std"}


@dataclass
class Translation:
    """What one RLlib experiment becomes: rlrun overrides, whether it is a sweep (``grid_search``), the
    keys accepted without use, and the notes to say once."""

    overrides: list[str] = field(default_factory=list)
    sweep: bool = False
    sweep_params: dict[str, str] = field(default_factory=dict)  # rlrun key -> "v1,v2" (grid_search)
    ignored: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def fmt(value: Any) -> str:
    """A value as a Hydra override writes it (a string Hydra would read as another type is quoted)."""
    if isinstance(value, str):
        plain = value.replace("_", "").replace("-", "").replace(".", "").isalnum() and not value[:1].isdigit()
        return value if plain and value.lower() not in ("true", "false", "null", "nan", "inf") else json.dumps(
            value, ensure_ascii=False)
    if isinstance(value, Mapping):  # Hydra's dict keys are unquoted
        return "{" + ", ".join(f"{k}: {fmt(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(fmt(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def env_id(name: Any, notes: list[str], key: str = "env") -> str:
    """A gymnasium id for RLlib's env id: a retired version mapped to its successor (said once)."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{key}: expected a gymnasium env id such as CartPole-v1, got {name!r}")
    import gymnasium as gym

    from rlrun.core.registry import RegistryError
    from rlrun.envs.make import import_env_package

    try:
        if name not in ENV_SUCCESSORS:  # a retired classic id imports nothing (ale-py takes ~0.4 s)
            import_env_package(name)  # ale-py's Atari ids, MiniGrid's, ...
    except RegistryError as e:
        raise ConfigError(f"{key}: {str(e).removeprefix('env.id: ')}") from None
    if name in gym.registry:
        return name
    if name in ENV_SUCCESSORS and ENV_SUCCESSORS[name] in gym.registry:
        notes.append(f"env {name} is {ENV_SUCCESSORS[name]} in gymnasium: using {ENV_SUCCESSORS[name]}")
        return ENV_SUCCESSORS[name]
    raise ConfigError(f"{key}: '{name}' is not a gymnasium env and has no successor there"
                      f"{suggest(name, list(gym.registry))}")


Pairs = list[tuple[str, Any]]
Handler = Callable[[Any, "Context"], Pairs]


@dataclass
class Context:
    run: str
    env: str  # the gymnasium id
    notes: list[str]
    ignored: list[str] = field(default_factory=list)  # nested keys accepted without use (listed once)
    images: bool = False  # an Atari env's frames: RLlib's vision net, rlrun's convolutional models


def _to(key: str, convert: Callable[[Any], Any] = lambda v: v) -> Handler:
    return lambda v, ctx: [(key, convert(v))]


def _choice(table: Mapping[Any, str], key: str, rllib_key: str) -> Handler:
    def handle(v: Any, ctx: Context) -> Pairs:
        if v not in table:
            raise ConfigError(f"config.{rllib_key}: {v!r} is not supported; supported: {', '.join(map(str, table))}")
        return [(key, table[v])]
    return handle


def _model(v: Any, ctx: Context) -> Pairs:
    if not isinstance(v, Mapping):
        raise ConfigError(f"config.model: expected a mapping (RLlib's model dict), got {v!r}")
    out: Pairs = []
    for k, x in v.items():
        if k not in MODEL_KEYS:
            raise ConfigError(f"config.model.{k}: not a model key rlrun supports{suggest(k, list(MODEL_KEYS))}; "
                              f"supported: {', '.join(MODEL_KEYS)}")
        if isinstance(x, Mapping) and "grid_search" in x:
            x = x["grid_search"][0]  # its values become the sweep (rllib_files.translate)
        out += MODEL_KEYS[k](x, ctx)
    return out


def _use_lstm(v: Any, ctx: Context) -> Pairs:
    return [("__model_group__", "lstm")] if v else []


def _vector(handler: Handler) -> Handler:
    """A key of RLlib's fully connected net: unused on images (its vision net takes them)."""
    return lambda v, ctx: [] if ctx.images else handler(v, ctx)


def _vision(handler: Handler, runs: tuple[str, ...] = tuple(ALGOS)) -> Handler:
    """A key of RLlib's vision net: used on images (by ``runs``' models), unused otherwise."""
    return lambda v, ctx: handler(v, ctx) if ctx.images and ctx.run in runs else []


def _conv_filters(v: Any, ctx: Context) -> Pairs:
    if v is None or ctx.images:  # on images: read with RLlib's padding and defaults (rllib_images.atari_pairs)
        return []
    return _unsupported("model.conv_filters", v, "rlrun-rllib gives convolutions to Atari envs' frames; on other "
                        "envs use rlrun's model=cnn (q_cnn for DQN, twin_q_cnn for SAC and TD3) model.conv_filters")


def layers(key: str, v: Any) -> list[int]:
    """``v`` as a list of layer sizes; ConfigError naming ``config.<key>`` otherwise."""
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v):
        raise ConfigError(f"config.{key}: expected a list of layer sizes such as [256, 256], got {v!r}")
    return list(v)


def _layers(key: str, target: str, use: Callable[[Context], bool]) -> Handler:
    """A list of layer sizes, checked always, ``target`` where ``use(ctx)``."""
    def handle(v: Any, ctx: Context) -> Pairs:
        sizes = layers(key, v)
        return [(target, sizes)] if use(ctx) else []
    return handle


ON_POLICY = tuple(r for r in ALGOS if r not in OFF_POLICY)
MODEL_KEYS: dict[str, Handler] = {
    "fcnet_hiddens": _layers("model.fcnet_hiddens", "model.hiddens",
                             lambda ctx: ctx.run in ON_POLICY and not ctx.images),
    "fcnet_activation": _vector(lambda v, ctx: [] if ctx.run in OFF_POLICY else _choice(
        ACTIVATIONS, "model.activation", "model.fcnet_activation")(v, ctx)),
    "vf_share_layers": _to("model.vf_share_layers"), "free_log_std": _to("model.free_log_std"),
    "use_lstm": _use_lstm, "lstm_cell_size": _to("model.cell_size"), "max_seq_len": _to("model.max_seq_len"),
    "conv_filters": _conv_filters, "conv_activation": _vision(_choice(ACTIVATIONS, "model.conv_activation",
                                                                      "model.conv_activation")),
    "post_fcnet_hiddens": _layers("model.post_fcnet_hiddens", "model.hiddens",
                                  lambda ctx: ctx.images and ctx.run in ON_POLICY),
    "post_fcnet_activation": _vision(_choice(ACTIVATIONS, "model.activation", "model.post_fcnet_activation"),
                                     ON_POLICY),
    # the DeepMind preprocessing's frame size and stacking: read in rllib_images.atari_pairs
    "dim": lambda v, ctx: [], "framestack": lambda v, ctx: [], "grayscale": lambda v, ctx: [],
    "zero_mean": lambda v, ctx: [], "fcnet_weights_initializer": lambda v, ctx: [],
}


def _unsupported(key: str, value: Any, why: str) -> Pairs:
    raise ConfigError(f"config.{key}: {value!r} is not supported ({why})")


def _note(ctx: Context, text: str) -> Pairs:
    ctx.notes.append(text)
    return []


def _lambda(v: Any, ctx: Context) -> Pairs:
    return [("algo.gae_lambda", v)] if ctx.run in ("PPO", "APPO", "A2C", "A3C") else []


def _per_run(table: Mapping[str, str]) -> Handler:
    """A key whose rlrun name depends on the algorithm (absent: the key means nothing there)."""
    return lambda v, ctx: [(table[ctx.run], v)] if ctx.run in table else []


def _exploration(v: Any, ctx: Context) -> Pairs:
    if not isinstance(v, Mapping):
        raise ConfigError(f"config.exploration_config: expected a mapping, got {v!r}")
    kind = v.get("type", {"DQN": "EpsilonGreedy", "DDPG": "OrnsteinUhlenbeckNoise"}.get(ctx.run, "GaussianNoise"))
    if ctx.run == "DQN":
        if kind != "EpsilonGreedy":
            raise ConfigError(f"config.exploration_config.type: {kind!r} is not supported for DQN; supported: "
                              "EpsilonGreedy")
        steps, first, last = v.get("epsilon_timesteps", 10000), v.get("initial_epsilon", 1.0), v.get("final_epsilon",
                                                                                                        0.02)
        return [("algo.epsilon", [[0, first], [steps, last]])]
    if ctx.run in ("TD3", "DDPG"):
        out: Pairs = []
        if "random_timesteps" in v:
            ctx.notes.append(f"exploration_config.random_timesteps={v['random_timesteps']}: rlrun acts uniformly at "
                             "random until learning starts (num_steps_sampled_before_learning_starts)")
        if kind == "OrnsteinUhlenbeckNoise":  # RLlib: base x OU state x (high - low), high - low = 2 on [-1, 1]
            theta = v.get("ou_theta", 0.15)
            scale = 2 * v.get("ou_base_scale", 0.1) * v.get("ou_sigma", 0.2) / math.sqrt(2 * theta - theta**2)
            ctx.notes.append(f"exploration_config: Ornstein-Uhlenbeck noise is Gaussian noise of its stationary "
                             f"scale in rlrun ({scale:.3g} on the [-1, 1] action scale)")
            out.append(("algo.exploration_noise", round(scale, 6)))
        if v.get("initial_scale", 1.0) != v.get("final_scale", v.get("initial_scale", 1.0)):
            ctx.notes.append(f"exploration_config: the noise scale {v['initial_scale']} -> {v['final_scale']} is not "
                             "annealed in rlrun: it stays at its initial scale")
        elif "stddev" in v:
            out.append(("algo.exploration_noise", v["stddev"]))
        return out
    raise ConfigError(f"config.exploration_config: not supported for {ctx.run} (it explores by sampling its policy)")


def _replay(v: Any, ctx: Context) -> Pairs:
    if not isinstance(v, Mapping):
        raise ConfigError(f"config.replay_buffer_config: expected a mapping, got {v!r}")
    out: Pairs = []
    kind = str(v.get("type", "MultiAgentReplayBuffer"))
    if ctx.run == "DQN":
        out.append(("algo.prioritized_replay", "Prioritized" in kind))
    elif "Prioritized" in kind:
        ctx.notes.append(f"replay_buffer_config.type={kind}: {ctx.run} replays uniformly in rlrun")
    for k, x in v.items():
        # min_size_for_sampling: the older Rays' name of the rows stored before the first update
        target = {"capacity": "algo.replay_capacity", "learning_starts": "algo.learning_starts",
                  "min_size_for_sampling": "algo.learning_starts",
                  "prioritized_replay_alpha": "algo.prioritized_replay_alpha",
                  "prioritized_replay_beta": "algo.prioritized_replay_beta",
                  "prioritized_replay_eps": "algo.prioritized_replay_eps"}.get(k)
        if target and (ctx.run == "DQN" or "prioritized" not in target):
            out.append((target, x))
        elif target:  # a prioritized buffer's settings where rlrun replays uniformly (said above)
            ctx.ignored.append(f"replay_buffer_config.{k}")
        elif k == "type":
            pass  # read above
        elif k in IGNORED:
            ctx.ignored.append(f"replay_buffer_config.{k}")
        else:
            raise ConfigError(f"config.replay_buffer_config.{k}: not supported; supported: capacity, learning_starts, "
                              "min_size_for_sampling, type, prioritized_replay_alpha/beta/eps")
    return out


# the older Rays' names of the iteration's minimums (Ray 1.x, 2.0) -> today's; where a file gives both, today's wins
RENAMED = {"timesteps_per_iteration": "min_sample_timesteps_per_iteration",
           "min_sample_timesteps_per_reporting": "min_sample_timesteps_per_iteration",
           "min_iter_time_s": "min_time_s_per_iteration", "min_time_s_per_reporting": "min_time_s_per_iteration"}


# SAC's Q/policy model keys in Rays before 1.x's ModelV2 names (atari-sac.yaml, mujoco-sac.yaml): the same meaning
SUB_MODEL_ALIASES = {"hidden_layer_sizes": "fcnet_hiddens", "hidden_activation": "fcnet_activation"}


def _sub_model(hidden_key: str) -> Handler:
    def handle(v: Any, ctx: Context) -> Pairs:
        if not isinstance(v, Mapping):
            raise ConfigError(f"config: expected a model mapping, got {v!r}")
        bad = [k for k in v if k not in ("fcnet_hiddens", "fcnet_activation", *SUB_MODEL_ALIASES)]
        if bad:
            raise ConfigError(f"config: {bad[0]} in a Q/policy model config is not supported; supported: "
                              "fcnet_hiddens (hidden_layer_sizes), fcnet_activation (hidden_activation)")
        v = {SUB_MODEL_ALIASES.get(k, k): x for k, x in v.items()}
        where = "q_model_config" if "critic" in hidden_key else "policy_model_config"
        hiddens = v.get("fcnet_hiddens")
        out: Pairs = [(hidden_key, layers(f"{where}.fcnet_hiddens", hiddens))] if hiddens is not None else []
        if "fcnet_activation" in v:
            out += _choice(ACTIVATIONS, "model.activation", "fcnet_activation")(v["fcnet_activation"], ctx)
        return out
    return handle


def _optimization(v: Any, ctx: Context) -> Pairs:
    names = {"actor_learning_rate": "algo.lr", "critic_learning_rate": "algo.critic_lr",
             "entropy_learning_rate": "algo.alpha_lr"}
    bad = [k for k in v if k not in names]
    if bad:
        raise ConfigError(f"config.optimization.{bad[0]}: not supported; supported: {', '.join(names)}")
    return [(names[k], x) for k, x in v.items()]


def _target_entropy(v: Any, ctx: Context) -> Pairs:
    return [("algo.target_entropy", None if v == "auto" else v)]


def _horizon(v: Any, ctx: Context) -> Pairs:
    """RLlib's ``horizon``: accepted where it is the env's own time limit (gymnasium's TimeLimit)."""
    import gymnasium as gym

    limit = gym.spec(ctx.env).max_episode_steps if ctx.env in gym.registry else None
    if v and v != limit:
        raise ConfigError(f"config.horizon: {v} differs from {ctx.env}'s own time limit ({limit}); rlrun keeps the "
                          "env's (gymnasium's TimeLimit): drop the key or register the env with that limit")
    return []


KEYS: dict[str, Handler] = {
    "env": lambda v, ctx: [], "seed": _to("seed"), "gamma": _to("algo.gamma"), "lr": _to("algo.lr"),
    "lr_schedule": _to("algo.lr_schedule"), "adam_epsilon": _to("algo.adam_eps"), "grad_clip": _to("algo.grad_clip"),
    "lambda": _lambda,
    "num_workers": lambda v, ctx: [], "num_env_runners": lambda v, ctx: [], "num_envs_per_worker": lambda v, ctx: [],
    "num_envs_per_env_runner": lambda v, ctx: [], "rollout_fragment_length": lambda v, ctx: [],
    "train_batch_size": lambda v, ctx: [], "min_sample_timesteps_per_iteration": lambda v, ctx: [],  # _sampling's
    # RLlib's iteration lasts at least this long (SAC's default 1 s, A2C's and APPO's 10): one report each
    "min_time_s_per_iteration": lambda v, ctx: [("min_time_s_per_iteration", v or 0)],
    "training_intensity": lambda v, ctx: [], "batch_mode": _to("rollout.batch_mode"),
    "observation_filter": _choice(FILTERS, "rollout.observation_filter", "observation_filter"),
    "num_sgd_iter": _to("algo.num_sgd_iter"), "num_epochs": _to("algo.num_sgd_iter"),
    "sgd_minibatch_size": _to("algo.sgd_minibatch_size"), "minibatch_size": _to("algo.sgd_minibatch_size"),
    "vf_loss_coeff": _per_run({"PPO": "loss.vf_coeff", "APPO": "loss.vf_coeff", "A2C": "loss.vf_coeff",
                               "A3C": "loss.vf_coeff", "MARWIL": "loss.vf_coeff"}),
    "vf_coeff": _per_run({"MARWIL": "loss.vf_coeff", "BC": "loss.vf_coeff"}),
    "entropy_coeff": _per_run({"PPO": "loss.entropy_coeff", "APPO": "loss.entropy_coeff",
                               "A2C": "loss.entropy_coeff", "A3C": "loss.entropy_coeff"}),
    "clip_param": _per_run({"PPO": "loss.clip_param", "APPO": "loss.clip_param"}),
    "vf_clip_param": _per_run({"PPO": "loss.vf_clip_param"}), "kl_coeff": _per_run({"PPO": "loss.kl_coeff"}),
    "kl_target": _per_run({"PPO": "loss.kl_target"}), "use_gae": _per_run({"A2C": "algo.use_gae"}),
    "use_critic": lambda v, ctx: [] if v else _unsupported("use_critic", v, "rlrun's actor-critics always learn V"),
    "vtrace": lambda v, ctx: [] if v or ctx.run != "APPO" else _note(
        ctx, "vtrace: false - rlrun's APPO always corrects its off-policy fragments with V-trace"),
    "model": _model, "clip_rewards": lambda v, ctx: [] if v is None else [("algo.clip_rewards", v)],
    "beta": _per_run({"MARWIL": "algo.beta", "BC": "algo.beta"}),
    "n_step": _to("algo.n_step"), "double_q": _to("algo.double_q"), "dueling": _to("model.dueling"),
    "hiddens": _layers("hiddens", "", lambda ctx: False),  # DQN's: read in translate
    "num_atoms": _to("model.num_atoms"), "v_min": _to("model.v_min"),
    "v_max": _to("model.v_max"), "noisy": _to("model.noisy"), "sigma0": _to("model.sigma0"),
    "target_network_update_freq": _per_run({"DQN": "algo.target_network_update_freq"}),
    "num_steps_sampled_before_learning_starts": _to("algo.learning_starts"), "learning_starts": _to(
        "algo.learning_starts"), "exploration_config": _exploration, "explore": lambda v, ctx: [],
    "replay_buffer_config": _replay, "buffer_size": _to("algo.replay_capacity"),
    "prioritized_replay": _to("algo.prioritized_replay"), "tau": _to("algo.tau"),
    "initial_alpha": _to("algo.initial_alpha"), "target_entropy": _target_entropy,
    "twin_q": lambda v, ctx: [("model.num_critics", 2 if v else 1)], "optimization": _optimization,
    "q_model_config": _sub_model("model.critic_hiddens"), "Q_model": _sub_model("model.critic_hiddens"),
    "policy_model_config": _sub_model("model.hiddens"), "policy_model": _sub_model("model.hiddens"),
    "actor_hiddens": _to("model.hiddens"), "critic_hiddens": _to("model.critic_hiddens"),
    "actor_hidden_activation": _choice(ACTIVATIONS, "model.activation", "actor_hidden_activation"),
    "critic_hidden_activation": _choice(ACTIVATIONS, "model.activation", "critic_hidden_activation"),
    "actor_lr": _to("algo.lr"), "critic_lr": _to("algo.critic_lr"), "policy_delay": _to("algo.policy_delay"),
    # target_noise applies only with smooth_target_policy (RLlib's): both read together in translate
    "target_noise": lambda v, ctx: [], "target_noise_clip": _to("algo.target_noise_clip"),
    "smooth_target_policy": lambda v, ctx: [],
    "use_huber": lambda v, ctx: [] if not v else _per_run({"TD3": "loss.huber_delta", "DDPG": "loss.huber_delta"})(
        1.0, ctx), "huber_threshold": _per_run({"TD3": "loss.huber_delta", "DDPG": "loss.huber_delta"}),
    "l2_reg": _per_run({"TD3": "loss.l2_reg", "DDPG": "loss.l2_reg"}),
    "metrics_smoothing_episodes": _to("metrics_num_episodes_for_smoothing"),
    "metrics_num_episodes_for_smoothing": _to("metrics_num_episodes_for_smoothing"), "horizon": _horizon,
    "evaluation_interval": lambda v, ctx: [("evaluation.interval", v or 0)],
    "evaluation_duration": _to("evaluation.num_episodes"), "evaluation_num_workers": lambda v, ctx: [],
    "evaluation_num_env_runners": lambda v, ctx: [], "evaluation_config": lambda v, ctx: [],
    "input": lambda v, ctx: [] if v == "sampler" else [("input", v)], "output": _to("output"),
    "env_config": lambda v, ctx: [("env.kwargs", dict(v))],  # a mapping (rllib_images.atari_images checks)
    "preprocessor_pref": lambda v, ctx: [],  # read in rllib_images.atari_pairs (Atari envs)
}
