"""The sandboxed worker that runs one engine release's own code: `python -m engine.serving.real.worker ENGINE VERSION
ROOT [NAME=FOLDER ...]` (each NAME a dependency the release pins, run for real from FOLDER: fetch.DEPENDENCIES),
started by backend.py (under `unshare -rn` when available, with RLIMIT_AS set, a clean environment and the release's
sources read-only).

Protocol: one JSON object per line on stdin, one reply per line on the file descriptor given in DRIFT_REPLY_FD (the
engine's own prints go to stderr). Requests: {"op": "hello"}, {"op": "parsers"}, {"op": "parse", ...}. Replies carry
`ok`, the result or `error`, and `warnings` (stubs the job touched). Nothing here is imported by the explorer's
own process.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ORDINARY_TOKEN_ID = 11
MAX_ANSWERED = 100_000  # untraced parse jobs a worker remembers (a digest each) to skip a traced twin's warm-up


class VocabTokenizer:
    """The tokenizer the parsers see: the model's added tokens with their ids and special flags (what the parsers
    look up), every other piece of text one ordinary id. The explorer's real tokenizer supplies the vocabulary."""

    def __init__(self, added: dict[str, int], special: list[str], harmony: bool = False,
                 tokenizer_json: str | None = None) -> None:
        # With the model's tokenizer.json the ids are real (serving code that tokenizes itself needs them).
        self.backend_tokenizer = _real_tokenizer(tokenizer_json) if tokenizer_json else None
        self._vocab = dict(added)
        self._inverse = {i: t for t, i in added.items()}
        self.all_special_tokens = [t for t in special if t in added]
        self.all_special_ids = [added[t] for t in self.all_special_tokens]
        self.harmony = harmony
        self.eos_token_id = None
        self.bos_token_id = None
        self.name_or_path = "drift-explorer"
        self.vocab_size = max(added.values(), default=0) + 1
        self.is_fast = True
        self.truncation_side = "left"
        self.model_max_length = 1 << 20
        self.chat_template = None
        self.init_kwargs: dict = {}
        self.special_tokens_map: dict = {}
        # The request side: what the engine's code handed the tokenizer to render ("template" calls) or to encode
        # (text it rendered itself), in order; cleared per job.
        self.calls: list[dict] = []

    def get_vocab(self) -> dict[str, int]:
        return self._vocab

    def get_added_vocab(self) -> dict[str, int]:
        return dict(self._vocab)

    def get_chat_template(self, chat_template: str | None = None, tools: list | None = None) -> str | None:
        return chat_template if chat_template is not None else self.chat_template

    def apply_chat_template(self, conversation: Any = None, tools: Any = None, **kwargs: Any) -> Any:
        """Records what the engine would have transformers render (the explorer renders it with the model's
        template) and answers an empty prompt."""
        kwargs.pop("chat_template", None)
        self.calls.append({"kind": "template", "conversation": _plain(conversation), "tools": _plain(tools),
                           "kwargs": _plain(kwargs)})
        return [] if kwargs.get("tokenize", True) else ""

    def last_template_call(self) -> dict:
        calls = [c for c in self.calls if c["kind"] == "template"]
        if not calls:
            return {"error": "the release's request side never reached apply_chat_template"}
        call = calls[-1]
        return {"conversation": call["conversation"], "tools": call["tools"], "template_kwargs": call["kwargs"]}

    @property
    def vocab(self) -> dict[str, int]:
        return self._vocab

    def __len__(self) -> int:
        return self.vocab_size

    def convert_tokens_to_ids(self, token):
        if isinstance(token, list):
            return [self._vocab.get(t, 0) for t in token]
        return self._vocab.get(token, 0)

    def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False):
        if isinstance(ids, int):
            return self._inverse.get(ids, "")
        return [self._inverse.get(i, "") for i in ids]

    def encode(self, text: str, add_special_tokens: bool = False, **kwargs) -> list[int]:
        self.calls.append({"kind": "encode", "text": text})
        if self.backend_tokenizer is not None:
            return list(self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)
        return [self._vocab.get(text, ORDINARY_TOKEN_ID)]

    def decode(self, ids, skip_special_tokens: bool = False, **kwargs) -> str:
        if self.harmony:
            return _harmony().decode(list(ids))
        if self.backend_tokenizer is not None:
            return self.backend_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return "".join(self._inverse.get(i, "") for i in ids)

    def ids_for(self, chunks: list[str]) -> list[int]:
        """Token ids for output chunks: real ids with a tokenizer.json; else an added token is its id, other text one
        ordinary id per chunk."""
        if self.backend_tokenizer is not None:
            return list(self.backend_tokenizer.encode("".join(chunks), add_special_tokens=False).ids)
        return [self._vocab[c] if c in self._vocab else ORDINARY_TOKEN_ID for c in chunks]


