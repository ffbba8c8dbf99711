"""Several threads asking one worker process at once (engine/serving/real/process.py PipelinedProcess): each gets its
own reply; a request the process hangs on or dies during gets its one sentence, and the requests queued behind it are
answered by a fresh process.

The worker here is a small JSON-line process of the test's own (the protocol of a release's worker: a hello line,
then one reply per request line on DRIFT_REPLY_FD); the release workers' own hangs and crashes are
tests/test_hostile_workers.py's. Every wait is on a condition, never a fixed sleep.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.errors import ExplorerError
from engine.serving.real.process import PipelinedProcess

ECHO_WORKER = '''
import json, os, select, sys
replies = os.fdopen(int(os.environ["DRIFT_REPLY_FD"]), "w", buffering=1)
if sys.argv[1:] == ["broken"]:
    replies.write(json.dumps({"ok": False, "error": "ImportError: no such release"}) + "\\n")
    sys.exit(0)
replies.write(json.dumps({"ok": True}) + "\\n")
for line in sys.stdin:
    request = json.loads(line)
    if request["op"] == "hang":
        select.select([], [], [])  # answers nothing, as a job in an endless loop
    if request["op"] == "die":
        os._exit(3)
    replies.write(json.dumps({"ok": True, "value": request.get("value"), "pid": os.getpid(),
                              "vocab": request.get("vocab")}) + "\\n")
'''
CONDITION_TIMEOUT_S = 60.0


class EchoFailure(ExplorerError):
    pass


class Echo(PipelinedProcess):
    def __init__(self, folder: Path, *args: str) -> None:
        super().__init__("echo", 512, EchoFailure, CONDITION_TIMEOUT_S)
        self.folder, self.args = folder, list(args)

    def respawn(self) -> None:
        self.spawn("echo_worker", self.args, {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(self.folder)}, self.folder)

    def ask(self, op: str, value: object = None, timeout_s: float = CONDITION_TIMEOUT_S,
            once: tuple[str, dict] | None = None) -> dict:
        return self.call({"op": op, "value": value}, timeout_s, op, once)


@pytest.fixture
def echo(tmp_path):
    (tmp_path / "echo_worker.py").write_text(ECHO_WORKER)
    process = Echo(tmp_path)
    yield process
    process.stop()


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll `condition` until it holds (a guard against a hang, not a delay)."""
    deadline = time.monotonic() + CONDITION_TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def in_thread(ask: Callable[[], dict]) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["reply"] = ask()
        except EchoFailure as err:
            outcome["error"] = str(err)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def queued(echo: Echo) -> int:
    generation = echo._generation
    return len(generation.pending) if generation is not None else 0


def test_threads_asking_together_each_get_their_own_reply(echo):
    results: dict[int, list] = {}

    def asker(n: int) -> None:
        results[n] = [echo.ask("echo", [n, i])["value"] for i in range(20)]

    threads = [threading.Thread(target=asker, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(CONDITION_TIMEOUT_S)
    assert results == {n: [[n, i] for i in range(20)] for n in range(6)}
    assert echo.hello == {"ok": True}


def test_a_hung_request_is_one_sentence_and_the_requests_behind_it_go_to_a_fresh_process(echo):
    first = echo.ask("echo", 0)["pid"]
    echo.proc.send_signal(signal.SIGSTOP)  # the next request waits in its stdin, then is not answered
    hung, hung_outcome = in_thread(lambda: echo.ask("hang", timeout_s=2))
    wait_for(lambda: queued(echo) == 1, "the hung request to be queued")
    behind, behind_outcome = in_thread(lambda: echo.ask("echo", "behind"))
    wait_for(lambda: queued(echo) == 2 or "reply" in behind_outcome, "the second request to be queued")
    hung.join(CONDITION_TIMEOUT_S)
    behind.join(CONDITION_TIMEOUT_S)
    assert hung_outcome == {"error": "the echo worker did not hang within 2 s"}
    assert behind_outcome["reply"]["value"] == "behind" and behind_outcome["reply"]["pid"] != first
    with pytest.raises(ProcessLookupError):
        os.kill(first, 0)  # killed and reaped, not left behind


def test_a_process_that_dies_mid_request_is_one_sentence_and_the_next_request_a_fresh_process(echo):
    first = echo.ask("echo", 0)["pid"]
    with pytest.raises(EchoFailure, match=r"^the echo worker exited during die \(status 3; memory limit 512 MB\)$"):
        echo.ask("die")
    assert echo.proc is None
    assert echo.ask("echo", 1)["pid"] != first


def test_what_is_sent_once_goes_once_to_each_process(echo):
    vocab = ("v1", {"vocab": {"added": {"<think>": 5}}})
    assert echo.ask("echo", 0, once=vocab)["vocab"] == {"added": {"<think>": 5}}
    assert echo.ask("echo", 1, once=vocab)["vocab"] is None
    echo.stop()
    assert echo.ask("echo", 2, once=vocab)["vocab"] == {"added": {"<think>": 5}}


def test_a_process_that_does_not_load_fails_every_request_queued_on_it(tmp_path):
    (tmp_path / "echo_worker.py").write_text(ECHO_WORKER)
    broken = Echo(tmp_path, "broken")
    with pytest.raises(EchoFailure, match=r"^echo does not load: ImportError: no such release$"):
        broken.await_hello()
    threads = [in_thread(lambda: broken.ask("echo", 1)) for _ in range(3)]
    for thread, _ in threads:
        thread.join(CONDITION_TIMEOUT_S)
    assert [outcome for _, outcome in threads] == [{"error": "echo does not load: ImportError: no such release"}] * 3
    broken.stop()


class FailedByItsReader(Echo):
    """A respawn that returns only once the reader has failed the process it started (a worker that exits at once,
    read before the caller reads the new process back)."""

    def respawn(self) -> None:
        super().respawn()
        with self._state:
            started = self._generation
        assert started is not None
        started.greeted.wait(CONDITION_TIMEOUT_S)
        assert started.closed


def test_a_process_that_fails_before_its_caller_looks_is_that_requests_sentence(tmp_path):
    (tmp_path / "echo_worker.py").write_text(ECHO_WORKER)
    broken = FailedByItsReader(tmp_path, "broken")
    with pytest.raises(EchoFailure, match=r"^echo does not load: ImportError: no such release$"):
        broken.ask("echo", 1)
    broken.stop()


def test_the_reply_reader_thread_ends_with_its_process(echo):
    echo.ask("echo", 0)
    readers = [t for t in threading.enumerate() if t.name == "echo replies"]
    assert len(readers) == 1
    echo.stop()
    readers[0].join(CONDITION_TIMEOUT_S)
    assert not readers[0].is_alive()

