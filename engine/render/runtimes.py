"""A model's real chat template rendered by another Jinja runtime: the `raw@minijinja`, `raw@hfjs` and
`ENGINE+minijinja` columns (issue 27).

    MiniJinja            the Rust runtime of Rust servers and gateways, through its Python binding (`minijinja`,
                         pinned in requirements.txt), rendering in this process
    @huggingface/jinja   the JavaScript runtime of transformers.js and several local runners, run by Node in one
                         long-lived process per explorer process (engine/render/hfjs/: package.json and its lock,
                         installed at run time into the engine cache by `npm ci`; `runner.mjs` speaks JSON lines)

Each runtime gets what transformers gives a template: the same messages and variables (JinjaRenderer.template_context:
transformers' own message normalisation), `trim_blocks` and `lstrip_blocks`, `raise_exception` and `strftime_now`,
and a `tojson` that takes transformers' options. @huggingface/jinja has all of them itself. MiniJinja has no
`raise_exception` or `strftime_now` (they are added, as transformers defines them) and its `tojson` takes `indent`
only. Its own `tojson` must stay in place (a Python filter in its stead would see the binding's conversion of 1.0 to
the int 1), so the bridge rewrites only the calls MiniJinja would refuse, in the source it is given
(`minijinja_source`): `tojson(ensure_ascii=False)` becomes `tojson` (its output never escapes non-ASCII, which is
what the option asks for; GLM-5.1, GLM-4.7-Flash, MiniMax M2.7), and a call with `separators`, `sort_keys` or
`ensure_ascii=True` calls `drift_tojson`, transformers' json.dumps (Kimi K2.6's `tojson(separators=(',', ':'))`).
The rewrite keeps every line where it was. Node receives the context as JSON, so a float with no fraction (1.0)
arrives as the number 1: JavaScript has one number type (the runtime's behaviour, not the bridge's). The Python
binding renders values as Python does (None, True, a dict's repr: MiniJinja's pycompat rendering, which the binding
always uses); a Rust server built on the crate's defaults prints none and true instead, which this column does not
measure.

The Node process runs off the network (`unshare -rn` where the kernel allows it), with a bounded heap, a clean
environment and a time limit per request (it is killed and restarted after one). Where Node or its package cannot be
had, the column is `unavailable` with one sentence.

`RuntimeRenderer` is the Renderer protocol over one runtime; its characters' provenance is the marked renders'
(engine.render.segments): each segment takes transformers' render's provenance for the same output.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import os
import re
import select
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, Protocol

from engine.errors import ExplorerError, RenderError
from engine.render import segments as marks
from engine.types import Rendered

HFJS_PACKAGE = Path(__file__).resolve().parent / "hfjs"
RUNTIME_LABELS = {"minijinja": "MiniJinja", "hfjs": "@huggingface/jinja"}
NODE_HEAP_MB = 768
NODE_STARTUP_TIMEOUT_S = float(os.environ.get("DRIFT_RUNTIME_STARTUP_TIMEOUT_S", 30))
NODE_RENDER_TIMEOUT_S = float(os.environ.get("DRIFT_RUNTIME_RENDER_TIMEOUT_S", 20))


class RuntimeUnavailable(ExplorerError):
    """A template runtime cannot run here (no Node, the package could not be installed); one sentence."""


class RenderFailure(str):
    """A runtime's refusal of one render: the runtime's own message."""


class TemplateRuntime(Protocol):
    name: str
    version: str

    @property
    def label(self) -> str:
        """The runtime and its version, as cells say it: "MiniJinja 3.1.0"."""

    def render_many(self, source: str, contexts: list[dict]) -> list[str | RenderFailure]:
        """`source` rendered once per context; a context the runtime refuses gives a RenderFailure."""


# -- MiniJinja ---------------------------------------------------------------------------------------------------


def _raise_exception(message: str) -> None:
    raise ValueError(message)  # transformers raises jinja2's TemplateError; MiniJinja reports any callback error


def _strftime_now(format: str) -> str:  # noqa: A002 - the name transformers gives it
    return datetime.datetime.now().strftime(format)


class MiniJinjaRuntime:
    name = "minijinja"

    def __init__(self) -> None:
        try:
            import minijinja
        except ImportError:
            raise RuntimeUnavailable("the minijinja package is not installed here (pip install -r requirements.txt "
                                     "installs the pinned one)") from None
        self.version = importlib.metadata.version("minijinja")
        self._lock = threading.Lock()
        self._names: set[str] = set()
        env = minijinja.Environment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False)
        env.add_function("raise_exception", _raise_exception)
        env.add_function("strftime_now", _strftime_now)
        env.add_filter("drift_tojson", _transformers_tojson)
        self._env = env

    @property
    def label(self) -> str:
        return f"{RUNTIME_LABELS[self.name]} {self.version}"

    def render_many(self, source: str, contexts: list[dict]) -> list[str | RenderFailure]:
        name = hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()
        with self._lock:
            if name not in self._names:
                try:
                    self._env.add_template(name, minijinja_source(source))
                except Exception as err:  # noqa: BLE001 - the binding's TemplateError: the template does not parse
                    return [RenderFailure(_first_line(err))] * len(contexts)
                self._names.add(name)
        results: list[str | RenderFailure] = []
        for context in contexts:
            try:
                results.append(self._env.render_template(name, **context))
            except Exception as err:  # noqa: BLE001 - a render error, a callback's exception or a panic
                results.append(RenderFailure(_first_line(err)))
        return results


def _transformers_tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
                         sort_keys: bool = False) -> str:
    """transformers' tojson (chat_template_utils.py), for the calls MiniJinja's own would refuse."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=tuple(separators) if separators is not None else None, sort_keys=sort_keys)