def _plain(value: Any) -> Any:
    """JSON-shaped data from what the engine passes around (pydantic models, TypedDicts, tuples)."""
    if hasattr(value, "model_dump"):
        value = value.model_dump()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


_HARMONY = None
_TOKENIZERS: dict[str, Any] = {}


def _real_tokenizer(path: str) -> Any:
    if path not in _TOKENIZERS:
        from tokenizers import Tokenizer

        _TOKENIZERS[path] = Tokenizer.from_file(path)
    return _TOKENIZERS[path]


def _harmony():
    global _HARMONY
    if _HARMONY is None:
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding

        _HARMONY = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    return _HARMONY


class Worker:
    def __init__(self, engine: str, version: str, root: Path, dependencies: dict[str, Path] | None = None) -> None:
        from engine.serving.real import stubs

        self.engine, self.version, self.root = engine, version, root
        started = time.perf_counter()
        self.finder = stubs.install(engine, version, root, dependencies)
        self.touches = stubs.TOUCHES
        if engine == "vllm":
            from engine.serving.real import glue_vllm as glue
        else:
            from engine.serving.real import glue_sglang as glue
        self.glue = glue.Glue(version, root)
        self.import_s = time.perf_counter() - started
        self.tokenizers: dict[tuple[str, bool], VocabTokenizer] = {}
        self.vocabs: dict[str, dict] = {}  # sha256 -> the vocabulary a job references (sent once, with a job)
        self.answered: set[str] = set()  # the untraced jobs this process ran (as _untraced_twin writes them)

    def handle(self, request: dict) -> dict:
        op = request.get("op")
        if op == "hello":
            return {"ok": True, "import_s": self.import_s, "stubbed_roots": sorted(self.finder.stubbed),
                    "real_dependencies": sorted(self.finder.real)}
        if op == "parsers":
            return {"ok": True, **self.glue.parsers()}
        if op == "parse":
            return self.parse(request)
        if op == "render":
            return self.run_job(request, self.glue.render)
        if op == "cache_kept" and hasattr(self.glue, "cache_kept"):  # a server flag that shapes the prefix cache
            return self.run_job(request, self.glue.cache_kept)
        if op == "network_check":  # the sandbox's own check: can this process open a connection to PyPI?
            import socket

            try:
                socket.create_connection(("pypi.org", 443), timeout=3).close()
                return {"ok": True, "reachable": True}
            except OSError as err:
                return {"ok": True, "reachable": False, "error": str(err)}
        return {"ok": False, "error": f"unknown op {op!r}"}

    def parse(self, job: dict) -> dict:
        return self.run_job(job, self.glue.parse)

    def _warm(self, job: dict, step: Any, tokenizer: VocabTokenizer, seed: str) -> None:
        random.seed(seed)
        self.touches.armed = True
        try:
            step(job, tokenizer)
        except Exception:  # noqa: BLE001 - the traced run after it reports it
            pass
        finally:
            self.touches.armed = False

    def run_job(self, job: dict, step: Any) -> dict:
        digest = job["tokenizer"]["sha256"]
        if "vocab" in job:
            self.vocabs[digest] = job.pop("vocab")
        tok = self.vocabs.get(digest)
        if tok is None:
            return {"ok": False, "error": f"vocabulary {digest[:12]} was never sent to this worker"}
        key = (digest, bool(job.get("harmony")))
        tokenizer = self.tokenizers.get(key)
        if tokenizer is None:  # one per vocabulary: serving code caches what it builds from its tokenizer
            tokenizer = self.tokenizers[key] = VocabTokenizer(tok["added"], tok["special"],
                                                              harmony=bool(job.get("harmony")),
                                                              tokenizer_json=tok.get("tokenizer_json"))
        # Seeded by the job's model text: a release that draws from `random` (vLLM's mistral parser makes its
        # 9-character call ids with random.choices) gives the same ids for the same text, so a cell is reproducible.
        # As ASCII JSON: model text may hold lone surrogates (invalid UTF-8 bytes), which random.seed cannot encode.
        seed = json.dumps([job.get("text"), job.get("messages")], sort_keys=True)
        self.touches.names.clear()
        tracer = None
        twin = _untraced_twin(job) if job.get("op") == "parse" else None
        if job.get("trace"):
            from engine.serving.real.tracer import Tracer

            # The job once untraced first: what the release does once per process or per tokenizer (imports, parser
            # classes and regexes built and cached, a vocabulary read) is then done before the tracer looks, so the
            # trace is the parse's own whichever jobs this worker answered before (a fresh worker's trace of vLLM
            # 0.33.0's DeepSeek V4 parse had ~2x the executed lines and other edits past the tracer's cap). Not when
            # this process already ran that very job untraced (a cell's parse, then its break's traced one).
            if twin not in self.answered:
                self._warm(job, step, tokenizer, seed)
            tracer = Tracer(str(self.root), job.get("text"))
        elif twin is not None:
            if len(self.answered) >= MAX_ANSWERED:  # a long-lived worker (the app's): a warm-up more, not memory
                self.answered.clear()
            self.answered.add(twin)
        random.seed(seed)
        started = time.perf_counter()
        self.touches.armed = True
        try:
            if tracer is not None:
                tracer.start()
            try:
                result = step(job, tokenizer)
            finally:
                if tracer is not None:
                    tracer.stop()
        except Exception as exc:  # the engine's code failed: report it, keep serving
            self.touches.armed = False
            frames = traceback.extract_tb(exc.__traceback__)
            where = next((f"{Path(f.filename).relative_to(self.root)}:{f.lineno}" for f in reversed(frames)
                          if f.filename.startswith(str(self.root))), None)
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "where": where,
                    "trace": traceback.format_exc(limit=-6), "warnings": sorted(self.touches.names)}
        finally:
            self.touches.armed = False
        reply = {"ok": True, "result": result, "ms": (time.perf_counter() - started) * 1000,
                 "warnings": sorted(self.touches.names)}
        if tracer is not None:
            reply["trace"] = tracer.report(self.root, result if isinstance(result, dict) else None)
        return reply


