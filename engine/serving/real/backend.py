"""The real-engine backend: `vllm@X` / `sglang@X` for every release, run from the release's own code.

    from engine.serving.real.backend import RealEngine
    engine = RealEngine("vllm", "0.31.0")         # sources fetched into the cache on first use (fetch.py)
    engine.parse(text, reasoning_parser="qwen3", tool_parser="qwen3_coder", tools=tools)   # -> ParseResult

Each engine@version runs in its own long-lived worker process (worker.py): started under `unshare -rn` (no network)
when the kernel allows it, with RLIMIT_AS, a clean environment, the sources read-only and a time limit per request
(the worker is killed and restarted after one). A stub that a parse touched comes back as a warning in the result.

The request side runs the release's code too (`render_request`, `prepare_templated_request`): its protocol
validation and message handling up to the template call, whose arguments come back for the explorer to render with
the model's template, or, where the release renders the model itself (harmony, a bundled encoder), the prompt.
`prepare_request` without a template and `output_text` are the pinned emulation of the same engine.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import hashlib
import json
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import ExplorerError, RenderError
from engine.serving.base import EngineEmulation, RequestPrep, default_chunks
from engine.serving.real import fetch
from engine.serving.real.process import ROOT, PipelinedProcess
from engine.serving.real.results import FingerprintFolder, persisted_results_enabled, release_fingerprint, result_cache
from engine.types import Edit, Location, ParseResult, ToolCall

HARMONY_PARSERS = frozenset({"openai_gptoss", "openai", "gpt-oss", "gpt_oss"})
RECIPE_PARSERS = frozenset({"deepseekv4", "deepseek-v4", "deepseekv41", "deepseek-v41"})


@dataclass(frozen=True)
class WorkerLimits:
    memory_mb: int = 3072
    startup_timeout_s: float = 60.0
    parse_timeout_s: float = 20.0
    # A traced parse (the one at a cell's break) costs up to ~40x an untraced one: vLLM 0.33.0's DeepSeek V4 parse
    # 5-6 s at load 6 and past 20 s at load 8, where the untraced answer then stood in and the cell's cause changed.
    traced_parse_timeout_s: float = 180.0
    list_timeout_s: float = 60.0  # listing its parsers, once per release (imports every parser module)
    max_workers: int = 4  # workers kept alive at once (least recently used is stopped)

    @classmethod
    def from_env(cls) -> WorkerLimits:
        from engine.sandbox import env_overrides

        return cls(**env_overrides(cls, "DRIFT_ENGINE_"))


class EngineWorkerError(ExplorerError):
    """The worker of a release could not start or answer; one sentence."""


class Worker(PipelinedProcess):
    """One sandboxed worker process for one release. Threads ask it together: their requests queue in its stdin
    (process.PipelinedProcess)."""

    def __init__(self, engine: str, version: str, root: Path, limits: WorkerLimits,
                 dependencies: fetch.Dependencies | None = None) -> None:
        super().__init__(f"{engine}@{version}", limits.memory_mb, EngineWorkerError, limits.startup_timeout_s)
        self.engine, self.version, self.root, self.limits = engine, version, root, limits
        self.dependencies = dependencies or fetch.Dependencies({}, {})

    def respawn(self) -> None:
        self.spawn_release()

    def spawn_release(self) -> None:
        """Start the process without waiting for it to load the release (the first ask waits for its hello)."""
        pycache = fetch.cache_dir() / "pycache" / f"{self.engine}@{self.version}"
        pycache.mkdir(parents=True, exist_ok=True)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(pycache), "PYTHONPATH": str(ROOT),
               "PYTHONPYCACHEPREFIX": str(pycache), "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1",
               "TOKENIZERS_PARALLELISM": "false", "MALLOC_ARENA_MAX": "2", "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu", "VLLM_LOGGING_LEVEL": "ERROR"}
        from engine.render.harmony_encoding import o200k_base_path

        env["TIKTOKEN_ENCODINGS_BASE"] = str(o200k_base_path().parent)
        self.spawn("engine.serving.real.worker", [self.engine, self.version, str(self.root),
                                                  *(f"{name}={src.root}" for name, src in
                                                    sorted(self.dependencies.real.items()))], env, pycache)

    def hello_problem(self, hello: dict) -> str | None:
        return None if hello.get("ok") else f"{self.engine}@{self.version} does not load here: {hello.get('error')}"

    def ask(self, request: dict, timeout_s: float, vocab: AddedVocab | None = None) -> dict:
        """`vocab`: the vocabulary `request["tokenizer"]` references, sent along the first time this process is
        asked with it (tens of KB a job otherwise, written, hashed and read again per parse and render)."""
        once = (vocab.digest, {"vocab": vocab.job()}) if vocab is not None else None
        return self.call(request, timeout_s, _DOING.get(request.get("op", ""), "answer"), once)

    def stubbed_dependencies(self) -> str:
        """The clause an error of this worker ends with when a dependency the release pins is stubbed here."""
        return "".join(f" ({name} is stubbed in this worker: {why})"
                       for name, why in sorted(self.dependencies.stubbed.items()))


# What a request asks of the worker, as the sentence of a worker that did not answer it says it ("did not parse").
_DOING = {"parse": "parse", "render": "render", "parsers": "list its parsers"}
_WORKERS: OrderedDict[str, Worker] = OrderedDict()
_WORKERS_LOCK = threading.Lock()


@functools.lru_cache(maxsize=64)
def _dependencies(engine: str, version: str, offline: bool, cache: Path) -> fetch.Dependencies:
    # once per release and cache folder while workers live (stop_workers forgets them): the worker runs these, and
    # the result cache's key names them
    return fetch.dependency_sources(engine, version, offline=offline)


def release_dependencies(engine: str, version: str, *, offline: bool = False) -> fetch.Dependencies:
    return _dependencies(engine, version, offline, fetch.cache_dir())


def worker_for(engine: str, version: str, limits: WorkerLimits | None = None, *, offline: bool = False) -> Worker:
    """The live worker of engine@version (started, and its sources fetched, when needed)."""
    spec = f"{engine}@{version}"
    limits = limits or WorkerLimits.from_env()
    with _WORKERS_LOCK:
        worker = _WORKERS.get(spec)
        if worker is not None:
            _WORKERS.move_to_end(spec)
            return worker
    sources = fetch.fetch_sources(engine, version, offline=offline)
    worker = Worker(engine, version, sources.root, limits, release_dependencies(engine, version, offline=offline))
    worker.start()
    with _WORKERS_LOCK:
        started = _WORKERS.setdefault(spec, worker)  # another thread may have started one meanwhile: that one
        if started is not worker:
            worker.stop()
            _WORKERS.move_to_end(spec)
            return started
        while len(_WORKERS) > limits.max_workers:
            _, oldest = _WORKERS.popitem(last=False)
            oldest.stop()
    return worker


def spawn_workers(releases: Iterable[tuple[str, str]]) -> list[str]:
    """Start the workers of these (engine, version) releases without waiting for them: a release's imports take about
    a second, which then run beside the caller's own work (the matrix's templates and tokenizers) instead of before
    its first ask. Only releases whose sources are in the engine cache (a fetch is a download, left to that ask) and
    whose answers the result cache does not hold yet (a warm release would start a worker nobody asks; answers of
    another fingerprint, an older glue or wheel, do not count). The cold releases: those of them whose answers the
    result cache does not hold (with or without a worker started now)."""
    limits = WorkerLimits.from_env()
    cache = result_cache() if persisted_results_enabled() else None
    cold = []
    for engine, version in releases:
        spec = f"{engine}@{version}"
        sources = fetch.cached_sources(spec)
        if sources is None:
            continue
        dependencies = release_dependencies(engine, version, offline=True)
        fingerprint = release_fingerprint(spec, dependencies)
        if cache is not None and fingerprint is not None and cache.holds_answers_of(fingerprint.folder):
            continue
        cold.append(spec)
        with _WORKERS_LOCK:
            if spec in _WORKERS or len(_WORKERS) >= limits.max_workers:
                continue
        worker = Worker(engine, version, sources.root, limits, dependencies)
        worker.spawn_release()
        with _WORKERS_LOCK:
            if spec in _WORKERS:  # another thread started one meanwhile
                worker.stop()
            else:
                _WORKERS[spec] = worker
    return cold


def _deterministic(reply: dict) -> bool:
    """Whether the reply is the release's answer to the job alone: a result, or its code refusing the job (a step
    that raised, `where` set), but not a failure of the worker's own state (memory, recursion depth)."""
    if reply.get("ok"):
        return True
    return "where" in reply and not str(reply.get("error", "")).startswith(("MemoryError", "RecursionError"))