_TOJSON_CALL = re.compile(r"\btojson\s*\(")


def minijinja_source(source: str) -> str:
    """`source` with the tojson calls MiniJinja would refuse rewritten (module docstring); every other character as
    it was."""
    pieces, cursor = [], 0
    for match in _TOJSON_CALL.finditer(source):
        if match.start() < cursor:
            continue
        end = _closing_paren(source, match.end() - 1)
        if end < 0:
            continue
        arguments = source[match.end():end]
        names = _keyword_names(arguments)
        if names is None or names <= {"indent"}:
            continue
        if names <= {"indent", "ensure_ascii"} and re.search(r"ensure_ascii\s*=\s*(False|false)\b", arguments):
            kept = re.sub(r",?\s*ensure_ascii\s*=\s*(False|false)\s*,?", ",", arguments).strip(" ,")
            replacement = f"tojson({kept})" if kept else "tojson"
        else:
            replacement = f"drift_tojson({arguments})"
        pieces += [source[cursor:match.start()], replacement]
        cursor = end + 1
    return "".join(pieces) + source[cursor:]


def _closing_paren(source: str, start: int) -> int:
    """The index of the `)` that closes the `(` at `start` (string literals skipped), else -1."""
    depth = 0
    for index in marks.unquoted_indices(source, start):
        if source[index] == "(":
            depth += 1
        elif source[index] == ")":
            depth -= 1
            if depth == 0:
                return index
    return -1


def _keyword_names(arguments: str) -> set[str] | None:
    """The keyword names of a call's argument list (None when it does not parse or passes positionals)."""
    expression = marks.parse_expression(f"f({arguments})")
    if not isinstance(expression, marks.nodes.Call) or expression.args:
        return None
    return {k.key for k in expression.kwargs}


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


# -- @huggingface/jinja through Node -----------------------------------------------------------------------------


def _node_cache() -> Path:
    from engine.serving.real.fetch import cache_dir

    return cache_dir() / "node"


def hfjs_folder(*, install: bool = True) -> Path:
    """The folder holding node_modules/@huggingface/jinja as engine/render/hfjs/package-lock.json pins it, in the
    engine cache; installed there with `npm ci` the first time (RuntimeUnavailable in one sentence if it cannot be)."""
    lock = (HFJS_PACKAGE / "package-lock.json").read_bytes()
    package = (HFJS_PACKAGE / "package.json").read_bytes()
    target = _node_cache() / f"hfjs-{hashlib.sha256(package + lock).hexdigest()[:16]}"
    if (target / "node_modules" / "@huggingface" / "jinja" / "package.json").is_file():
        return target
    if not install:
        raise RuntimeUnavailable(f"@huggingface/jinja is not installed in {target} (python -m engine.render.runtimes "
                                 "install)")
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeUnavailable("npm is not installed here: the @huggingface/jinja column installs its pinned "
                                 "package with npm (Node.js 18 or newer)")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".hfjs-"))
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(HFJS_PACKAGE / name, staging / name)
    try:
        done = subprocess.run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--prefix", str(staging)],
                              capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise RuntimeUnavailable(f"npm could not install @huggingface/jinja ({type(err).__name__})") from None
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeUnavailable(f"npm could not install @huggingface/jinja: {last[:200]}")
    if target.exists():  # another process won
        shutil.rmtree(staging, ignore_errors=True)
    else:
        os.replace(staging, target)
    return target


