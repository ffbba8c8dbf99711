"""LiteLLM between the client and a vLLM server (`vllm+litellm`, `vllm+litellm@1.104.9`): the release's own code for
its `hosted_vllm` provider, run offline in a sandboxed worker (litellm_worker.py).

LiteLLM is a heavy package (about 3,200 modules on import, with boto3, aiohttp and a 44 MB native extension among its
requirements): it is not installed. Its wheel's Python sources, JSON data and bundled tokenizer cache are fetched by
range reads into the engine cache (engine.serving.real.fetch, about 19 MB read for 1.110.2, checked against the
wheel's RECORD), and one worker per release imports them with what is not installed here stubbed (measured here:
about 6 s to import idle, 13-20 s beside other work, then 30-40 ms a call). Each answer is kept in the engine cache's
result store (engine.serving.real.results) under the release's wheel sha256, the worker's source and the job, so a
warm run starts no worker.

PINNED is the newest release when this was written; 1.100.0-1.104.9 dropped every assistant message's
reasoning_content on its way to vLLM (litellm/llms/hosted_vllm/chat/transformation.py `_transform_messages`), 1.105.0
on keeps a string one.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from engine.serving.proxies.base import Forwarded, LayerUnavailable, message_edits
from engine.serving.real.process import ROOT, PipelinedProcess
from engine.types import Edit, Location

if TYPE_CHECKING:
    from engine.serving.real.results import FingerprintFolder

PINNED = "1.110.2"
STRIPPING = "1.104.9"  # the last release whose hosted_vllm drops every assistant message's reasoning_content
WORKER_MEMORY_MB = int(os.environ.get("DRIFT_PROXY_MEMORY_MB", 3072))
WORKER_STARTUP_TIMEOUT_S = float(os.environ.get("DRIFT_PROXY_STARTUP_TIMEOUT_S", 240))
WORKER_CALL_TIMEOUT_S = float(os.environ.get("DRIFT_PROXY_CALL_TIMEOUT_S", 60))


class _Worker(PipelinedProcess):
    """One sandboxed worker process for one LiteLLM release."""

    def __init__(self, version: str, root: Path) -> None:
        super().__init__(f"LiteLLM {version}", WORKER_MEMORY_MB, LayerUnavailable, WORKER_STARTUP_TIMEOUT_S)
        self.version, self.root = version, root

    def respawn(self) -> None:
        from engine.serving.real.fetch import cache_dir

        pycache = cache_dir() / "pycache" / f"litellm@{self.version}"
        pycache.mkdir(parents=True, exist_ok=True)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(pycache), "PYTHONPATH": str(ROOT),
               "PYTHONPYCACHEPREFIX": str(pycache), "PYTHONHASHSEED": "0", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
               "LITELLM_LOG": "ERROR", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.spawn("engine.serving.proxies.litellm_worker", [str(self.root)], env, pycache)

    def hello_problem(self, hello: dict) -> str | None:
        return None if hello.get("ok") else f"LiteLLM {self.version} does not load here: {hello.get('error')}"

    def ask(self, job: dict) -> dict:
        return self.call(job, WORKER_CALL_TIMEOUT_S, job["op"])


_WORKERS: dict[str, _Worker] = {}
_WORKERS_LOCK = threading.Lock()


def stop_workers() -> None:
    with _WORKERS_LOCK:
        while _WORKERS:
            _WORKERS.popitem()[1].stop()


def _sources(version: str) -> Path:
    from engine.serving.real import fetch

    try:
        return fetch.fetch_sources("litellm", version).root
    except fetch.FetchError as err:
        raise LayerUnavailable(f"LiteLLM {version} is not here: {err}") from None
    except Exception as err:  # noqa: BLE001 - the network or PyPI failed
        raise LayerUnavailable(f"LiteLLM {version} could not be fetched ({type(err).__name__})") from None


@functools.lru_cache(maxsize=256)
def _source_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []


@functools.cache  # once per process, as the release glue's fingerprint (results.glue_fingerprint)
def _worker_source_sha256() -> str:
    return hashlib.sha256((Path(__file__).parent / "litellm_worker.py").read_bytes()).hexdigest()


def answer_code(version: str) -> dict:
    """What LiteLLM's answers depend on besides the job: the release's wheel, our worker's code, the interpreter."""
    from engine.serving.real import fetch

    spec = f"litellm@{version}"
    return {"release": spec, "wheel": fetch.cached_wheel_sha256(spec), "worker": _worker_source_sha256(),
            "python": sys.version}


def answer_folder(version: str) -> FingerprintFolder:
    """Where the result cache keeps the answers of this release under today's code (results.FingerprintFolder)."""
    return _folder_of(answer_code(version))


