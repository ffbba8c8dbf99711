"""The package works from anywhere: `python -m engine` finds its data files relative to the package, not the
working directory, and pyproject.toml declares the installed `drift-matrix` command (`pip install -e .`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from engine.cli import main

ROOT = Path(__file__).resolve().parent.parent


def test_python_m_engine_runs_from_another_directory(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # what an editable install puts on sys.path
    result = subprocess.run([sys.executable, "-m", "engine", "matrix", "--models", "qwen3.5", "--scenarios",
                             "tool-call", "--engines", "raw", "--json", "-"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)  # a bound, however loaded
    assert result.returncode == 0, result.stderr
    cell = json.loads(result.stdout)["cells"][0]
    assert (cell["model"], cell["scenario"], cell["status"]) == ("qwen3.5", "tool-call", "holds")
    assert list(tmp_path.iterdir()) == []  # nothing written to the working directory


def test_pyproject_declares_the_command_and_the_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["scripts"] == {"drift-matrix": "engine.cli:main"}
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["engine", "engine.*"]
    assert project["tool"]["setuptools"]["dynamic"]["dependencies"] == {"file": ["requirements.txt"]}


def test_the_command_is_named_as_started(monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["/venv/bin/drift-matrix", "--help"])
    try:
        main(["--help"])
    except SystemExit:
        pass
    assert capsys.readouterr().out.startswith("usage: drift-matrix ")