def ask_release(engine: str, version: str, job: dict, timeout_s: float, *, offline: bool = False,
                vocab: AddedVocab | None = None) -> dict:
    """The release's answer to `job` (whose "tokenizer" is `vocab.reference()`): from the result cache when this
    release, its glue and its dependencies answered the same job before (engine/serving/real/results.py), else from
    its worker (started when needed), kept when the release answered or refused (`_deterministic`). A worker that
    cannot start or answer raises EngineWorkerError, and nothing is kept."""
    spec = f"{engine}@{version}"
    cache = result_cache() if persisted_results_enabled() else None

    def stored_under() -> tuple[FingerprintFolder, str] | None:  # None while the sources are not in the engine cache
        fingerprint = release_fingerprint(spec, release_dependencies(engine, version, offline=offline))
        return (fingerprint.folder, fingerprint.key(job)) if fingerprint is not None else None

    where = stored_under() if cache is not None else None
    if cache is not None and where is not None:
        reply = cache.get(*where)
        if reply is not None:
            return reply
    reply = worker_for(engine, version, offline=offline).ask(job, timeout_s, vocab)
    if cache is not None and _deterministic(reply):
        where = where or stored_under()  # the sources may have been fetched just now
        if where is not None:
            cache.put(*where, reply)
    return reply


