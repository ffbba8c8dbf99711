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
from pathlib import Path
from typing import Any

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


class JsonLineProcess:
    """The process half of a worker: spawned, read with a deadline, stopped. `label` names it in the sentence a
    failure raises (`the vllm@0.33.0 worker did not parse within 20 s`); `failure` is that sentence's exception."""

    def __init__(self, label: str, memory_mb: int, failure: type[Exception]) -> None:
        self.label, self.memory_mb, self.failure = label, memory_mb, failure
        self.proc: subprocess.Popen | None = None
        self.replies: Any = None

    def spawn(self, module: str, args: list[str], env: dict[str, str], cwd: Path) -> None:
        """`python -m module args…` sandboxed, with `env` (plus the reply pipe's descriptor), from `cwd`."""
        read_fd, write_fd = os.pipe()
        memory = self.memory_mb * 1024 * 1024

        def bound() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

        argv = [*network_isolation(), sys.executable, "-m", module, *args]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env={**env, "DRIFT_REPLY_FD": str(write_fd)}, cwd=str(cwd), pass_fds=(write_fd,),
                                     preexec_fn=bound, text=True)
        os.close(write_fd)
        self.replies = os.fdopen(read_fd, "r", encoding="utf-8")

    def send(self, request: dict) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        # ASCII JSON: a lone surrogate in model text (invalid UTF-8 decoded with surrogateescape) travels as \udcff
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    def read(self, timeout_s: float, what: str) -> dict:
        """The next reply; `failure` in one sentence when none comes within `timeout_s` or the process exited."""
        assert self.replies is not None
        ready, _, _ = select.select([self.replies], [], [], timeout_s)
        line = self.replies.readline() if ready else None
        if not line:
            code = self.stop()
            reason = f"did not {what} within {timeout_s:.0f} s" if not ready else \
                f"exited during {what} (status {code}; memory limit {self.memory_mb} MB)"
            raise self.failure(f"the {self.label} worker {reason}")
        return json.loads(line)

    def stop(self) -> int | None:
        proc, self.proc = self.proc, None
        if self.replies is not None:
            self.replies.close()
            self.replies = None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.kill()
        return proc.wait()