def _folder_of(code: dict) -> FingerprintFolder:
    """The result cache's folder of the answers `code` (answer_code) gives."""
    from engine.serving.real.results import FingerprintFolder

    return FingerprintFolder.of(code["release"], code)


class LiteLLMProxy:
    """LiteLLM's hosted_vllm provider at one release, as a column's proxy (engine.serving.layers.Proxy)."""

    def __init__(self, version: str | None, model_name: str = "model") -> None:
        from engine.serving.real.fetch import release_name_problem

        problem = release_name_problem("litellm", version) if version else None
        if problem is not None:
            raise LayerUnavailable(problem)
        self.version = version or PINNED
        self.name = f"litellm@{version}" if version else "litellm"
        self.model_name = model_name
        self.root = _sources(self.version)

    @property
    def label(self) -> str:
        return f"LiteLLM {self.version} hosted_vllm (proxy)"

    @property
    def origin(self) -> str:
        return f"litellm {self.version}"

    def _ask(self, job: dict) -> dict:
        from engine.serving.real.results import persisted_results_enabled, result_cache

        cache = result_cache() if persisted_results_enabled() else None
        code = answer_code(self.version)
        folder = _folder_of(code)
        key = hashlib.sha256(json.dumps({**code, "job": job}, ensure_ascii=True,
                                        separators=(",", ":")).encode()).hexdigest()
        reply = cache.get(folder, key) if cache is not None else None
        if reply is not None:
            return reply
        with _WORKERS_LOCK:
            worker = _WORKERS.get(self.version)
            if worker is None:
                worker = _WORKERS[self.version] = _Worker(self.version, self.root)
        reply = worker.ask(job)
        if not reply.get("ok"):
            where = f" at {reply['where']}" if reply.get("where") else ""
            raise LayerUnavailable(f"LiteLLM {self.version} refuses the request{where}: {reply.get('error')}")
        if cache is not None:
            cache.put(folder, key, reply)
        return reply

    def _location(self, lines: list[list], field: str) -> Location:
        """The executed line of the provider's code that changes `field` (its `message.pop("reasoning_content",
        None)`, say), else one that names it, else the first executed line of the hosted_vllm provider."""
        found: dict[int, Location] = {}
        for path, line in lines:
            try:
                text = _source_lines(self.root / path)[line - 1]
            except IndexError:
                continue
            here = Location(self.origin, path, line, text=text.strip())
            named = f'"{field}"' in text or f"'{field}'" in text
            if named and any(word in text for word in (".pop(", "del ", "] =", "[" + repr(field) + "] =")):
                return here
            if named:
                found.setdefault(1, here)
            if "hosted_vllm" in path:
                found.setdefault(2, here)
        return found.get(1) or found.get(2) or Location(self.origin, "litellm/main.py", 0, text="litellm.completion")

    def _located(self, edits: tuple[Edit, ...], lines: list[list]) -> tuple[Edit, ...]:
        located = []
        for edit in edits:
            field = edit.before.rpartition(".")[2].partition("=")[0] or edit.step
            located.append(Edit(edit.step, edit.before, edit.after, self._location(lines, field), edit.description))
        return tuple(located)

    def request(self, messages: list[dict], tools: list[dict] | None) -> Forwarded:
        reply = self._ask({"op": "request", "model": self.model_name, "messages": messages, "tools": tools})
        sent = reply["sent"]
        forwarded = sent.get("messages") or []
        placeholder = Location(self.origin, "litellm/main.py", 0)
        edits = message_edits(f"LiteLLM {self.version}", placeholder, messages, forwarded)
        sent_tools = sent.get("tools")
        if tools and sent_tools != tools:
            edits += (Edit("tools_changed", json.dumps(tools)[:200], json.dumps(sent_tools)[:200], placeholder,
                           f"LiteLLM {self.version} forwards the tools otherwise (the template renders them)"),)
        return Forwarded(forwarded, sent_tools if tools else tools, self._located(edits, reply["lines"]))

    def response(self, message: dict) -> tuple[dict, tuple[Edit, ...]]:
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        body = {"id": "chatcmpl-drift", "object": "chat.completion", "created": 0, "model": self.model_name,
                "choices": [{"index": 0, "finish_reason": finish, "message": message}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
        reply = self._ask({"op": "response", "model": self.model_name, "reply": body})
        got = {k: v for k, v in reply["message"].items() if v is not None and k != "provider_specific_fields"}
        kept = {k: v for k, v in message.items() if v is not None}
        edits = message_edits(f"LiteLLM {self.version}", Location(self.origin, "litellm/main.py", 0), [kept], [got],
                              direction="response")
        return got, self._located(edits, reply["lines"])
