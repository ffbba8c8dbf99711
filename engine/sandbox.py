"""User-supplied chat templates rendered in a separate worker process, under limits.

Why a process: an uploaded template is someone else's code. transformers' Jinja sandbox (reused here through
`JinjaRenderer`) stops access to Python internals, but not a loop that never ends, a string of gigabytes or a
recursion that exhausts the stack, and a thread cannot be stopped from outside. So templates compile and render in
a long-lived worker (`python -c ...` speaking over pipes), which the caller kills when a limit is hit:

| limit | default | env var | enforced |
|---|---|---|---|
| wall-clock time per compile or render | 5 s | `DRIFT_RENDER_TIMEOUT_S` | by the caller: the worker is killed |
| output size | 2,000,000 characters | `DRIFT_RENDER_MAX_CHARS` | in the worker, as each output chunk is produced |
| recursion depth | 200 nested macro calls / recursive loop levels | `DRIFT_RENDER_MAX_DEPTH` | in the worker |
| memory | 1024 MB address space | `DRIFT_RENDER_MEMORY_MB` | `setrlimit(RLIMIT_AS)` in the worker |
| worker start (imports transformers) | 60 s | `DRIFT_RENDER_STARTUP_TIMEOUT_S` | by the caller; not render time |
| render workers kept (one per template, ~65 MB each) | 8 | `DRIFT_RENDER_MAX_WORKERS` | oldest idle one stopped |

Each template renders in a worker of its own, so one that runs into the time limit never makes another template's
renders wait. Within one `render_scope()` (a page view, a `check` run, an upload's validation) a template that hit a
limit is not rendered again: the next render of it raises the same limit at once, so a view pays a limit once.

After any limit the worker is killed and restarted; the caller gets `RenderLimitExceeded` whose message is one
sentence naming the template file, the model and the limit. A normal render costs about a millisecond more than
in-process (one pipe round trip). Render workers are forked from a zygote (`_Zygote`: a process that has made the
imports, about a second of CPU, and runs no template), so only the first worker of a process pays the imports.

Requests go to the worker pickled (the parent trusts its own data); replies come back as JSON, never pickle, so
nothing the template controls is ever unpickled in the caller.

API:
    RenderLimits / RenderLimits.from_env()      the limits above
    SandboxedRenderer(source, model=..., source_path=..., special_tokens=..., limits=...)
                                                the Renderer protocol (engine/render/__init__.py); its results are
                                                byte-identical to JinjaRenderer's, errors carry the same sentences
    RenderLimitExceeded(RenderError)            `.limit` is "time" | "output" | "depth" | "memory"
    TemplateSyntaxProblem(RenderError)          the template does not parse; `.source_line`, `.column`, `.detail`
    run_bounded(function, *args, ...)           one call of an allow-listed engine function in a fresh worker
                                                (uploads use it to load tokenizer files under time/memory limits)
    render_scope()                              context manager: one view; a template that hit a limit inside it
                                                is not rendered again there
    shutdown_workers()                          stop every worker this process started
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import pickle
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from engine.errors import ExplorerError, RenderError, is_panic
from engine.render.constructs import Construct, ConstructTable, Evaluation
from engine.types import Rendered, RenderRequest

ROOT = Path(__file__).resolve().parent.parent
_HEADER = struct.Struct(">I")
# Functions `run_bounded` may run in a worker: a request can never name arbitrary code.
_CALLABLE = frozenset({
    "engine.uploads:inspect_tokenizer_json",
    "engine.uploads:inspect_tiktoken_model",
})


@dataclass(frozen=True)
class RenderLimits:
    """Limits for one compile or render of a user's template (see the module docstring for the env vars)."""

    timeout_s: float = 5.0
    max_chars: int = 2_000_000
    max_depth: int = 200
    memory_mb: int = 1024
    startup_timeout_s: float = 60.0
    max_workers: int = 8

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ExplorerError(f"render limit {f.name} must be a positive number, got {value!r}")
        if self.max_depth > 1000:
            # Every level costs several Python frames and some C stack; beyond this the worker could crash.
            raise ExplorerError(f"render limit max_depth must be at most 1000, got {self.max_depth}")
        if self.memory_mb < 256:
            raise ExplorerError(f"render limit memory_mb must be at least 256 (the worker imports transformers), "
                                f"got {self.memory_mb}")

    @classmethod
    def from_env(cls) -> RenderLimits:
        """The defaults, overridden by DRIFT_RENDER_TIMEOUT_S, _MAX_CHARS, _MAX_DEPTH, _MEMORY_MB, _STARTUP_TIMEOUT_S"""
        values = env_overrides(cls, "DRIFT_RENDER_")
        try:
            return cls(**values)
        except ExplorerError as err:
            raise ExplorerError(f"{err} (from the DRIFT_RENDER_* environment variables)") from None


def env_overrides(limits: type, prefix: str) -> dict[str, Any]:
    """The fields of a limits dataclass set in the environment as PREFIX + FIELD (seconds for names ending _s, whole
    numbers otherwise); a value that is not a number is one sentence naming the variable."""
    values: dict[str, Any] = {}
    for f in fields(limits):
        name = f"{prefix}{f.name.upper()}"
        raw = os.environ.get(name)
        if raw is None or not raw.strip():
            continue
        kind = float if f.name.endswith("_s") else int
        try:
            values[f.name] = kind(raw)
        except ValueError:
            number = "a number" if kind is float else "a whole number"
            raise ExplorerError(f"environment variable {name} must be {number} greater than 0, got {raw!r}") from None
    return values