class HfJinjaRuntime:
    name = "hfjs"

    def __init__(self) -> None:
        self.node = shutil.which("node")
        if self.node is None:
            raise RuntimeUnavailable("Node.js is not installed here: the @huggingface/jinja column runs the package "
                                     "with node (18 or newer) on PATH")
        self.folder = hfjs_folder()
        manifest = self.folder / "node_modules" / "@huggingface" / "jinja" / "package.json"
        self.version = json.loads(manifest.read_text(encoding="utf-8"))["version"]
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._sent: set[str] = set()  # template keys the running process has compiled
        self.started = 0  # processes started (a test reads it: one process serves many renders)

    @property
    def label(self) -> str:
        return f"{RUNTIME_LABELS[self.name]} {self.version}"

    def _start(self) -> subprocess.Popen:
        from engine.serving.real.process import network_isolation

        argv = [*network_isolation(), self.node, f"--max-old-space-size={NODE_HEAP_MB}", "--no-warnings",
                "--disallow-code-generation-from-strings", str(HFJS_PACKAGE / "runner.mjs")]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DRIFT_HFJS_DIR": str(self.folder),
               "HOME": str(self.folder)}
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                env=env, cwd=str(self.folder), text=True, encoding="utf-8")
        self._sent = set()
        self.started += 1
        return proc

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def render_many(self, source: str, contexts: list[dict]) -> list[str | RenderFailure]:
        if not contexts:
            return []
        key = hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = self._start()
                timeout = NODE_STARTUP_TIMEOUT_S + NODE_RENDER_TIMEOUT_S
            else:
                timeout = NODE_RENDER_TIMEOUT_S
            request: dict[str, Any] = {"key": key, "contexts": contexts}
            if key not in self._sent:
                request["source"] = source
            proc = self._proc
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(json.dumps(request, ensure_ascii=True, default=str) + "\n")
                proc.stdin.flush()
            except OSError:
                self.stop()
                raise RuntimeUnavailable("the @huggingface/jinja process (node) exited") from None
            ready, _, _ = select.select([proc.stdout], [], [], timeout + len(contexts) * 0.05)
            line = proc.stdout.readline() if ready else ""
            if not line:
                self.stop()
                raise RenderError(f"@huggingface/jinja {self.version} did not render within {timeout:.0f} s (node "
                                  "was stopped)" if not ready else
                                  f"@huggingface/jinja {self.version}'s node process exited while rendering")
            self._sent.add(key)
        reply = json.loads(line)
        if "error" in reply:
            return [RenderFailure(reply["error"])] * len(contexts)
        return [item["text"] if "text" in item else RenderFailure(item["error"]) for item in reply["results"]]


_RUNTIMES: dict[str, TemplateRuntime | RuntimeUnavailable] = {}
_RUNTIMES_LOCK = threading.Lock()


def runtime(name: str) -> TemplateRuntime:
    """The runtime `name` names (one instance per process); RuntimeUnavailable in one sentence, remembered too (a
    failed npm install is not tried again for every cell)."""
    with _RUNTIMES_LOCK:
        if name not in _RUNTIMES:
            try:
                if name == "minijinja":
                    _RUNTIMES[name] = MiniJinjaRuntime()
                elif name == "hfjs":
                    _RUNTIMES[name] = HfJinjaRuntime()
                else:
                    raise RuntimeUnavailable(f"no template runtime {name[:40]!r}; known: {', '.join(RUNTIME_LABELS)}")
            except RuntimeUnavailable as err:
                _RUNTIMES[name] = err
        found = _RUNTIMES[name]
    if isinstance(found, RuntimeUnavailable):
        raise RuntimeUnavailable(str(found))
    return found


# -- the renderer ------------------------------------------------------------------------------------------------