def worker_cpu_s() -> dict[str, float]:
    """The CPU seconds each live worker's process has used, by engine@version (those /proc cannot tell left out)."""
    with _WORKERS_LOCK:
        workers = list(_WORKERS.items())
    return {spec: cpu for spec, worker in workers if (cpu := worker.cpu_s()) is not None}


def stop_workers() -> None:
    """Stop every worker; the next one of a release reads its dependencies afresh (a newer one may be cached now)."""
    _dependencies.cache_clear()
    with _WORKERS_LOCK:
        while _WORKERS:
            _WORKERS.popitem()[1].stop()


atexit.register(stop_workers)


# (id(tokenizer backend), the special tokens listed) -> (that backend, its vocabulary); the backend is held so that
# its id is not reused
_VOCABS: dict[tuple[int, tuple[str, ...] | None], tuple[Any, AddedVocab | None]] = {}
MAX_VOCABS = 64


@dataclass(frozen=True)
class AddedVocab:
    """The added tokens the parsers look up: text -> id, and which of them the tokenizer lists as special."""

    ids: dict[str, int]
    special: frozenset[str]
    # The model's whole tokenizer.json (a file in the engine cache), for serving code that tokenizes itself
    # (SGLang 0.5.23 sends DeepSeek V4 output through deepseek-recipe); the worker then uses real ids.
    tokenizer_json: str | None = None

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> AddedVocab | None:
        """From one of the explorer's real tokenizers (tokenizers' added tokens, or tiktoken's special tokens). The
        special ones are what transformers would list in all_special_tokens where the model says
        (`all_special_tokens` of a wrapper: models.listed_special_tokens), else the tokenizer file's special flags."""
        inner, listed = tokenizer, getattr(tokenizer, "all_special_tokens", None)
        while hasattr(inner, "inner"):
            inner = inner.inner
            listed = listed if listed is not None else getattr(inner, "all_special_tokens", None)
        backend = getattr(inner, "backend", None)
        if backend is None:
            return None
        # Read once per tokenizer: every parse and request-side render of a matrix asks (the decoder lists hundreds)
        key = (id(backend), listed)
        known = _VOCABS.get(key)
        if known is not None and known[0] is backend:
            return known[1]
        vocab = cls._read(inner, backend, listed)
        if len(_VOCABS) >= MAX_VOCABS:  # uploads bring tokenizers of their own to a long-lived server
            _VOCABS.clear()
        _VOCABS[key] = (backend, vocab)
        return vocab

    @classmethod
    def _read(cls, inner: Any, backend: Any, listed: tuple[str, ...] | None) -> AddedVocab | None:
        if hasattr(backend, "get_added_tokens_decoder"):
            decoder = backend.get_added_tokens_decoder()
            ids = {t.content: i for i, t in decoder.items()}
            special = frozenset(t.content for t in decoder.values() if t.special) if listed is None else \
                frozenset(listed) & ids.keys()
            return cls(ids, special, tokenizer_file(inner))
        if hasattr(backend, "special_tokens_set"):
            ids = {text: inner.token_id(text) for text in backend.special_tokens_set}
            return cls({t: i for t, i in ids.items() if i is not None}, frozenset(ids))
        return None

    def job(self) -> dict:
        return {"added": self.ids, "special": sorted(self.special), "tokenizer_json": self.tokenizer_json}

    @functools.cached_property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.job(), sort_keys=True).encode()).hexdigest()

    def reference(self) -> dict:
        """What a job carries for this vocabulary: its sha256 (the worker is sent the vocabulary itself once, and
        the result cache's key covers it through the hash)."""
        return {"sha256": self.digest}

    @functools.cached_property
    def added_only(self) -> AddedVocab:
        """This vocabulary without its tokenizer.json, made once per vocabulary (its digest and pattern with it)."""
        return self if self.tokenizer_json is None else AddedVocab(self.ids, self.special)

    @functools.cached_property
    def _added_pattern(self) -> re.Pattern:  # built once per vocabulary: every parse's job asks (hundreds of tokens)
        return re.compile("|".join(re.escape(t) for t in sorted(self.ids, key=len, reverse=True)))

    def chunks(self, text: str) -> list[str]:
        """The text split at added tokens: each one alone (one id), the text between one piece each."""
        if not self.ids:
            return [text]
        pieces, position = [], 0
        for match in self._added_pattern.finditer(text):
            if match.start() > position:
                pieces.append(text[position:match.start()])
            pieces.append(match.group())
            position = match.end()
        if position < len(text):
            pieces.append(text[position:])
        return pieces or [""]