class RenderLimitExceeded(RenderError):
    """A compile or render was stopped by a limit; `limit` says which ("time", "output", "depth", "memory")."""

    def __init__(self, message: str, *, limit: str, model: str = "", path: str = "",
                 source_line: int | None = None) -> None:
        super().__init__(message, model=model, path=path, source_line=source_line)
        self.limit = limit


class TemplateSyntaxProblem(RenderError):
    """The template does not parse. The message is JinjaRenderer's; `detail` is Jinja's own words, `column` the
    1-based column of the offending token on `source_line` (None when Jinja gives no position)."""

    def __init__(self, message: str, *, detail: str, column: int | None, model: str = "", path: str = "",
                 source_line: int | None = None) -> None:
        super().__init__(message, model=model, path=path, source_line=source_line)
        self.detail = detail
        self.column = column


# Template key -> the limit it hit in the current scope (None outside any scope: every render runs).
_tripped: ContextVar[dict[str, RenderLimitExceeded] | None] = ContextVar("sandbox_tripped", default=None)


@contextmanager
def render_scope() -> Iterator[dict[str, RenderLimitExceeded]]:
    """One view (a page run, a `check`, an upload's validation): a template that hits a limit inside it is not
    rendered again inside it; its later renders raise at once, saying so. Yields the limits hit so far, by
    template key."""
    tripped: dict[str, RenderLimitExceeded] = {}
    token = _tripped.set(tripped)
    try:
        yield tripped
    finally:
        _tripped.reset(token)


class _Timeout(Exception):
    pass


class _WorkerGone(Exception):
    pass


# ---- the caller's side --------------------------------------------------------------------------------------


class _Worker:
    """One worker process. `lock` serialises requests: the worker handles one at a time."""

    def __init__(self, memory_mb: int, preload_render: bool) -> None:
        self.memory_mb = memory_mb
        self.preload_render = preload_render
        self.lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._ready = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        forked = _ZYGOTE.fork_worker(self.memory_mb) if self.preload_render else None
        if forked is not None:
            self._proc = forked
        else:
            code = "from engine.sandbox import _worker_main; _worker_main()"
            argv = [sys.executable, "-c", code, str(self.memory_mb), "1" if self.preload_render else "0",
                    str(os.getpid())]
            # Started from one long-lived thread: the worker asks the kernel to kill it when the thread that started
            # it ends (PR_SET_PDEATHSIG), and a web server's request threads come and go.
            self._proc = _SPAWNER.submit(
                subprocess.Popen, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                cwd=str(ROOT), env=_worker_env(), close_fds=True,
            ).result()
        assert self._proc.stdin is not None and self._proc.stdout is not None
        os.set_blocking(self._proc.stdin.fileno(), False)
        self._ready = False

    def ensure_ready(self, startup_timeout_s: float) -> None:
        if self._proc is None or self._proc.poll() is not None:
            self.start()
        if self._ready:
            return
        assert self._proc is not None and self._proc.stdout is not None
        try:
            reply = _read_frame(self._proc.stdout.fileno(), time.monotonic() + startup_timeout_s, 1 << 16)
        except (_Timeout, _WorkerGone) as err:
            code = self.kill()
            reason = f"did not start within {startup_timeout_s:.1f} s" if isinstance(err, _Timeout) else \
                f"exited while starting (exit status {code})"
            raise ExplorerError(f"the template sandbox worker {reason}; with a {self.memory_mb} MB memory limit "
                                "it may be too small to import transformers") from None
        if reply.get("ready") is not True:
            self.kill()
            raise ExplorerError(f"the template sandbox worker failed to start: {reply.get('error', reply)}")
        self._ready = True

    def exchange(self, request: dict, timeout_s: float, max_reply_bytes: int) -> dict:
        """Send one request and wait for its reply until `timeout_s` has passed (raises _Timeout, _WorkerGone)."""
        assert self._proc is not None and self._proc.stdin is not None and self._proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        payload = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        _write_all(self._proc.stdin.fileno(), _HEADER.pack(len(payload)) + payload, deadline)
        return _read_frame(self._proc.stdout.fileno(), deadline, max_reply_bytes)

    def kill(self) -> int | None:
        """Stop the process now; returns its exit status."""
        proc, self._proc, self._ready = self._proc, None, False
        if proc is None:
            return None
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        return code

    def restart(self) -> None:
        self.kill()
        # Started now, so the next caller does not wait for a whole process start on top of its render.
        self.start()


# Keep native libraries single-threaded in the worker: every extra thread reserves stack and malloc arenas,
# which count against RLIMIT_AS.
_WORKER_ENV = {
    "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "RAYON_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false", "MALLOC_ARENA_MAX": "2", "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1",
}
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-spawner")


def _worker_env() -> dict[str, str]:
    env = {**os.environ, **_WORKER_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return env


# clone(2) with CLONE_PARENT: the zygote's child is the caller's child (see _Zygote). The system call's number by
# machine; elsewhere render workers start as plain processes.
_CLONE_PARENT = 0x00008000
_SYS_CLONE = {"x86_64": 56, "aarch64": 220}


def _address_space(pid: int) -> int:
    with open(f"/proc/{pid}/statm", encoding="ascii") as statm:
        return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


class _ForkedProcess:
    """A render worker the zygote forked, waited for by this process as subprocess.Popen waits for its child (the
    part of Popen's interface _Worker uses: pid, stdin, stdout, poll, kill, wait)."""

    def __init__(self, pid: int, stdin_fd: int, stdout_fd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.stdin = os.fdopen(stdin_fd, "wb")
        self.stdout = os.fdopen(stdout_fd, "rb")

    def _reap(self, flags: int) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, flags)
            except ChildProcessError:  # reaped elsewhere: its status is lost, as subprocess.Popen reports it
                pid, status = self.pid, 0
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> int | None:
        return self._reap(os.WNOHANG)

    def wait(self) -> int:
        code = self._reap(0)
        assert code is not None
        return code

    def kill(self) -> None:
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)


