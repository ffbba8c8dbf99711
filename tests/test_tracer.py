"""The line tracer a release's worker runs at a break (engine/serving/real/tracer.py), on a module of the test's own
under its root: which string locals changed at which line. Locals compared whole at each line (in C) record the same
edits as compared one by one: an equal string rebuilt is no edit, a value whose == raises is compared local by
local."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from engine.serving.real.tracer import Tracer

SOURCE = '''\
class Refuses:
    """== raises, as a numpy array's truth value does."""

    def __eq__(self, other):
        raise ValueError("ambiguous")

    __hash__ = None


def parse(text):
    odd = Refuses()
    head = text[:5]
    same = "".join(["ab", "c"])
    same = "".join(["a", "bc"])
    count = 1
    count = 2
    odd, head = Refuses(), head.upper()
    tail = None
    tail = text[6:]
    return head + tail
'''


def test_the_edits_of_each_line(tmp_path: Path) -> None:
    (tmp_path / "parser.py").write_text(SOURCE)
    spec = importlib.util.spec_from_file_location("drift_tracer_case", tmp_path / "parser.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tracer = Tracer(str(tmp_path), "hello world")
    tracer.start()
    try:
        answer = module.parse("hello world")
    finally:
        tracer.stop()
    assert answer == "HELLOworld"
    report = tracer.report(tmp_path)
    assert [(e["line"], e["variable"], e["kind"], e["before"], e["after"]) for e in report["edits"]] == [
        (12, "head", "set", None, "hello"),
        (13, "same", "set", None, "abc"),  # line 14 rebuilds an equal string: no edit
        (17, "head", "string", "hello", "HELLO"),  # beside a local whose == raises
        (19, "tail", "set", None, "world"),
        (20, "return of parse", "set", None, "HELLOworld"),
    ]
    assert report["lines"]["parser.py"] == list(range(11, 21))