class RuntimeRenderer:
    """A Jinja template (`base`: the model's JinjaRenderer, through its cache) rendered by `engine`: the same
    messages and variables as transformers hands the template."""

    def __init__(self, base: Any, engine: TemplateRuntime) -> None:
        self.base = base
        self.runtime = engine
        self.model = base.model
        self.template_source: str = base.template_source
        self.source_path: str = base.source_path
        self.origin = f"{base.origin} via {engine.label}"

    def source_lines(self) -> list[str]:
        return self.base.source_lines()

    def context(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool,
                kwargs: dict | None) -> dict:
        chat, variables = self.base.template_context(messages, tools, add_generation_prompt, kwargs)
        return {"messages": chat, **variables}

    def render_source(self, source: str, contexts: list[dict]) -> list[str | RenderFailure]:
        return self.runtime.render_many(source, contexts)

    def render(self, messages: list[dict], tools: list[dict] | None, *, add_generation_prompt: bool,
               kwargs: dict | None = None) -> Rendered:
        context = self.context(messages, tools, add_generation_prompt, kwargs)
        (text,) = self.runtime.render_many(self.template_source, [context])
        if isinstance(text, RenderFailure):
            raise RenderError(f"{self.source_path} for model {self.model} failed under {self.runtime.label}: {text}",
                              model=self.model, path=self.source_path)
        return Rendered(text=text, source_path=self.source_path, origin=self.origin,
                        provenance=lambda: self._provenance(text, messages, tools, add_generation_prompt, kwargs))

    def _provenance(self, text: str, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool,
                    kwargs: dict | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Per character: transformers' render's provenance where a segment prints what transformers' does, the
        segment's output line (and the message transformers' segment came from) where it prints otherwise."""
        unknown = ((-1,) * len(text), (0,) * len(text))
        compared = compare_renders(self, messages, tools, add_generation_prompt, kwargs)
        if compared is None or compared.runtime_text != text:
            return unknown
        reference = self.base.render(messages, tools, add_generation_prompt=add_generation_prompt, kwargs=kwargs)
        if reference.text != compared.reference_text:
            return unknown
        message_index, source_line = list(unknown[0]), list(unknown[1])
        ref_messages, ref_lines = reference.message_index, reference.source_line
        scanned = compared.scanned
        for index, mine in enumerate(compared.runtime_segments):
            theirs = compared.aligned(index)
            if theirs is not None and theirs.text == mine.text:
                message_index[mine.start:mine.end] = ref_messages[theirs.start:theirs.end]
                source_line[mine.start:mine.end] = ref_lines[theirs.start:theirs.end]
                continue
            line = scanned.outputs[mine.output].line if 0 <= mine.output < len(scanned.outputs) else 0
            message = ref_messages[theirs.start] if theirs is not None and theirs.start < len(ref_messages) else -1
            message_index[mine.start:mine.end] = [message] * (mine.end - mine.start)
            source_line[mine.start:mine.end] = [line] * (mine.end - mine.start)
        return tuple(message_index), tuple(source_line)


class ComparedRenders:
    """One request rendered from the marked template by transformers' Jinja and by a runtime: both texts (without
    markers) and their segments, aligned by position while the two runtimes' segment keys agree."""

    def __init__(self, scanned: marks.ScannedTemplate, reference: tuple[str, tuple[marks.Segment, ...]],
                 runtime: tuple[str, tuple[marks.Segment, ...]], context: dict) -> None:
        self.scanned = scanned
        self.reference_text, self.reference_segments = reference
        self.runtime_text, self.runtime_segments = runtime
        self.context = context
        agree = 0
        for mine, theirs in zip(self.runtime_segments, self.reference_segments):
            if mine.key != theirs.key:
                break
            agree += 1
        self.agree = agree  # segments [0, agree) have the same keys in both renders

    def aligned(self, index: int) -> marks.Segment | None:
        """The reference's segment at the same position as the runtime's segment `index`, while the keys agree."""
        return self.reference_segments[index] if index < self.agree else None


def reference_render(source: str, context: dict) -> str:
    """`source` rendered as transformers renders a chat template (its environment, its globals)."""
    from engine.render.jinja import transformers_pieces

    template = transformers_pieces()._compile_jinja_template(source)
    return template.render(**context)


def compare_renders(renderer: RuntimeRenderer, messages: list[dict], tools: list[dict] | None,
                    add_generation_prompt: bool, kwargs: dict | None) -> ComparedRenders | None:
    """The request's marked renders by transformers and by the renderer's runtime; None where the template cannot be
    marked (engine.render.segments) or either render fails."""
    scanned = marks.scan(renderer.template_source)
    if scanned is None:
        return None
    context = renderer.context(messages, tools, add_generation_prompt, kwargs)
    marked = scanned.marked()
    try:
        reference = marks.segments(reference_render(marked, context))
    except Exception:  # noqa: BLE001 - transformers refusing the marked template: no segments, no comparison
        return None
    (mine,) = renderer.render_source(marked, [context])
    runtime_segments = None if isinstance(mine, RenderFailure) else marks.segments(mine)
    if reference is None or runtime_segments is None:
        return None
    return ComparedRenders(scanned, reference, runtime_segments, context)


def main(argv: list[str] | None = None) -> int:
    """`python -m engine.render.runtimes install`: install @huggingface/jinja into the engine cache (.ci/run)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if args != ["install"]:
        print("usage: python -m engine.render.runtimes install", file=sys.stderr)
        return 2
    try:
        print(f"@huggingface/jinja in {hfjs_folder()}")
    except RuntimeUnavailable as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