def release_problem(engine: str, version: str) -> str | None:
    """None when engine@version is a release the backend serves (in the cache, or listed by PyPI: the cached index
    first, the network only when the index is missing or does not know the version); else the sentence why not."""
    problem = fetch.release_name_problem(engine, version)  # before the cache or the network is touched
    if problem is not None:
        return problem
    if fetch.cached_sources(f"{engine}@{version}") is not None:
        return None
    try:
        fetch.release(engine, version)
    except fetch.FetchError as err:
        return str(err)
    return None


@functools.lru_cache(maxsize=16)
def tokenizer_file(inner: Any) -> str:
    """A `tokenizers.Tokenizer` written once to the engine cache, for the workers to read: named by the sha256 of the
    tokenizer.json it was loaded from where that is known (serialising one takes 0.7-2 s, which a fresh process paid
    per model only to name the file), else by the serialised text's own."""
    source = getattr(inner, "source_sha256", None)
    text = None if source else inner.backend.to_str()
    name = f"from-{source}" if source else hashlib.sha256(text.encode()).hexdigest()
    path = fetch.cache_dir() / "tokenizers" / f"{name}.json"
    if not path.exists():
        fetch.write_atomic(path, (text if text is not None else inner.backend.to_str()).encode())
    return str(path)


def traced_edits(origin: str, text: str, result: dict, trace: dict) -> tuple[Edit, ...]:
    """The release's own edits behind each response field, from the tracer: for every field whose value is not the
    model text, the last edit in the engine's files that produced exactly that value (file:line of that release): a
    string local that changed into it, else (reasoning and content, cut from the model text) the first local one
    expression set to it; and for an empty answer sent as null the line where the local became None. (The worker
    sends the edits this and `field_sources` read, tracer.answer_edits: a change here may need one there.)"""
    fields = [("reasoning", result.get("reasoning")), ("content", result.get("content"))]
    fields += [(f"arguments of {c['name']}", c["arguments"]) for c in result.get("tool_calls", [])]
    edits: list[Edit] = []
    for name, value in fields:
        if value is None or value == text:
            continue
        for kind in ("string", "set") if name in ("reasoning", "content") else ("string",):
            # the last string edit that made the value; else the first expression that produced it (later sets only
            # pass it on, e.g. serving code unpacking the parser's result)
            found = [e for e in trace.get("edits", []) if e["kind"] == kind and e["after"] == value[:200]
                     and e["before"] != e["after"]]
            edit = (found[-1] if kind == "string" else found[0]) if found else None
            if edit is not None:
                # a set edit has no before of its own: the model text it was made from
                before = edit["before"] if edit["before"] is not None else text[:200]
                edits.append(Edit(f"{name}: {edit['variable']}", before, edit["after"],
                                  Location(origin, edit["file"], edit["line"], None),
                                  f"the release's code set {edit['variable']} to the {name} returned"))
                break
    if result.get("content") is None and text:
        for edit in reversed(trace.get("edits", [])):
            if edit["kind"] == "type" and edit["after"] == "None":
                edits.append(Edit("content: null", edit["before"], "", Location(origin, edit["file"], edit["line"],
                                                                                 None),
                                  f"the release's code set {edit['variable']} to None: the client gets null"))
                break
    return tuple(edits)


