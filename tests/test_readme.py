from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    blocks = [b.split("```", 1)[0].strip() for b in readme.split("```bash\n")[1:]]
    test_cmd = next(b for b in blocks if "pytest" in b and b.startswith("pip install"))
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert test_cmd in ci