class _Zygote:
    """A process that has made the imports a render worker needs (transformers' chat-template code, the bounded
    renderer: about a second of CPU) and forks each new render worker from itself, so a worker starts in
    milliseconds. It runs no template and holds nothing of the caller's: it starts as a worker does, from the same
    code, and stops before the first request. Each fork is a clone(2) with CLONE_PARENT, so the worker is this
    process's own child, killed and waited for exactly as a worker started with subprocess is; its pipes are made
    here and handed over with SCM_RIGHTS. Where any of this fails, workers start as plain processes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.broken = os.uname().machine not in _SYS_CLONE

    def fork_worker(self, memory_mb: int) -> _ForkedProcess | None:
        with self.lock:
            if self.broken:
                return None
            try:
                if self.proc is None or self.proc.poll() is not None:
                    self._start()
            except (OSError, _Timeout, _WorkerGone):
                self._stop()
                self.broken = True  # it cannot start here: this process's workers start as plain processes
                return None
            try:
                assert self.proc is not None
                if memory_mb * 1024 * 1024 < _address_space(self.proc.pid) + (64 << 20):
                    return None  # a limit below what the imports take: a plain worker says it cannot start
                return self._fork(memory_mb)
            except (OSError, _Timeout, _WorkerGone, struct.error):
                self._stop()  # this worker starts as a plain process; the next one asks a fresh zygote
                return None

    def forget(self) -> None:
        """In a child forked from this process: the zygote and its socket are the parent's, never this one's."""
        if self.sock is not None:
            self.sock.close()  # this process's copy only
        self.proc, self.sock, self.lock = None, None, threading.Lock()

    def _start(self) -> None:
        self._stop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        code = "from engine.sandbox import _zygote_main; _zygote_main()"
        argv = [sys.executable, "-c", code, str(theirs.fileno()), str(os.getpid())]
        try:
            # From the spawner thread, as every worker: the workers' parent is the thread that started the zygote.
            self.proc = _SPAWNER.submit(
                subprocess.Popen, argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, cwd=str(ROOT), env=_worker_env(), pass_fds=(theirs.fileno(),),
            ).result()
        finally:
            theirs.close()
        self.sock = ours
        try:
            startup_timeout_s = RenderLimits.from_env().startup_timeout_s
        except ExplorerError:  # a malformed DRIFT_RENDER_* is the render's to report, not the zygote's
            startup_timeout_s = RenderLimits().startup_timeout_s
        if self._read(1, startup_timeout_s) != b"R":
            raise _WorkerGone()

    def _fork(self, memory_mb: int) -> _ForkedProcess:
        assert self.sock is not None
        worker_in, stdin_fd = os.pipe()
        stdout_fd, worker_out = os.pipe()
        try:
            socket.send_fds(self.sock, [struct.pack(">I", memory_mb)], [worker_in, worker_out])
            (pid,) = struct.unpack(">q", self._read(8, 60.0))
        except BaseException:
            os.close(stdin_fd)
            os.close(stdout_fd)
            raise
        finally:
            os.close(worker_in)
            os.close(worker_out)
        if pid <= 0:
            os.close(stdin_fd)
            os.close(stdout_fd)
            raise OSError(-pid, "the zygote could not fork a worker")
        return _ForkedProcess(pid, stdin_fd, stdout_fd)

    def _read(self, size: int, timeout_s: float) -> bytes:
        assert self.sock is not None
        return _read_exact(self.sock.fileno(), size, time.monotonic() + timeout_s)

    def _stop(self) -> None:
        proc, sock, self.proc, self.sock = self.proc, self.sock, None, None
        if sock is not None:
            sock.close()
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


_ZYGOTE = _Zygote()
os.register_at_fork(after_in_child=_ZYGOTE.forget)
# Render workers by (memory limit, template key): each template renders in a worker of its own, so a slow template
# never queues another's renders. At most `max_workers` are kept (least recently used idle ones are stopped) and one
# spare per memory limit is started ahead, so a template seen for the first time does not wait for a process start.
_pool: OrderedDict[tuple[int, str], _Worker] = OrderedDict()
_spares: dict[int, _Worker] = {}
_pool_lock = threading.Lock()


def _render_worker(memory_mb: int, key: str, max_workers: int) -> _Worker:
    with _pool_lock:
        worker = _pool.get((memory_mb, key))
        if worker is not None:
            _pool.move_to_end((memory_mb, key))
            return worker
        worker = _spares.pop(memory_mb, None) or _Worker(memory_mb, preload_render=True)
        _pool[(memory_mb, key)] = worker
        idle = [k for k, w in _pool.items() if k != (memory_mb, key) and not w.lock.locked()]
        stopped = [_pool.pop(k) for k in idle[: max(0, len(_pool) - max_workers)]]
        spare = _spares[memory_mb] = _Worker(memory_mb, preload_render=True)
    spare.start()
    for old in stopped:
        if old.lock.acquire(blocking=False):  # taken again since: it stops when its current render ends
            try:
                old.kill()
            finally:
                old.lock.release()
    return worker


def shutdown_workers() -> None:
    """Stop every worker this process started (they also exit by themselves when this process ends)."""
    with _pool_lock:
        workers = [*_pool.values(), *_spares.values()]
        _pool.clear()
        _spares.clear()
    for worker in workers:
        with worker.lock:
            worker.kill()
    with _ZYGOTE.lock:
        _ZYGOTE._stop()


atexit.register(shutdown_workers)


def _wait(fd: int, events: int, deadline: float | None) -> None:
    """Block until `fd` is ready for `events` (poll: select's 1024-descriptor limit would break a busy server)."""
    poller = select.poll()
    poller.register(fd, events | select.POLLHUP | select.POLLERR)
    while True:
        if deadline is None:
            timeout_ms = None
        else:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Timeout()
            timeout_ms = max(1, int(remaining * 1000))
        if poller.poll(timeout_ms):
            return


def _write_all(fd: int, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    while view:
        _wait(fd, select.POLLOUT, deadline)
        try:
            written = os.write(fd, view[: 1 << 20])
        except BlockingIOError:
            continue
        except OSError:
            raise _WorkerGone() from None
        view = view[written:]


def _read_exact(fd: int, size: int, deadline: float | None) -> bytes:
    chunks: list[bytes] = []
    needed = size
    while needed:
        if deadline is not None:
            _wait(fd, select.POLLIN, deadline)
        chunk = os.read(fd, min(needed, 1 << 20))
        if not chunk:
            raise _WorkerGone()
        chunks.append(chunk)
        needed -= len(chunk)
    return b"".join(chunks)


def _read_frame(fd: int, deadline: float, max_bytes: int) -> dict:
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    if size > max_bytes:
        raise _WorkerGone()  # a reply this large is not one the worker's code would write
    try:
        reply = json.loads(_read_exact(fd, size, deadline).decode("utf-8", "surrogatepass"))
    except ValueError:
        raise _WorkerGone() from None
    if not isinstance(reply, dict):
        raise _WorkerGone()
    return reply


def _max_reply_bytes(max_chars: int) -> int:
    # Text (at most 6 bytes a character as JSON) plus two run-length lists in the worst case of one run a character.
    return 40 * max_chars + (1 << 20)


def _expand_runs(runs: list, length: int, what: str) -> tuple[int, ...]:
    out: list[int] = []
    if len(runs) % 2:
        raise ValueError(what)
    for value, count in zip(runs[::2], runs[1::2]):
        if not isinstance(value, int) or not isinstance(count, int) or count < 0:
            raise ValueError(what)
        out.extend([value] * count)
    if len(out) != length:
        raise ValueError(what)
    return tuple(out)


class SandboxedRenderer:
    """A user's Jinja chat template, compiled and rendered in the sandbox worker (engine.render.Renderer).

    Compiles at construction, so a template that does not parse raises TemplateSyntaxProblem here, as
    JinjaRenderer raises RenderError.
    """

    def __init__(self, source: str, *, model: str, source_path: str, special_tokens: dict[str, str] | None = None,
                 limits: RenderLimits | None = None, worker: str | None = None) -> None:
        """`worker`: a name for the worker process to render in, shared by every template given that name (a batch
        such as the zoo scan pays one worker start instead of one per template; a limit still restarts it). None:
        a worker of this template's own."""
        self.model = model
        self.source_path = source_path
        self.origin = f"template {model}"
        self.limits = limits or RenderLimits.from_env()
        self._source = source
        self._special_tokens = dict(special_tokens or {})
        key_material = json.dumps([source, model, source_path, sorted(self._special_tokens.items())],
                                  ensure_ascii=False)
        self._key = hashlib.sha256(key_material.encode("utf-8", "surrogatepass")).hexdigest()
        self._worker_key = f"shared:{worker}" if worker is not None else self._key
        self._constructs: ConstructTable | None = None
        self._request("compile", {})

    def source_lines(self) -> list[str]:
        return self._source.splitlines()

    @property
    def worker_pid(self) -> int | None:
        """The process id of the worker that renders this template (for tests and status)."""
        worker = _pool.get((self.limits.memory_mb, self._worker_key))
        return worker.pid if worker is not None else None

    def render(self, messages: list[dict], tools: list[dict] | None, *, add_generation_prompt: bool,
               kwargs: dict | None = None) -> Rendered:
        reply = self._request("render", {"messages": messages, "tools": tools,
                                         "add_generation_prompt": add_generation_prompt, "kwargs": kwargs})
        try:
            text = reply["text"]
            if not isinstance(text, str):
                raise ValueError("text")
            return Rendered(
                text=text,
                message_index=_expand_runs(reply["message_index"], len(text), "message_index"),
                source_line=_expand_runs(reply["source_line"], len(text), "source_line"),
                source_path=self.source_path,
                origin=self.origin,
            )
        except (KeyError, TypeError, ValueError) as err:
            raise RenderError(f"{self.source_path} for model {self.model} got a malformed reply from the sandbox "
                              f"worker ({err})", model=self.model, path=self.source_path) from None

    def construct_table(self) -> ConstructTable:
        """The template's constructs, as the worker's instrumented compile lists them (engine.render.constructs)."""
        if self._constructs is None:
            reply = self._request("constructs", {})
            try:
                self._constructs = ConstructTable(
                    tuple(Construct(**{**c, "names": frozenset(c["names"])}) for c in reply["constructs"]),
                    {name: frozenset(read) for name, read in reply["aliases"].items()},
                    {name: tuple(lines) for name, lines in reply["assigned_at"].items()})
            except (KeyError, TypeError, ValueError) as err:
                raise RenderError(f"{self.source_path} for model {self.model} got a malformed reply from the sandbox "
                                  f"worker ({err})", model=self.model, path=self.source_path) from None
        return self._constructs

    def render_counterfactual(self, request: RenderRequest, *, undo_from: int | None = None,
                              undo: frozenset[int] = frozenset(),
                              substitute: dict[int, dict[str, str]] | None = None) -> tuple[str, list[Evaluation]]:
        """As JinjaRenderer.render_counterfactual, in the worker; values that are not text come back as their repr
        (blame compares them, never reads them)."""
        reply = self._request("counterfactual", {
            "messages": request.messages, "tools": request.tools,
            "add_generation_prompt": request.add_generation_prompt, "kwargs": request.kwargs,
            "undo_from": undo_from, "undo": sorted(undo),
            "substitute": {str(k): v for k, v in (substitute or {}).items()}})
        try:
            return reply["text"], [Evaluation(*entry) for entry in reply["evaluations"]]
        except (KeyError, TypeError, ValueError) as err:
            raise RenderError(f"{self.source_path} for model {self.model} got a malformed reply from the sandbox "
                              f"worker ({err})", model=self.model, path=self.source_path) from None

    def _request(self, op: str, extra: dict) -> dict:
        limits = self.limits
        request = {"op": op, "key": self._key, "source": self._source, "model": self.model,
                   "source_path": self.source_path, "special_tokens": self._special_tokens,
                   "max_chars": limits.max_chars, "max_depth": limits.max_depth, **extra}
        tripped = _tripped.get()
        earlier = tripped.get(self._key) if tripped is not None else None
        if earlier is not None:
            raise RenderLimitExceeded(f"{earlier} earlier in this view, so it was not rendered again",
                                      limit=earlier.limit, model=self.model, path=self.source_path,
                                      source_line=earlier.source_line)
        try:
            return self._exchange(op, request)
        except RenderLimitExceeded as err:
            if tripped is not None:
                tripped[self._key] = err
            raise

    def _exchange(self, op: str, request: dict) -> dict:
        limits = self.limits
        worker = _render_worker(limits.memory_mb, self._worker_key, limits.max_workers)
        with worker.lock:
            try:
                worker.ensure_ready(limits.startup_timeout_s)
            except ExplorerError as err:
                # A RenderError, so a matrix cell shows it as its own error instead of failing the whole page.
                raise RenderError(f"{self.source_path} for model {self.model} cannot be rendered: {err}",
                                  model=self.model, path=self.source_path) from None
            try:
                reply = worker.exchange(request, limits.timeout_s, _max_reply_bytes(limits.max_chars))
            except _Timeout:
                worker.restart()
                doing = " while compiling" if op == "compile" else ""
                raise RenderLimitExceeded(
                    f"{self.source_path} for model {self.model} was stopped after {limits.timeout_s:.1f} s{doing} "
                    "(render time limit)", limit="time", model=self.model, path=self.source_path) from None
            except _WorkerGone:
                code = worker.kill()
                worker.start()
                raise RenderError(
                    f"{self.source_path} for model {self.model} crashed the sandbox worker (exit status {code}); "
                    f"the memory limit is {limits.memory_mb} MB", model=self.model, path=self.source_path) from None
            error = reply.get("error")
            if isinstance(error, dict) and error.get("kind") == "limit":
                worker.restart()
        if error is None:
            return reply
        raise _error_from_reply(error, self.model, self.source_path)


def _error_from_reply(error: Any, model: str, path: str) -> RenderError:
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return RenderError(f"{path} for model {model} got a malformed reply from the sandbox worker",
                           model=model, path=path)
    message = error["message"]
    line = error.get("line") if isinstance(error.get("line"), int) else None
    kind = error.get("kind")
    if kind == "limit":
        return RenderLimitExceeded(message, limit=str(error.get("limit")), model=model, path=path, source_line=line)
    if kind == "syntax":
        column = error.get("column") if isinstance(error.get("column"), int) else None
        return TemplateSyntaxProblem(message, detail=str(error.get("detail", "")), column=column, model=model,
                                     path=path, source_line=line)
    return RenderError(message, model=model, path=path, source_line=line)


def run_bounded(function: str, *args: Any, timeout_s: float, memory_mb: int, what: str) -> Any:
    """Run one allow-listed function ("module:name") in a fresh worker under a time and memory limit.

    Returns its JSON result. An ExplorerError it raises comes back as ExplorerError with the same sentence; a
    limit raises RenderLimitExceeded naming `what` (e.g. "tokenizer.json"). The worker exits afterwards, so the
    memory a large file took is returned at once.
    """
    if function not in _CALLABLE:
        raise ExplorerError(f"{function} is not a function the sandbox runs")
    worker = _Worker(memory_mb, preload_render=False)
    try:
        worker.ensure_ready(RenderLimits().startup_timeout_s)
        try:
            reply = worker.exchange({"op": "call", "function": function, "args": args}, timeout_s, 1 << 26)
        except _Timeout:
            raise RenderLimitExceeded(f"{what} could not be loaded within {timeout_s:.1f} s (load time limit)",
                                      limit="time", path=what) from None
        except _WorkerGone:
            code = worker.kill()
            raise RenderLimitExceeded(f"{what} could not be loaded: the worker loading it stopped (exit status "
                                      f"{code}) under the {memory_mb} MB memory limit", limit="memory",
                                      path=what) from None
    finally:
        worker.kill()
    error = reply.get("error")
    if error is None:
        return reply.get("result")
    if isinstance(error, dict) and error.get("kind") == "limit":
        raise RenderLimitExceeded(f"{what} could not be loaded within the {memory_mb} MB memory limit",
                                  limit="memory", path=what)
    if isinstance(error, dict) and error.get("kind") == "panic":
        raise ExplorerError(f"{what} could not be loaded: the library loading it stopped with "
                            f"\"{error.get('message')}\"")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        raise ExplorerError(error["message"])
    raise ExplorerError(f"{what}: the sandbox worker sent a malformed reply")


# ---- the worker's side --------------------------------------------------------------------------------------


class _OutputLimit(Exception):
    def __init__(self, line: int) -> None:
        super().__init__(line)
        self.line = line


class _DepthLimit(Exception):
    pass


class _DepthState:
    depth = 0
    max_depth = 200


def _worker_main() -> None:
    """Entry point of a worker process: `memory_mb preload_render parent_pid` in argv, frames on stdin/stdout."""
    memory_mb, preload, parent = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
    out_fd = os.dup(1)
    os.dup2(2, 1)  # anything printed by libraries goes to stderr, never into the reply stream
    _die_with_parent()
    if os.getppid() != parent:
        return  # the caller died before the kernel was asked to stop us with it
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    state = _WorkerState()
    try:
        if preload:
            state.preload()
    except BaseException as err:  # noqa: BLE001 - reported to the caller, which says the worker cannot start
        _send(out_fd, {"error": f"{type(err).__name__}: {err}"})
        return
    _serve(state, out_fd)


def _zygote_main() -> None:
    """Entry point of the zygote (_Zygote): `socket_fd parent_pid` in argv. Makes a worker's imports, then forks a
    worker for each request on the socket (its memory limit, with the worker's two pipe ends) and answers its pid."""
    sock_fd, parent = int(sys.argv[1]), int(sys.argv[2])
    _die_with_parent()
    if os.getppid() != parent:
        return
    import ctypes
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sock = socket.socket(fileno=sock_fd)
    state = _WorkerState()
    state.preload()
    clone = ctypes.CDLL(None, use_errno=True).syscall
    clone.restype = ctypes.c_long
    number = _SYS_CLONE[os.uname().machine]
    sock.sendall(b"R")
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 4, 2)
        except OSError:
            return
        if len(message) != 4 or len(fds) != 2:
            return  # the caller closed the socket (or is not speaking this protocol)
        (memory_mb,) = struct.unpack(">I", message)
        # Only when this process has one thread, native ones counted (a raw clone copies only the calling thread, so
        # no lock may be held by another): the child returns from the same call with 0.
        zero = ctypes.c_long(0)
        pid = clone(ctypes.c_long(number), ctypes.c_long(_CLONE_PARENT | signal.SIGCHLD), zero, zero, zero, zero) \
            if len(os.listdir("/proc/self/task")) == 1 else -1
        if pid == 0:
            try:
                # What os.fork does in its child: the interpreter's own after-fork step (its lock and thread state
                # made anew, signal state, the at-fork handlers: random reseeded, threading's and logging's locks)
                ctypes.pythonapi.PyOS_AfterFork_Child()
                sock.close()
                _forked_worker_main(state, fds[0], fds[1], memory_mb, parent)
            finally:
                os._exit(0)
        for fd in fds:
            os.close(fd)
        sock.sendall(struct.pack(">q", pid if pid > 0 else -(ctypes.get_errno() or 1)))


def _forked_worker_main(state: _WorkerState, in_fd: int, out_fd: int, memory_mb: int, parent: int) -> None:
    """A render worker forked by the zygote: what _worker_main does after its imports, on the pipes it was given."""
    os.dup2(in_fd, 0)
    os.close(in_fd)
    _die_with_parent()  # the parent is the caller's spawner thread (CLONE_PARENT)
    if os.getppid() != parent:
        return
    import resource

    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    _serve(state, out_fd)


def _serve(state: _WorkerState, out_fd: int) -> None:
    _send(out_fd, {"ready": True})
    while True:
        try:
            header = _read_exact(0, _HEADER.size, None)
        except _WorkerGone:
            return  # the caller closed the pipe
        (size,) = _HEADER.unpack(header)
        try:
            reply = state.handle(pickle.loads(_read_exact(0, size, None)))
        except MemoryError:
            reply = {"error": {"kind": "limit", "limit": "memory", "message": "memory limit"}}
        _send(out_fd, reply)


def _die_with_parent() -> None:
    # Linux: the kernel kills the worker when the process that started it dies, even mid-render.
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _send(fd: int, reply: dict) -> None:
    data = json.dumps(reply, ensure_ascii=False).encode("utf-8", "surrogatepass")
    data = _HEADER.pack(len(data)) + data
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _runs(values: tuple[int, ...]) -> list[int]:
    out: list[int] = []
    for value in values:
        if out and out[-2] == value:
            out[-1] += 1
        else:
            out.extend((value, 1))
    return out


class _WorkerState:
    """Compiled templates by key (a few, most recently used first) and the request handlers."""

    _MAX_TEMPLATES = 8

    def __init__(self) -> None:
        self.templates: OrderedDict[str, Any] = OrderedDict()
        self.renderer_class: Any = None

    def preload(self) -> None:
        from engine.render import jinja

        jinja.transformers_pieces()
        self.renderer_class = _bounded_renderer_class()

    def handle(self, request: dict) -> dict:
        op = request.get("op")
        if op == "call":
            return self.call(request["function"], request["args"])
        if self.renderer_class is None:
            self.preload()
        model, path = request["model"], request["source_path"]
        _DepthState.max_depth = request["max_depth"]
        # Room for the depth limit (about 5 frames a macro level) plus the frames around a render.
        sys.setrecursionlimit(max(1000, request["max_depth"] * 8 + 1000))
        try:
            renderer = self.compiled(request)
            if op == "compile":
                return {"ok": True}
            renderer.max_chars = request["max_chars"]
            if op == "constructs":
                table = renderer.construct_table()
                return {"constructs": [{**vars(c), "names": sorted(c.names)} for c in table.constructs],
                        "aliases": {k: sorted(v) for k, v in table.aliases.items()},
                        "assigned_at": {k: list(v) for k, v in table.assigned_at.items()}}
            if op == "counterfactual":
                text, evaluations = renderer.render_counterfactual(
                    RenderRequest(request["messages"], request["tools"], request["add_generation_prompt"],
                                  request["kwargs"] or {}),
                    undo_from=request["undo_from"], undo=frozenset(request["undo"]),
                    substitute={int(k): v for k, v in request["substitute"].items()})
                return {"text": text, "evaluations": [
                    [e.construct, e.message, _as_reply_value(e.before), _as_reply_value(e.after)]
                    for e in evaluations]}
            rendered = renderer.render(request["messages"], request["tools"],
                                       add_generation_prompt=request["add_generation_prompt"],
                                       kwargs=request["kwargs"])
        except _OutputLimit as err:
            return _limit("output", f"{path} for model {model} was stopped at line {err.line} after producing more "
                          f"than {request['max_chars']:,} characters (output size limit)", err.line)
        except _DepthLimit:
            return _limit("depth", f"{path} for model {model} was stopped: macro calls or recursive loops nested "
                          f"more than {request['max_depth']} deep (recursion depth limit)", None)
        except RecursionError as err:
            line = _line_of(err)
            return _limit("depth", f"{path} for model {model} was stopped{_at(line)}: it recursed too deep for the "
                          f"depth limit of {request['max_depth']} (recursion depth limit)", line)
        except MemoryError as err:
            line = _line_of(err)
            return _limit("memory", f"{path} for model {model} was stopped{_at(line)}: it needed more memory than "
                          f"the {_memory_mb()} MB allowed (memory limit)", line)
        except RenderError as err:
            cause = err.__cause__
            if isinstance(cause, RecursionError):
                return _limit("depth", f"{path} for model {model} was stopped{_at(err.source_line)}: it recursed "
                              f"too deep for the depth limit of {request['max_depth']} (recursion depth limit)",
                              err.source_line)
            if isinstance(cause, MemoryError):
                return _limit("memory", f"{path} for model {model} was stopped{_at(err.source_line)}: it needed more "
                              f"memory than the {_memory_mb()} MB allowed (memory limit)", err.source_line)
            reply: dict[str, Any] = {"kind": "render", "message": _cap(str(err)), "line": err.source_line}
            import jinja2

            if isinstance(cause, jinja2.TemplateSyntaxError):
                line, column = syntax_error_position(request["source"], cause)
                reply.update(kind="syntax", detail=_cap(cause.message or ""), line=line, column=column)
            return {"error": reply}
        except Exception as err:  # noqa: BLE001 - anything else the template's Python raises
            line = _line_of(err)
            return {"error": {"kind": "render", "line": line, "message": _cap(
                f"{path} for model {model} failed{_at(line)}: {type(err).__name__}: {err}")}}
        return {"text": rendered.text, "message_index": _runs(rendered.message_index),
                "source_line": _runs(rendered.source_line)}

    def compiled(self, request: dict) -> Any:
        key = request["key"]
        renderer = self.templates.get(key)
        if renderer is None:
            renderer = self.renderer_class(request["source"], model=request["model"],
                                           source_path=request["source_path"],
                                           special_tokens=request["special_tokens"])
            self.templates[key] = renderer
            if len(self.templates) > self._MAX_TEMPLATES:
                self.templates.popitem(last=False)
                # transformers caches every template it compiled, without bound; start it afresh.
                from engine.render import jinja

                jinja.transformers_pieces()._compile_jinja_template.cache_clear()
        self.templates.move_to_end(key)
        return renderer

    def call(self, function: str, args: list) -> dict:
        if function not in _CALLABLE:
            return {"error": {"kind": "refused", "message": f"{function} is not a function the sandbox runs"}}
        module_name, name = function.split(":")
        import importlib

        target = getattr(importlib.import_module(module_name), name)
        try:
            return {"result": target(*args)}
        except ExplorerError as err:
            return {"error": {"kind": "explorer", "message": _cap(str(err))}}
        except MemoryError:
            return {"error": {"kind": "limit", "limit": "memory", "message": "memory limit"}}
        except BaseException as err:
            if not is_panic(err):
                raise
            return {"error": {"kind": "panic", "message": _cap(str(err))}}


def _as_reply_value(value: Any) -> Any:
    """A construct's input or result as JSON: text, booleans and None as they are, anything else as its repr."""
    if value is None or isinstance(value, (str, bool)):
        return value
    return _cap(repr(value))


def _limit(limit: str, message: str, line: int | None) -> dict:
    return {"error": {"kind": "limit", "limit": limit, "message": message, "line": line}}


def _at(line: int | None) -> str:
    return f" at line {line}" if line else ""


def _cap(message: str, size: int = 2000) -> str:
    # Error text can be template-controlled (raise_exception): keep it a sentence, not a megabyte.
    return message if len(message) <= size else message[: size - 1] + "…"


def _memory_mb() -> int:
    import resource

    return resource.getrlimit(resource.RLIMIT_AS)[0] // (1024 * 1024)


def _line_of(err: BaseException) -> int | None:
    from engine.render.jinja import template_line_of

    return template_line_of(err)


def _bounded_renderer_class() -> type:
    """JinjaRenderer with the output and depth limits checked as the template runs; otherwise itself."""
    import jinja2.runtime

    from engine.render.jinja import JinjaRenderer

    # Counting nested macro calls and recursive loop levels here is what makes the depth limit a template-level
    # number; this patches jinja2 in the worker process only.
    invoke = jinja2.runtime.Macro._invoke
    loop_call = jinja2.runtime.LoopContext.__call__

    def counted_invoke(self: Any, arguments: list, autoescape: bool) -> Any:
        _DepthState.depth += 1
        try:
            if _DepthState.depth > _DepthState.max_depth:
                raise _DepthLimit()
            return invoke(self, arguments, autoescape)
        finally:
            _DepthState.depth -= 1

    def counted_loop_call(self: Any, iterable: Any) -> Any:
        if self.depth >= _DepthState.max_depth:
            raise _DepthLimit()
        return loop_call(self, iterable)

    jinja2.runtime.Macro._invoke = counted_invoke  # type: ignore[method-assign]
    jinja2.runtime.LoopContext.__call__ = counted_loop_call  # type: ignore[method-assign]

    class BoundedJinjaRenderer(JinjaRenderer):
        max_chars = RenderLimits.max_chars
        _emitted = 0

        def render(self, *args: Any, **kwargs: Any) -> Rendered:
            self._emitted = 0
            _DepthState.depth = 0
            return super().render(*args, **kwargs)

        def _record(self, line: int, is_root: bool, value: Any) -> Any:
            size = len(value) if isinstance(value, str) else len(str(value))
            if is_root:
                self._emitted += size
                if self._emitted > self.max_chars:
                    raise _OutputLimit(line)
            elif size > self.max_chars:
                raise _OutputLimit(line)
            return super()._record(line, is_root, value)

        def _message_in_frame(self, frame: Any) -> int:
            # JinjaRenderer looks one frame above its _record for the template's locals; that frame is now ours.
            if frame.f_code is BoundedJinjaRenderer._record.__code__:
                frame = frame.f_back
            return super()._message_in_frame(frame)

    return BoundedJinjaRenderer


_UNEXPECTED_CHAR = re.compile(r" at (\d+)$")
_NAMED = re.compile(r"No (?:filter|test) named '([^']+)'")


def syntax_error_position(source: str, err: Any) -> tuple[int | None, int | None]:
    """(line, column), both 1-based, of the token a Jinja syntax error is about.

    Jinja reports only the line. The column comes from lexing the source again with transformers' environment and
    locating each token in the source: a lexer error is at the first character it could not lex (or at its "at N"
    offset), a parser error at the token the parser stopped on.
    """
    from jinja2.lexer import TokenStream
    from jinja2.parser import Parser

    from engine.render.jinja import transformers_pieces

    env = transformers_pieces()._compile_jinja_template("").environment
    line = err.lineno
    ignored = {"whitespace", "comment_begin", "comment", "comment_end", "raw_begin", "raw_end",
               "linecomment_begin", "linecomment", "linecomment_end"}
    raw: list[tuple[int, str, str]] = []
    offsets: list[int] = []
    cursor = 0
    try:
        for lineno, kind, value in env.lexer.tokeniter(source, None):
            at = source.find(value, cursor) if value else cursor
            at = cursor if at < 0 else at
            raw.append((lineno, kind, value))
            offsets.append(at)
            cursor = at + len(value)
    except Exception as lex_err:  # noqa: BLE001 - any lexer failure: locate it where lexing stopped
        found = _UNEXPECTED_CHAR.search(getattr(lex_err, "message", "") or "")
        offset = int(found.group(1)) if found else _skip_space(source, cursor)
        return _line_column(source, offset, line)
    kept = [i for i, (_, kind, _) in enumerate(raw) if kind not in ignored]
    tokens = list(env.lexer.wrap(iter(raw), None, None))
    parser = Parser(env, source)
    parser.stream = TokenStream(iter(tokens), None, None)
    try:
        parser.parse()
    except Exception:  # noqa: BLE001 - the same failure as before, now with the stream to inspect
        current = parser.stream.current
        index = next((i for i, token in enumerate(tokens) if token is current), None)
        # No such token: the parser stopped at the end of the template, just after its last non-blank character.
        offset = offsets[kept[index]] if index is not None and index < len(kept) else len(source.rstrip())
        return _line_column(source, offset, line)
    # Parsed, so the compiler refused it (e.g. an unknown filter): point at the name Jinja quotes, if on that line.
    named = _NAMED.match(getattr(err, "message", "") or "")
    if named and line is not None and 1 <= line <= source.count("\n") + 1:
        text = source.split("\n")[line - 1]
        found = re.search(rf"\b{re.escape(named.group(1))}\b", text)
        if found:
            return line, found.start() + 1
    return line, _first_column(source, line)


def _skip_space(source: str, offset: int) -> int:
    while offset < len(source) and source[offset] in " \t\r\n":
        offset += 1
    return offset


def _line_column(source: str, offset: int, reported_line: int | None) -> tuple[int | None, int | None]:
    offset = min(offset, len(source))
    line = source.count("\n", 0, offset) + 1
    if reported_line is not None and line != reported_line:
        # The token we found is not on the line Jinja names (e.g. a compile-time assertion): trust Jinja's line.
        return reported_line, _first_column(source, reported_line)
    return line, offset - (source.rfind("\n", 0, offset) + 1) + 1


def _first_column(source: str, line: int | None) -> int | None:
    lines = source.split("\n")
    if line is None or not 1 <= line <= len(lines):
        return None
    text = lines[line - 1]
    return len(text) - len(text.lstrip()) + 1
