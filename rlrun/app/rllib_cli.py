"""``rlrun-rllib``: RLlib's classic command lines with rlrun in place of RLlib.

    rlrun-rllib train -f cartpole-ppo.yaml                    # an RLlib tuned-example file, as it is
    rlrun-rllib train --run=PPO --env=CartPole-v1 --config '{"lr": 0.001}' --stop '{"timesteps_total": 50000}'
    rlrun-rllib train -f cartpole-ppo.yaml --export conf/experiment/   # write rlrun's experiment file instead
    rlrun-rllib rollout CHECKPOINT --run PPO --env CartPole-v1 --episodes 10   # (evaluate: the same)

Each experiment runs as ``rlrun <overrides>`` does (the same config checks, MLflow record and exit
codes); anything after the RLlib arguments is passed to rlrun as overrides (``tracking=none``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rlrun.config.typed import ConfigError


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rlrun-rllib", description="RLlib's classic command lines, run by rlrun.")
    sub = ap.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train from an RLlib experiment file or --run/--env/--config")
    train.add_argument("-f", "--config-file", help="an RLlib YAML experiment file (<name>: {env, run, stop, config})")
    train.add_argument("--run", help="the algorithm (PPO, DQN, ...)")
    train.add_argument("--env", help="the gymnasium env id")
    train.add_argument("--config", default="{}", help="RLlib config keys as JSON")
    train.add_argument("--stop", default="{}", help="stop criteria as JSON")
    train.add_argument("--checkpoint-freq", type=int, default=0, help="also checkpoint every N iterations")
    train.add_argument("--checkpoint-at-end", action="store_true", help="accepted: rlrun always checkpoints at the end")
    train.add_argument("--name", default=None, help="the experiment name (MLflow experiment)")
    train.add_argument("--export", metavar="DIR",
                       help="write rlrun experiment files to DIR/experiment/ instead of training")
    train.add_argument("--framework", default=None, help="accepted and ignored (rlrun is torch)")
    for name in ("rollout", "evaluate"):
        ev = sub.add_parser(name, help="run a checkpoint's policy greedily and report its returns")
        ev.add_argument("checkpoint")
        ev.add_argument("--run", help="accepted: the checkpoint knows its algorithm")
        ev.add_argument("--env", help="the env id (default: the checkpoint's)")
        ev.add_argument("--episodes", type=int, default=10)
        ev.add_argument("--steps", type=int, default=None, help="accepted: rlrun counts episodes")
    return ap


def _json(text: str, flag: str) -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{flag}: not valid JSON ({e.msg} at character {e.pos}): {text!r}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{flag}: expected a JSON object such as '{{\"lr\": 0.001}}', got {text!r}")
    return value


def experiments(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The experiments ``train`` runs: the file's, or one from --run/--env/--config/--stop."""
    from rlrun.app.rllib_files import load_experiments

    if args.config_file:
        if args.run or args.env:
            raise ConfigError("-f: give either an experiment file or --run/--env, not both")
        exps = load_experiments(args.config_file)
    else:
        if not args.run:
            raise ConfigError("--run: missing; give an algorithm (--run=PPO) or an experiment file (-f FILE)")
        config = _json(args.config, "--config")
        env = args.env or config.get("env")
        if not env:
            raise ConfigError("--env: missing; give an env id (--env=CartPole-v1) or set \"env\" in --config")
        exps = {args.name or f"{args.run.lower()}-{env}": {"run": args.run, "env": env, "config": config,
                                                             "stop": _json(args.stop, "--stop")}}
    if args.checkpoint_freq < 0:
        raise ConfigError(f"--checkpoint-freq: expected 0 or more iterations, got {args.checkpoint_freq}")
    return exps


def train(args: argparse.Namespace, extra: list[str]) -> int:
    from rlrun.app.rllib_files import last_wins, to_experiment_yaml, translate

    plans = []
    for name, spec in experiments(args).items():
        tr = translate(spec, name)
        if args.checkpoint_freq or spec.get("checkpoint_freq"):
            tr.overrides.append(f"checkpoint.every_n_iters={args.checkpoint_freq or spec['checkpoint_freq']}")
        plans.append((name, tr))
    if args.export:
        out = Path(args.export) / "experiment"
        out.mkdir(parents=True, exist_ok=True)
        for name, tr in plans:
            (out / f"{name}.yaml").write_text(to_experiment_yaml(tr.overrides, tr.sweep_params))
            print(f"rlrun-rllib: wrote {out / f'{name}.yaml'}; run it with: rlrun --config-dir {args.export} "
                  f"+experiment={name}{' -m' if tr.sweep else ''}")
        return 0
    from rlrun.app.cli import exit_status

    worst = 0
    for name, tr in plans:
        for note in tr.notes:
            print(f"rlrun-rllib: {name}: {note}", file=sys.stderr)
        if tr.ignored:
            print(f"rlrun-rllib: {name}: ignored (TensorFlow or RLlib-only): {', '.join(tr.ignored)}", file=sys.stderr)
        sys.argv = ["rlrun", *(["-m"] if tr.sweep else []), *last_wins([*tr.overrides, *extra])]  # yours win
        worst = max(worst, exit_status())
    return worst


def evaluate(args: argparse.Namespace) -> int:
    from rlrun.app import eval_cli
    from rlrun.app.rllib_config import env_id

    notes: list[str] = []
    env = [f"env={env_id(args.env, notes, '--env')}"] if args.env else []
    for note in notes:
        print(f"rlrun-rllib: {note}", file=sys.stderr)
    try:
        eval_cli.main([f"checkpoint={args.checkpoint}", f"episodes={args.episodes}", *env])
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    return 0


def main(argv: list[str] | None = None) -> None:
    args, extra = _parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    bad = [a for a in extra if a.startswith("-")]
    try:
        if bad:
            raise ConfigError(f"{bad[0]}: not an option of rlrun-rllib {args.command} (see --help)")
        code = train(args, extra) if args.command == "train" else evaluate(args)
    except ConfigError as e:
        print(f"rlrun-rllib: {e}", file=sys.stderr)
        code = 2
    from rlrun.app.cli import exit_now

    exit_now(code)


if __name__ == "__main__":
    main()
