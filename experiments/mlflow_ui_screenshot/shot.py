"""Screenshot check of a run page: `mlflow ui` on the store, opened in headless Chromium.

Trains `rlrun +experiment=ppo_cartpole` in a fresh launch directory (or uses --launch-dir with an
existing mlflow.db), starts `mlflow ui` on 127.0.0.1 (stopped at the end), and for the newest run
renders three tabs to PNG with Playwright driving the system Chromium (headless): Overview
(description, tags, metrics, the logged model), Model metrics filtered to the episode-return charts,
and Artifacts with learning_curve.png open. It waits for the charts to draw, then fails unless each
page shows what it should. The PNGs go to results/ and are attached to the run as `ui/*.png`.

    apt-get install chromium && pip install playwright     # once; Playwright downloads no browser here
    python experiments/mlflow_ui_screenshot/shot.py
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    raise SystemExit("no chromium on PATH: apt-get install chromium")


def shoot(page_url: str, out: Path, run_name: str) -> dict[str, list[str]]:
    """Three PNGs of the run page; returns, per tab, the expected texts that were not on it."""
    from playwright.sync_api import sync_playwright

    missing: dict[str, list[str]] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})

        def check(tab: str, needles: list[str]) -> None:
            text = page.inner_text("body")
            missing[tab] = [n for n in needles if n not in text]
            page.screenshot(path=str(out / f"run_{tab}.png"), full_page=True)

        ml = "?workflowType=machine_learning"  # as in the address a run prints; else MLflow opens its GenAI view
        page.goto(page_url + ml)
        page.get_by_text("Description").first.wait_for(timeout=90_000)
        page.get_by_text("Logged models").first.wait_for(timeout=30_000)
        page.wait_for_timeout(1000)
        check("overview", [run_name, "Finished", "Target met: yes", "rlrun.target_met", "Logged models (1)",
                           "rollout/episode_return_mean"])

        # the experiment page, at the address rlrun prints: it opens on the training runs, not GenAI traces
        page.goto(page_url.split("/runs/")[0] + ml)
        page.wait_for_timeout(8000)  # the page polls, so "network idle" never comes
        text = page.inner_text("body")
        missing["experiment"] = [n for n in (run_name, "Runs") if n not in text] + [
            n for n in ("Token usage", "No traces") if n in text]  # the GenAI view's texts must not be there
        page.screenshot(path=str(out / "experiment.png"))  # the viewport: what a user sees first

        page.goto(f"{page_url}/model-metrics{ml}")
        page.wait_for_function("document.querySelectorAll('svg.main-svg').length >= 2", timeout=90_000)
        page.wait_for_timeout(2000)
        # a chart's title is the key's last part, under a section named after the rest ("rollout (6)")
        titles = page.get_by_text("episode_return_mean", exact=True)
        box = titles.first.bounding_box() if titles.count() else None
        sections = page.get_by_text("rollout", exact=True)
        section = sections.first.bounding_box() if sections.count() else None
        in_view = (box is not None and section is not None and section["y"] < box["y"]
                   and box["y"] + box["height"] <= 1000)  # the viewport is 1000 px high
        missing["metrics_first_view"] = [] if in_view else [f"rollout/episode_return_mean in view (at {box})"]
        page.screenshot(path=str(out / "run_metrics_first_view.png"))  # no scrolling, no filter
        page.get_by_placeholder("Search metric charts").fill("episode_return")
        page.wait_for_function("document.querySelectorAll('svg.main-svg').length >= 3", timeout=90_000)
        page.wait_for_timeout(1500)  # let the lines draw
        check("metrics", ["episode_return_mean", "episode_return_max", "Step"])

        page.goto(f"{page_url}/artifacts{ml}")
        page.get_by_text("learning_curve.png").first.click(timeout=90_000)
        page.wait_for_function("[...document.images].some(i => i.complete && i.naturalWidth >= 600)",
                               timeout=60_000)  # the 700x400 learning curve
        page.wait_for_timeout(1000)
        check("artifacts", ["checkpoints", "config.yaml", "learning_curve.png"])
        browser.close()
    return missing


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--launch-dir", type=Path, help="a directory with mlflow.db (default: train a fresh run)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rlrun-ui-"))
    launch = args.launch_dir.resolve() if args.launch_dir else tmp / "launch"
    if not args.launch_dir:
        launch.mkdir()
        subprocess.run(["rlrun", "+experiment=ppo_cartpole", "progress=false"], cwd=launch, check=True)
    uri = f"sqlite:///{launch / 'mlflow.db'}"

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    run = client.search_runs(exps, order_by=["attributes.start_time DESC"], max_results=1)[0]
    run_id, exp_id, name = run.info.run_id, run.info.experiment_id, run.info.run_name
    port = free_port()
    server = subprocess.Popen(["mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("mlflow ui did not come up") from None
                time.sleep(0.5)
        missing = shoot(f"{base}/#/experiments/{exp_id}/runs/{run_id}", out, name)
        for tab, gaps in missing.items():
            png = out / (f"{tab}.png" if tab == "experiment" else f"run_{tab}.png")
            print(f"{tab:9s} {png.relative_to(HERE.parents[1])}  {png.stat().st_size:,} bytes  "
                  f"missing from the page: {gaps or 'nothing'}")
            client.log_artifact(run_id, str(png), "ui")
        failures = {tab: gaps for tab, gaps in missing.items() if gaps}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    print(f"run {name} ({run_id}) in {uri} (kept); screenshots attached to it under ui/")
    if failures:
        sys.exit(f"the run page lacks {failures}")


if __name__ == "__main__":
    main()