def _untraced_twin(job: dict) -> str:
    """The digest of a parse job as asked untraced (everything but `trace`)."""
    import hashlib

    untraced = {k: v for k, v in job.items() if k != "trace"}
    return hashlib.sha256(json.dumps(untraced, sort_keys=True, default=str).encode()).hexdigest()


def keep_compiled_patterns() -> None:
    """Let the `regex` package keep every pattern a release compiles (its cache holds 500; a pattern is compiled once,
    its result is the same either way). vLLM 0.33.0's parser engine compiles one pattern per special token of the
    tokenizer for each parser it builds, three a parse: DeepSeek V4's 1,230 thrashed the cache and cost 1.5 s a
    parse, 0.47 s with every pattern kept."""
    try:
        import regex._main
    except ImportError:
        return
    regex._main._MAXCACHE = max(regex._main._MAXCACHE, 1 << 14)


def main() -> None:
    engine, version, root = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    # NAME=FOLDER: a dependency the release pins, run for real from the engine cache (stubs.install)
    dependencies = {name: Path(folder) for name, _, folder in (a.partition("=") for a in sys.argv[4:])}
    reply_fd = int(os.environ["DRIFT_REPLY_FD"])
    replies = os.fdopen(reply_fd, "w", encoding="utf-8", buffering=1)
    sys.stdout = sys.stderr  # the engine's own prints must not corrupt the protocol
    logging.disable(logging.CRITICAL)
    try:
        import tokenizers  # noqa: F401 - real, loaded before the stubs are installed
    except ImportError:
        pass
    keep_compiled_patterns()
    try:
        worker = Worker(engine, version, root, dependencies)
        hello: dict[str, Any] = worker.handle({"op": "hello"})
    except Exception as exc:  # the release does not load
        hello = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=-8)}
        replies.write(json.dumps(hello) + "\n")
        return
    replies.write(json.dumps(hello) + "\n")
    for line in sys.stdin:
        try:
            reply = worker.handle(json.loads(line))
        except Exception as exc:  # noqa: BLE001 - a bug in the glue: report, keep serving
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=-6)}
        replies.write(json.dumps(reply, default=str) + "\n")


if __name__ == "__main__":
    main()
