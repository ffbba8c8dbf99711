"""A sandboxed worker process that answers one JSON line per request: what a release's worker (backend.Worker) and a
proxy's (proxies/litellm.py) share. The replies come on a pipe of their own (DRIFT_REPLY_FD), since the code the
worker runs may print on stdout; memory is bounded (RLIMIT_AS) and the network is taken away where the kernel allows.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import select
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


@functools.cache
def network_isolation() -> list[str]:
    """The command prefix that takes the worker off the network: `unshare -rn` (a new user and network namespace
    holding only a loopback device) when this kernel allows unprivileged namespaces, else none."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return []
    try:
        ok = subprocess.run([unshare, "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return [unshare, "-rn"] if ok else []


def sandboxed_process(module: str, args: list[str], env: dict[str, str], cwd: Path,
                      memory_mb: int) -> tuple[subprocess.Popen, int]:
    """`python -m module args…` off the network, its address space bounded, with `env` (plus DRIFT_REPLY_FD), from
    `cwd`; and the descriptor its replies are read from."""
    read_fd, write_fd = os.pipe()
    memory = memory_mb * 1024 * 1024

    def bound() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    argv = [*network_isolation(), sys.executable, "-m", module, *args]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={**env, "DRIFT_REPLY_FD": str(write_fd)}, cwd=str(cwd), pass_fds=(write_fd,),
                                preexec_fn=bound, text=True)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return proc, read_fd


def process_cpu_s(pid: int) -> float | None:
    """The CPU seconds (user and system) process `pid` has used so far, from Linux's /proc; None when /proc cannot
    tell (no such process, another system)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # the fields after the command's parenthesised name: utime and stime are the 12th and 13th
            fields = stat.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


@dataclass(eq=False)
class PendingReply:
    """One request sent to a PipelinedProcess, until its reply, or the sentence why none came, is in."""

    what: str  # what the request asks, as a failure's sentence says it ("parse": "did not parse within 20 s")
    timeout_s: float
    sent_at: float
    done: threading.Event = field(default_factory=threading.Event)
    reply: dict | None = None
    error: Exception | None = None
    resend: bool = False  # queued behind a request the process failed: never answered, to be sent to a fresh one


@dataclass(eq=False)
class _Generation:
    """One process of a PipelinedProcess, from its spawn until it fails or is stopped."""

    proc: subprocess.Popen
    fd: int  # its replies
    spawned_at: float
    pending: deque[PendingReply] = field(default_factory=deque)  # in the order they were sent: the order of replies
    hello: dict | None = None  # its first line
    greeted: threading.Event = field(default_factory=threading.Event)  # the hello is in, or the process failed
    error: Exception | None = None  # why it failed before its hello
    last_reply_at: float = 0.0
    greeted_at: float = 0.0
    closed: bool = False  # failed or stopped: nothing more is queued
    sent: set[str] = field(default_factory=set)  # the tags of what it was sent once (PipelinedProcess.call)


class PipelinedProcess:
    """A JSON-line process whose callers' requests wait in its stdin together, answered in order; a thread of its own
    reads the replies and hands each to its caller. Callers that are threads of one process then keep the worker busy:
    with one request at a time, the worker sat idle while a reply's caller waited for the interpreter lock and the next
    caller for it again (a convoy that made a thread pool over cells slower than one thread).

    The first line the process writes is its hello (`hello_problem` says whether it loaded). Each request has its
    deadline from the moment the process could start on it (the previous reply, or the hello). When it passes, or the
    process exits, the process is killed: that request gets `failure` in one sentence, and the requests queued behind
    it, which it never answered, are sent again by their callers to a fresh process (`call`)."""

    def __init__(self, label: str, memory_mb: int, failure: type[Exception], startup_timeout_s: float) -> None:
        self.label, self.memory_mb, self.failure = label, memory_mb, failure
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None
        self.hello: dict = {}  # the current process's hello, once a caller has waited for it
        self.start_s = 0.0
        self._generation: _Generation | None = None
        self._spawned: _Generation | None = None  # the last process started, even one that failed at once
        self._state = threading.Condition()  # guards the generation and its queue
        self._send_lock = threading.Lock()  # requests are written in the order they are queued

    def respawn(self) -> None:
        """Start the process anew (`spawn` with its arguments); called when a request finds none alive."""
        raise NotImplementedError

    def start(self) -> None:
        """Start the process and wait until it has loaded; `failure` in one sentence when it does not."""
        self.respawn()
        self.await_hello()

    def hello_problem(self, hello: dict) -> str | None:
        """The sentence why the process that said `hello` cannot serve, else None."""
        return None if hello.get("ok") else f"{self.label} does not load: {hello.get('error')}"

    def spawn(self, module: str, args: list[str], env: dict[str, str], cwd: Path) -> None:
        """Start `python -m module args…` sandboxed (sandboxed_process), replacing the current process."""
        proc, fd = sandboxed_process(module, args, env, cwd, self.memory_mb)
        generation = _Generation(proc, fd, time.monotonic())
        with self._state:
            previous, self._generation, self.proc, self.hello = self._generation, generation, proc, {}
            self._spawned = generation
        if previous is not None:
            self._close(previous)
        threading.Thread(target=self._read_replies, args=(generation,), name=f"{self.label} replies",
                         daemon=True).start()

    def await_hello(self) -> dict:
        """The current process's hello (started when none is alive); `failure` when it did not load."""
        with self._send_lock:
            generation = self._live_generation()
        generation.greeted.wait()
        if generation.error is not None:
            raise generation.error
        self._note_hello(generation)
        return self.hello

    def call(self, request: dict, timeout_s: float, what: str, once: tuple[str, dict] | None = None) -> dict:
        """The reply to `request`; `failure` in one sentence when the process did not answer it. `once`: (tag,
        fields) added to the request when this process has not been sent `tag` yet (a vocabulary sent once)."""
        while True:
            pending, generation = self._submit(request, timeout_s, what, once)
            pending.done.wait()
            if pending.resend:
                continue
            if pending.error is not None:
                raise pending.error
            self._note_hello(generation)
            assert pending.reply is not None
            return pending.reply

    def cpu_s(self) -> float | None:
        """The CPU seconds (user and system) the current process has used so far, from Linux's /proc; None when no
        process is alive or /proc cannot tell."""
        proc = self.proc
        return process_cpu_s(proc.pid) if proc is not None else None

    def stop(self) -> int | None:
        """Kill the current process; a request it was answering gets `failure`, those behind it go to a fresh one."""
        with self._state:
            generation, self._generation, self.proc = self._generation, None, None
        return self._close(generation) if generation is not None else None

    def _live_generation(self) -> _Generation:
        # (under _send_lock) the current process, started anew when there is none or it exited
        with self._state:
            generation = self._generation
        if generation is None or generation.closed or generation.proc.poll() is not None:
            self.respawn()
            with self._state:
                # the one just started: its reader may already have failed it and cleared _generation (a process
                # that exits at once), and its requests then get that failure's sentence
                generation = self._spawned
            assert generation is not None
        return generation

    def _submit(self, request: dict, timeout_s: float, what: str,
                once: tuple[str, dict] | None) -> tuple[PendingReply, _Generation]:
        with self._send_lock:
            generation = self._live_generation()
            pending = PendingReply(what, timeout_s, time.monotonic())
            with self._state:
                if generation.closed:  # failed meanwhile: to a fresh process, or its sentence if it never started
                    if generation.error is not None:
                        pending.error = generation.error
                    else:
                        pending.resend = True
                    pending.done.set()
                    return pending, generation
                if once is not None and once[0] not in generation.sent:
                    request = {**request, **once[1]}
                    generation.sent.add(once[0])
                generation.pending.append(pending)
                self._state.notify_all()
            try:  # outside _state: a long request may wait for the process to read it, while its replies are read
                assert generation.proc.stdin is not None
                # ASCII JSON: a lone surrogate in model text (invalid UTF-8 decoded with surrogateescape) travels as
                # \udcff
                generation.proc.stdin.write(json.dumps(request) + "\n")
                generation.proc.stdin.flush()
            except (OSError, ValueError):
                pass  # it exited: the reader says so in the sentence of the request it was on
        return pending, generation

    def _note_hello(self, generation: _Generation) -> None:
        with self._state:
            if generation is self._generation and not self.hello and generation.hello is not None:
                self.hello = generation.hello
                self.start_s = generation.greeted_at - generation.spawned_at

    def _read_replies(self, generation: _Generation) -> None:
        """The thread that reads one process's replies, hands each to its request, and fails the process when a
        deadline passes or it exits."""
        try:
            self._read_until_failed(generation)
        except Exception as exc:  # noqa: BLE001 - a reply that is not JSON: the request it was for gets the sentence
            self._fail(generation, f"the {self.label} worker answered what is not a reply ({type(exc).__name__}: "
                                   f"{str(exc)[:200]})", "answer")
        finally:
            os.close(generation.fd)

    def _read_until_failed(self, generation: _Generation) -> None:
        buffer = bytearray()
        while True:
            with self._state:
                while generation.hello is not None and not generation.pending and not generation.closed:
                    self._state.wait()
                if generation.hello is not None and not generation.pending:
                    return  # stopped while idle
                if generation.hello is None:
                    what, timeout_s, since = "start", self.startup_timeout_s, generation.spawned_at
                else:
                    head = generation.pending[0]
                    what, timeout_s = head.what, head.timeout_s
                    since = max(head.sent_at, generation.last_reply_at)
            remaining = since + timeout_s - time.monotonic()
            ready = remaining > 0 and select.select([generation.fd], [], [], remaining)[0]
            if not ready:
                self._fail(generation, f"the {self.label} worker did not {what} within {timeout_s:.0f} s", what)
                return
            chunk = os.read(generation.fd, 1 << 16)
            if not chunk:
                code = self._close(generation)
                self._fail(generation, f"the {self.label} worker exited during {what} (status {code}; memory "
                                       f"limit {self.memory_mb} MB)", what)
                return
            buffer += chunk
            if b"\n" not in chunk:
                continue
            *lines, rest = bytes(buffer).split(b"\n")
            buffer = bytearray(rest)
            for line in lines:
                if not self._deliver(generation, json.loads(line)):
                    return

    def _deliver(self, generation: _Generation, reply: dict) -> bool:
        """Hand `reply` to the request it answers (the first line: the hello); False when the process failed."""
        with self._state:
            generation.last_reply_at = time.monotonic()
            if generation.hello is None:
                generation.hello, generation.greeted_at = reply, generation.last_reply_at
                problem = self.hello_problem(reply)
                if problem is None:
                    generation.greeted.set()
                    self._state.notify_all()
                    return True
            elif generation.pending:
                answered = generation.pending.popleft()
                answered.reply = reply
                answered.done.set()
                return True
            else:
                problem = f"the {self.label} worker wrote a reply nobody asked for"
        self._fail(generation, problem, "start")
        return False

    def _fail(self, generation: _Generation, sentence: str, what: str) -> None:
        """Kill the process: the request it was on (every request, when it failed to start) gets `sentence`."""
        error = self.failure(sentence)
        with self._state:
            generation.closed = True
            if what == "start":  # set with `closed`: a request queued from now on gets this sentence (_submit)
                generation.error = error
            failed = list(generation.pending)
            generation.pending.clear()
            if self._generation is generation:
                self._generation, self.proc = None, None
        self._close(generation)
        generation.greeted.set()
        for position, pending in enumerate(failed):
            if position == 0 or what == "start":
                pending.error = error
            else:
                pending.resend = True
            pending.done.set()

    def _close(self, generation: _Generation) -> int:
        """Kill the process (its reader then reads the end of its replies); its exit status."""
        with self._state:
            generation.closed = True
            self._state.notify_all()
        proc = generation.proc
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except (OSError, ValueError):
            pass  # a caller's write was cut off by the kill
        return code
