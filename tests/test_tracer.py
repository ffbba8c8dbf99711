"""The line tracer a release's worker runs at a break (engine/serving/real/tracer.py), on a module of the test's own
under its root: which string locals changed at which line. Locals compared whole at each line (in C) record the same
edits as compared one by one: an equal string rebuilt is no edit, a value whose == raises is compared local by
local. Compared only after the lines that can bind a local, they record the same edits as after every line."""

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


def _traced(tmp_path: Path, source: str, module_name: str) -> tuple[str, dict]:
    """`parse("hello world")` of `source`, a module under the tracer's root, traced: its answer and the report."""
    (tmp_path / "parser.py").write_text(source)
    spec = importlib.util.spec_from_file_location(module_name, tmp_path / "parser.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tracer = Tracer(str(tmp_path), "hello world")
    tracer.start()
    try:
        answer = module.parse("hello world")
    finally:
        tracer.stop()
    return answer, tracer.report(tmp_path)


def test_the_edits_of_each_line(tmp_path: Path) -> None:
    answer, report = _traced(tmp_path, SOURCE, "drift_tracer_case")
    assert answer == "HELLOworld"
    assert [(e["line"], e["variable"], e["kind"], e["before"], e["after"]) for e in report["edits"]] == [
        (12, "head", "set", None, "hello"),
        (13, "same", "set", None, "abc"),  # line 14 rebuilds an equal string: no edit
        (17, "head", "string", "hello", "HELLO"),  # beside a local whose == raises
        (19, "tail", "set", None, "world"),
        (20, "return of parse", "set", None, "HELLOworld"),
    ]
    assert report["lines"]["parser.py"] == list(range(11, 21))


BINDINGS = '''\
def parse(text):
    words = []
    for word in text.split():
        words.append(word)
    if (first := words[0]) == "hello":
        first += "!"
    joined = (
        first
        + words[1]
    )
    problem = number(text)
    del problem
    return shouted(joined)


def shouted(text):
    def shout():
        nonlocal text
        text = text.upper()

    shout()
    check(text)
    return text


def number(text):
    try:
        return int(text)
    except ValueError as err:
        return str(err)[:7]


def check(value):
    return len(value)
'''


def test_every_way_a_line_binds_a_local(tmp_path: Path) -> None:
    """The tracer compares a frame's locals only after a line that can bind one (tracer._binding_lines): a loop's
    target, a walrus, an augmented assignment, an exception's name, a statement over several lines, `del`; and after
    every line of a function whose variable a closure rebinds (`shout()` changes `text` on line 21). The same edits as
    a comparison after every line."""
    answer, report = _traced(tmp_path, BINDINGS, "drift_tracer_bindings")
    assert answer == "HELLO!WORLD"
    assert [(e["line"], e["variable"], e["kind"], e["before"], e["after"]) for e in report["edits"]] == [
        (3, "word", "set", None, "hello"),
        (3, "word", "string", "hello", "world"),
        (5, "first", "set", None, "hello"),
        (6, "first", "string", "hello", "hello!"),
        (7, "joined", "set", None, "hello!world"),  # bound on its first line, after its last ran
        (30, "return of number", "set", None, "invalid"),
        (11, "problem", "set", None, "invalid"),
        (19, "text", "string", "hello!world", "HELLO!WORLD"),  # in shout's frame
        (21, "text", "string", "hello!world", "HELLO!WORLD"),  # in shouted's, whose line 21 binds nothing itself
        (13, "return of parse", "set", None, "HELLO!WORLD"),
    ]
    assert report["lines"]["parser.py"] == [2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 17, 19, 21, 22, 23, 27, 28, 29, 30, 34]