# Where a release's tool parsers live: vllm/tool_parsers/, vllm/parser/ (0.2x's parser engine), sglang's function_call/.
_TOOL_PARSER_FILE = re.compile("tool_parser|/parser/|function_call/")


def field_sources(origin: str, text: str, result: dict, trace: dict) -> tuple[tuple[str, Location], ...]:
    """For the fields no string edit made (`traced_edits`), the release's executed line that decided them: for an
    empty reasoning of a non-empty text, the reasoning parser's first line that made the text it handed on as content
    (the split that gave the reasoning away: MiniMax's append-think prepending `<think>`), else the last value a
    reasoning parser's function returned; for a call's arguments, the first line in the tool parsers that set exactly
    that string (the arguments built from the parsed parameters), else the first that turned a parameter's text into
    another type (or returned from a function named for converting, where the tracer saw no type change)."""
    edits = trace.get("edits", [])

    def where(edit: dict) -> Location:
        return Location(origin, edit["file"], edit["line"], None)

    sources: list[tuple[str, Location]] = []
    if not result.get("reasoning") and text:
        in_parser = [e for e in edits if "reasoning" in e["file"] and isinstance(e["after"], str) and e["after"]]
        head = (result.get("content") or "")[:40]
        made = next((e for e in in_parser if head and e["after"].startswith(head)), None) or next(
            (e for e in reversed(in_parser) if e["variable"].startswith("return of ")), None)
        if made is not None:
            sources.append(("reasoning", where(made)))
    in_tool_parsers = [e for e in edits if _TOOL_PARSER_FILE.search(e["file"])]
    # a parameter's text turned into another type (SGLang's Qwen3-Coder `_convert_param_value`): the repr of a str
    # before, of something else after
    converted = next((e for e in in_tool_parsers if e["kind"] == "type" and str(e["before"])[:1] in "'\""
                      and str(e["after"])[:1] not in "'\""), None) or next(
        (e for e in in_tool_parsers if e["variable"].startswith("return of ") and "convert" in e["variable"]), None)
    for call in result.get("tool_calls", []):
        value = call["arguments"][:200]
        made = next((e for e in in_tool_parsers if e["kind"] in ("set", "string") and e["after"] == value), None)
        if made is not None or converted is not None:
            sources.append((f"arguments of {call['name']}", where(made or converted)))
    return tuple(sources)


def request_edits(origin: str, entry: str, sent: list[dict], conversation: list[dict]) -> tuple[Edit, ...]:
    """What the release's request side changed in the client's messages, read off the conversation it handed the
    template (message by message, as blame undoes them): reasoning renamed or dropped, arguments parsed into dicts.
    The location is the release's function the request went through; the line that did it is not traced."""
    path, _, line = entry.rpartition(":")
    where = Location(origin, path or "request side", int(line) if line.isdigit() else 0)
    edits: list[Edit] = []
    if len(sent) != len(conversation):
        return ()
    for index, (client, served) in enumerate(zip(sent, conversation)):
        if client.get("role") != "assistant":
            continue
        for key in ("reasoning_content", "reasoning"):
            if client.get(key) is None:
                continue
            kept = [k for k in ("reasoning", "reasoning_content") if served.get(k) == client[key]]
            if key not in kept:
                after = " + ".join(f"messages[{index}].{k}" for k in kept)
                edits.append(Edit("reasoning_renamed" if kept else "reasoning_dropped", f"messages[{index}].{key}",
                                  after, where, f"the template receives the client's {key} as {after}" if kept else
                                  f"the release's request side does not pass the client's {key} to the template"))
        for call, served_call in zip(client.get("tool_calls") or [], served.get("tool_calls") or []):
            before = call.get("function", {}).get("arguments")
            after = served_call.get("function", {}).get("arguments")
            if isinstance(before, str) and not isinstance(after, str):
                edits.append(Edit("args_parsed", before, json.dumps(after, ensure_ascii=False), where,
                                  "arguments string parsed into an object; the template re-serialises it"))
    return tuple(edits)


@functools.cache
def _harmony_encoding() -> Any:
    from engine.render.harmony_encoding import o200k_base_path

    o200k_base_path()
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


@functools.lru_cache(maxsize=4096)
def _harmony_ids(text: str) -> tuple[int, ...]:
    return tuple(_harmony_encoding().encode(text, allowed_special="all"))


class RealEngine(EngineEmulation):
    """One release's real response path, behind the same interface as the emulations."""

    families: dict = {}
    last_trace: dict | None = None  # the tracer's report of the last parse(trace=True): executed lines, edits
    is_real_release = True

    def __init__(self, engine: str, version: str, *, offline: bool = False,
                 stand_in: type[EngineEmulation] | None = None) -> None:
        """`stand_in`: the emulation that prepares the request where this release's own glue cannot (an API shape
        it does not drive), and gives the text its parsers receive; engine.serving.registry passes the newest one of
        the engine. Without it only parse and render_request work."""
        self.name, self.version, self.offline = engine, version, offline
        self.stand_in = stand_in
        self._names: dict | None = None
        self.request_side_missing: str | None = None  # why the pinned emulation stood in for the release's code

    @property
    def origin(self) -> str:
        return f"{self.name} {self.version} (real code)"

    @property
    def parser_names_path(self) -> Path:
        """Where the release's parser names are kept once listed (beside its sources in the engine cache)."""
        return fetch.cache_dir() / "releases" / self.spec / "parsers.json"

    def _parser_names(self) -> dict:
        """The parser names the release registers: from the engine cache, else asked of its worker once (bounded by
        DRIFT_ENGINE_LIST_TIMEOUT_S). A worker that hangs or dies then raises EngineWorkerError, is stopped, and the
        next request starts a fresh one and asks again."""
        if self._names is None:
            path = self.parser_names_path
            if path.exists():
                self._names = json.loads(path.read_text())
            else:
                worker = worker_for(self.name, self.version, offline=self.offline)
                reply = worker.ask({"op": "parsers"}, WorkerLimits.from_env().list_timeout_s)
                if not reply.get("ok"):
                    raise EngineWorkerError(f"{self.spec}: cannot list its parsers: {reply.get('error')}")
                self._names = {"tool_parsers": reply["tool_parsers"], "reasoning_parsers": reply["reasoning_parsers"]}
                fetch.write_atomic(path, json.dumps(self._names).encode())  # other processes may be reading it
        return self._names

    @property
    def reasoning_parsers(self) -> dict[str, str]:  # type: ignore[override]
        return {name: name for name in self._parser_names()["reasoning_parsers"]}

    @property
    def tool_parsers(self) -> dict[str, str]:  # type: ignore[override]
        return {name: name for name in self._parser_names()["tool_parsers"]}

    def parse(self, text: str, *, reasoning_parser: str | None, tool_parser: str | None,
              tools: list[dict] | None = None, stream: bool = False, chunks: list[str] | None = None,
              chat_template_kwargs: dict | None = None, history_tool_calls: int = 0, tokenizer: Any = None,
              vocab: AddedVocab | None = None, prompt_tail: list[str] | None = None,
              force_reasoning: bool = True, trace: bool | None = None,
              added_tokens: dict[str, int] | None = None) -> ParseResult:
        """What the release's serving code returns for `text`; `stream=True` drives its streaming generator with
        `chunks` (default: 4-character pieces). `vocab` (or the model's `tokenizer`, or else its manifest's
        `added_tokens`, all special) supplies the added tokens. `trace` (default: where it is cheap,
        `traces_cheaply`) runs the line tracer: the result's edits are then the release's executed lines that made each
        field."""
        try:
            self.check_names(reasoning_parser, tool_parser)
        except EngineWorkerError as err:  # listing its parsers hung or died: this parse's error, as a hung parse's
            return ParseResult(None, None, error=str(err))
        if trace is None:
            trace = self.traces_cheaply
        if vocab is None and tokenizer is not None:
            vocab = AddedVocab.from_tokenizer(tokenizer)
            if vocab is not None and not self.tokenizes_output(reasoning_parser, tool_parser):
                # the text parsers look up added tokens only: loading the whole tokenizer.json in a fresh worker
                # (about a second for Qwen's) would be most of a cold cell
                vocab = vocab.added_only
        vocab = vocab or AddedVocab(dict(added_tokens or {}), frozenset(added_tokens or ()))
        harmony = reasoning_parser in HARMONY_PARSERS or tool_parser in HARMONY_PARSERS
        defaults = self.server_flags.get("default-chat-template-kwargs")
        if defaults:  # the parsers read the kwargs the server resolved: its defaults under the request's own
            chat_template_kwargs = {**defaults, **(chat_template_kwargs or {})}
        if stream and chunks is None:
            chunks = default_chunks(text)
        job = {"op": "parse", "text": text, "chunks": chunks or vocab.chunks(text), "stream": stream,
               "token_ids": list(_harmony_ids(text)) if harmony else None, "harmony": harmony,
               "reasoning_parser": reasoning_parser, "tool_parser": tool_parser, "tools": tools or None,
               "chat_template_kwargs": chat_template_kwargs or None, "history_tool_calls": history_tool_calls,
               "tokenizer": vocab.reference(), "model_type": "gpt_oss" if harmony else "generic",
               "prompt_tail": prompt_tail or [], "force_reasoning": force_reasoning, "trace": trace}
        try:
            limits = WorkerLimits.from_env()
            reply = ask_release(self.name, self.version, job,
                                limits.traced_parse_timeout_s if trace else limits.parse_timeout_s,
                                offline=self.offline, vocab=vocab)
        except EngineWorkerError as err:
            return ParseResult(None, None, error=str(err))
        if not reply.get("ok"):
            where = f" at {reply['where']}" if reply.get("where") else ""
            stubbed = worker_for(self.name, self.version, offline=self.offline).stubbed_dependencies()
            return ParseResult(None, None, error=f"{reply.get('error')}{where}{stubbed}")
        result = reply["result"]
        if result.get("error"):
            return ParseResult(None, None, error=result["error"])
        calls = tuple(ToolCall(c.get("id"), c["name"], c["arguments"]) for c in result["tool_calls"])
        edits: tuple[Edit, ...] = ()
        sources: tuple[tuple[str, Location], ...] = ()
        if trace:
            self.last_trace = reply.get("trace") or {"lines": {}, "edits": []}
            edits = traced_edits(self.origin, text, result, self.last_trace)
            sources = field_sources(self.origin, text, result, self.last_trace)
        return ParseResult(result["reasoning"], result["content"], calls, edits,
                           warnings=tuple(reply.get("warnings", ())), sources=sources)

    def tokenizes_output(self, reasoning_parser: str | None, tool_parser: str | None) -> bool:
        """Whether this release's serving code turns the output into token ids with the model's own tokenizer for these
        parsers: SGLang 0.5.23's deepseek-recipe path (chat_encoding_adapters.py ADAPTER_OUTPUT_PARSERS; earlier SGLang
        releases get the real ids too and do not need them)."""
        return self.name == "sglang" and (tool_parser in RECIPE_PARSERS or reasoning_parser in RECIPE_PARSERS)

    @property
    def traces_cheaply(self) -> bool:
        """Whether the tracer costs this release tens of milliseconds a parse at most (median of 15, qwen3 +
        qwen3_coder, one call, load 7-8 from other work: SGLang 0.5.23 0.85 -> 26 ms, vLLM 0.20.2 1.0 -> 19 ms) rather
        than a hundred (vLLM 0.24.0 3.8 -> 106 ms, 0.25.1 3.9 -> 130 ms: its parser engine runs about 1,300 lines a
        parse), so a cell's cause can cite executed lines."""
        return self.name == "sglang" or fetch.Version(self.version) < fetch.Version("0.21")

    def pinned_stand_in(self) -> EngineEmulation:
        if self.stand_in is None:
            raise TypeError(f"{self.spec}: built without a stand-in emulation for its request side; resolve it "
                            "through engine.serving.registry")
        return self.stand_in()

    def output_text(self, text: str, stop_token: str | None, tool_parser: str | None) -> str:
        return self.pinned_stand_in().output_text(text, stop_token, tool_parser)

    @property
    def request_side_origin(self) -> str:
        if self.request_side_missing:
            return f"{self.pinned_stand_in().request_side_origin}, standing in: {self.request_side_missing}"
        glue = "vllm/renderers/hf.py HfRenderer.render_messages" if self.name == "vllm" else \
            "sglang/srt/entrypoints/openai/serving_chat.py _convert_to_internal_request"
        return f"{self.name} {self.version} real code ({glue})"

    def prepare_request(self, messages: list[dict], tools: list[dict] | None) -> RequestPrep:
        return self.pinned_stand_in().prepare_request(messages, tools)

    def prepare_templated_request(self, messages: list[dict], tools: list[dict] | None, *, kwargs: dict,
                                  chat_template: str, parsers: dict[str, str] | None = None) -> RequestPrep:
        """The release's own request side for a Jinja-templated model: the conversation, tools and kwargs it
        would hand transformers' apply_chat_template. The pinned emulation's edits name what changed (blame undoes
        them one by one); a refusal by the release's code is the request's error."""
        job = {"renderer": "jinja", "messages": messages, "tools": tools or None,
               "chat_template_kwargs": dict(kwargs), "chat_template": chat_template,
               # the server is started with its parser pair (SGLang 0.5.1 refuses a request without a tool parser)
               "reasoning_parser": (parsers or {}).get("reasoning_parser"),
               "tool_parser": (parsers or {}).get("tool_call_parser"), **self._server_job()}
        try:
            reply = self.render_request(job)
        except RenderError as err:
            return RequestPrep(messages, (), str(err))
        if "unsupported" in reply:  # an API shape the glue does not drive: the pinned emulation stands in
            self.request_side_missing = reply["unsupported"]
            return self.pinned_stand_in().prepare_request(messages, tools)
        conversation = reply["conversation"]
        edits = request_edits(self.origin, reply.get("entry", ""), messages, conversation)
        return RequestPrep(conversation, edits, None, template_kwargs=reply["template_kwargs"], tools=reply["tools"])

    def _server_job(self) -> dict:
        """The server flags a job carries (none: no key, so a flagless job's cache key is what it always was)."""
        return {"server": dict(self.server_flags)} if self.server_flags else {}

    def cache_kept(self, prompt_len: int, output_ids: list[int], *, require_reasoning: bool,
                   think_end_ids: list[int], think_start_ids: list[int]) -> dict | None:
        """How many tokens of a finished request the release keeps in its prefix cache under this column's server
        flags, by its own code (glue_sglang.cache_kept): {"kept", "where", "line", ...}; None where the release
        has no such code (vLLM, or a release without the flag)."""
        if self.name != "sglang" or "strip-thinking-cache" not in self.server_flags:
            return None
        vocab = AddedVocab({}, frozenset())
        job = {"op": "cache_kept", "tokenizer": vocab.reference(), "prompt_len": prompt_len,
               "output_ids": list(output_ids), "require_reasoning": require_reasoning,
               "think_end_ids": list(think_end_ids), "think_start_ids": list(think_start_ids), **self._server_job()}
        try:
            reply = ask_release(self.name, self.version, job, WorkerLimits.from_env().parse_timeout_s,
                                offline=self.offline, vocab=vocab)
        except EngineWorkerError as err:
            raise ExplorerError(f"{self.spec}'s cache code did not answer: {err}") from None
        result = reply.get("result") or {}
        if not reply.get("ok"):
            raise ExplorerError(f"{self.spec}'s cache code failed at {reply.get('where')}: {reply.get('error')}")
        return None if "unsupported" in result else result

    def render_request(self, job: dict, tokenizer: Any = None) -> dict:
        """One request through the release's own request side in its worker (glue_*.py `render`); RenderError in
        one sentence, naming the release's file and line, when its code refuses the request."""
        vocab = (AddedVocab.from_tokenizer(tokenizer) if tokenizer is not None else None) or AddedVocab({}, frozenset())
        job = {"op": "render", "tokenizer": vocab.reference(), **job}
        if job.get("renderer") == "harmony" and "start_date" not in job:
            # The release writes the conversation's start date into the system message: today, unless
            # VLLM_SYSTEM_START_DATE pins it (harmony_utils.get_system_message; engine/render/harmony.py does the same).
            # The day is then part of the job, and so of its key in the result cache: an answer kept yesterday
            # carried yesterday's date.
            job["start_date"] = os.environ.get("VLLM_SYSTEM_START_DATE") or datetime.date.today().isoformat()
        try:
            reply = ask_release(self.name, self.version, job, WorkerLimits.from_env().parse_timeout_s,
                                offline=self.offline, vocab=vocab)
        except EngineWorkerError as err:  # hung or died: this request's error, as a parse's is (the next one restarts)
            raise RenderError(f"{self.spec}'s request side did not answer: {err}") from None
        result = reply.get("result") or {}
        if not reply.get("ok") or result.get("error"):
            where = f" at {reply['where']}" if reply.get("where") else ""
            error = result.get("error") or reply.get("error")
            path, _, line = (reply.get("where") or "").rpartition(":")
            raise RenderError(f"{self.spec}'s request side refuses the request{where}: {error}", path=path,
                              source_line=int(line) if line.isdigit() else None)
        return result
