"""Hostile templates and files: each is stopped or refused with its exact sentence, and everything else keeps working.

Every case also proves the aftermath: a normal render in the sandbox is still byte-identical to JinjaRenderer's, and
the stock model's cell and a stored good upload's cell still give the stock status. Hostile files are generated here;
time figures are hang guards only.
"""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from stored import replace_stored

from engine.assets import resolve_asset
from engine.errors import ExplorerError, RenderError
from engine.models import load_model, model_ids, special_token_vars
from engine.render.jinja import JinjaRenderer
from engine.sandbox import (
    RenderLimitExceeded,
    RenderLimits,
    SandboxedRenderer,
)
from engine.simulate import run_cell_with
from engine.uploads import UploadError, UploadLimits, read_capped
from engine.workspace import Workspace

MODEL = "qwen3.5+hostile"
FAST = RenderLimits(timeout_s=1.5)  # for cases the time limit must stop
ROOMY = RenderLimits(timeout_s=60.0)  # for cases another limit must stop, however loaded the machine is
HANG_GUARD_S = 60.0
BASIC = [{"role": "user", "content": "What's the weather in Paris today?"}]
MB = 1024 * 1024


@pytest.fixture(scope="module")
def stock():
    return load_model("qwen3.5")


@pytest.fixture(scope="module")
def stock_files(stock) -> dict[str, bytes]:
    spec = stock.spec
    return {role: resolve_asset(spec.id, spec.hub_repo, spec.assets[role]).data
            for role in ("chat_template", "tokenizer")}


@pytest.fixture(scope="module")
def good(tmp_path_factory, stock_files):
    """A workspace holding one good upload (the stock template under another name), shared by the whole module."""
    workspace = Workspace(tmp_path_factory.mktemp("good-workspace"))
    upload = workspace.add("qwen3.5", {"chat_template": ("good.jinja", stock_files["chat_template"])}, "good")
    return workspace, upload


@pytest.fixture(scope="module")
def still_works(stock, stock_files, good):
    workspace, upload = good
    source = stock_files["chat_template"].decode("utf-8")
    stock_cell = run_cell_with(stock, "tool-call", "raw", {})
    assert stock_cell.status == "holds"

    def check() -> None:
        sandboxed = SandboxedRenderer(source, model="qwen3.5", source_path=stock.renderer.source_path,
                                      special_tokens=special_token_vars(stock.spec), limits=ROOMY)
        kwargs = stock.spec.default_kwargs()
        assert sandboxed.render(BASIC, None, add_generation_prompt=True, kwargs=kwargs) == \
            stock.renderer.render(BASIC, None, add_generation_prompt=True, kwargs=kwargs)
        again = run_cell_with(stock, "tool-call", "raw", {})
        assert again.status == stock_cell.status
        custom = run_cell_with(workspace.load_model(upload.id, ROOMY), "tool-call", "raw", {})
        assert custom.status == stock_cell.status
        assert [b.token_prefix for b in custom.boundaries] == [b.token_prefix for b in stock_cell.boundaries]
        assert workspace.list().uploads == (upload,)

    return check


def render_hostile(source: str, limits: RenderLimits) -> tuple[str | RenderError, float]:
    started = time.monotonic()
    try:
        renderer = SandboxedRenderer(source, model=MODEL, source_path="custom.jinja", limits=limits)
        outcome: str | RenderError = renderer.render(BASIC, None, add_generation_prompt=True).text
    except RenderError as err:
        outcome = err
    return outcome, time.monotonic() - started


# ---- templates the limits stop ------------------------------------------------------------------------------

DEPTH = f"custom.jinja for model {MODEL} was stopped: macro calls or recursive loops nested more than 200 deep " \
        "(recursion depth limit)"


def memory(line: int) -> str:
    return f"custom.jinja for model {MODEL} was stopped at line {line}: it needed more memory than the 1024 MB " \
           "allowed (memory limit)"


def output(line: int) -> str:
    return f"custom.jinja for model {MODEL} was stopped at line {line} after producing more than 2,000,000 " \
           "characters (output size limit)"


LIMIT_CASES = [
    ("nested-loops-over-huge-ranges", "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
     "{% endfor %}", FAST, "time", f"custom.jinja for model {MODEL} was stopped after 1.5 s (render time limit)"),
    ("power-tower-folded-at-compile-time", "{{ 9 ** (9 ** 9) }}", FAST, "time",
     f"custom.jinja for model {MODEL} was stopped after 1.5 s while compiling (render time limit)"),
    ("infinite-recursive-macro", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", ROOMY, "depth", DEPTH),
    ("mutually-recursive-macros", "{% macro a(n) %}{{ b(n) }}{% endmacro %}{% macro b(n) %}{{ a(n) }}"
     "{% endmacro %}{{ a(0) }}", ROOMY, "depth", DEPTH),
    ("recursive-loop", "{% for x in [1] recursive %}{{ loop([x]) }}{% endfor %}", ROOMY, "depth", DEPTH),
    ("macro-201-deep", "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% else %}bottom{% endif %}{% endmacro %}"
     "{{ f(200) }}", ROOMY, "depth", DEPTH),
    ("string-times-a-billion", "{{ 'x' * 10**9 }}", ROOMY, "memory", memory(1)),
    ("exponential-string-doubling", "{% set ns = namespace(s='x') %}\n{% for i in range(64) %}\n"
     "{% set ns.s = ns.s ~ ns.s %}\n{% endfor %}{{ ns.s }}", ROOMY, "memory", memory(3)),
    ("format-width-bomb", "{{ '{:>1000000000}'.format('x') }}", ROOMY, "memory", memory(1)),
    ("tojson-indent-bomb", "{{ messages | tojson(indent=100000000) }}", ROOMY, "memory", memory(1)),
    ("output-flood", "{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}", ROOMY, "output", output(1)),
    ("one-huge-output", "{{ 'x' * 3000000 }}", ROOMY, "output", output(1)),
    ("flood-built-in-a-macro", "{% macro m() %}{% for i in range(100000) %}xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
     "{% endfor %}{% endmacro %}\n{{ m() }}", ROOMY, "output", output(2)),
]


@pytest.mark.parametrize("source,limits,limit,message", [c[1:] for c in LIMIT_CASES], ids=[c[0] for c in LIMIT_CASES])
def test_a_limit_stops_the_template(source, limits, limit, message, still_works):
    outcome, elapsed = render_hostile(source, limits)
    assert isinstance(outcome, RenderLimitExceeded)
    assert (outcome.limit, str(outcome)) == (limit, message)
    assert elapsed < limits.timeout_s + HANG_GUARD_S
    still_works()


def test_deep_recursion_within_the_limit_renders(still_works):
    outcome, _ = render_hostile("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% else %}bottom{% endif %}"
                                "{% endmacro %}{{ f(199) }}", ROOMY)
    assert outcome == "bottom"
    still_works()


# ---- templates the Jinja sandbox refuses or defuses -----------------------------------------------------------

def raised(detail: str) -> str:
    return f"custom.jinja for model {MODEL} raised at line 1: {detail}"


ERROR_CASES = [
    ("str-mro", "{{ ''.__class__.__mro__ }}", raised("access to attribute '__class__' of 'str' object is unsafe.")),
    ("cycler-init-globals", "{{ cycler.__init__.__globals__ }}",
     raised("access to attribute '__init__' of 'type' object is unsafe.")),
    ("list-subclasses", "{{ messages.__class__.__base__.__subclasses__() }}",
     raised("access to attribute '__class__' of 'list' object is unsafe.")),
    ("lipsum-globals", "{{ lipsum.__globals__['os'] }}",
     raised("access to attribute '__globals__' of 'function' object is unsafe.")),
    ("tuple-bases", "{{ ().__class__.__bases__[0] }}",
     raised("access to attribute '__class__' of 'tuple' object is unsafe.")),
    ("format-map-trick", "{{ '{0.__class__.__mro__}'.format_map(messages) }}",
     f"custom.jinja for model {MODEL} failed at line 1: IndexError: tuple index out of range"),
    ("raise-exception", "{% if messages[0].role != 'system' %}{{ raise_exception('System message required!') }}"
     "{% endif %}", raised("System message required!")),
    ("undefined-attribute", "{{ foo.bar }}", raised("'foo' is undefined")),
    ("range-beyond-the-sandbox", "{% for i in range(10**6) %}{% endfor %}",
     f"custom.jinja for model {MODEL} failed at line 1: OverflowError: Range too big. The sandbox blocks ranges "
     "larger than MAX_RANGE (100000)."),
    ("division-by-zero", "{{ 1 / 0 }}", f"custom.jinja for model {MODEL} failed at line 1: ZeroDivisionError: "
     "division by zero"),
]


@pytest.mark.parametrize("source,message", [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_the_template_error_is_one_sentence(source, message, still_works):
    outcome, elapsed = render_hostile(source, ROOMY)
    assert type(outcome) is RenderError
    assert (str(outcome), outcome.source_line) == (message, 1)
    assert elapsed < HANG_GUARD_S
    still_works()


DEFUSED_CASES = [
    ("template-reference-context", "<{{ self._TemplateReference__context }}>"),
    ("namespace-init", "<{{ namespace.__init__ }}>"),
    ("format-string-attribute", "<{{ '{0.__class__}'.format(messages) }}>"),
    ("attr-filter-dunder", "<{{ messages | attr('__class__') }}>"),
    ("raise-exception-globals", "<{{ raise_exception.__globals__ }}>"),
]


@pytest.mark.parametrize("source", ["{{ m.content }", "{% for m in messages %}\n{{ m }}", "{{ foo.bar }}",
                                    "{{ raise_exception('stop') }}", "line 1\n{{ messages | nosuchfilter }}"])
def test_template_errors_read_as_jinja_renderer_says_them(source):
    with pytest.raises(RenderError) as in_process:
        JinjaRenderer(source, model=MODEL, source_path="custom.jinja").render(BASIC, None, add_generation_prompt=True)
    outcome, _ = render_hostile(source, ROOMY)
    assert isinstance(outcome, RenderError) and not isinstance(outcome, RenderLimitExceeded)
    assert (str(outcome), outcome.source_line) == (str(in_process.value), in_process.value.source_line)


@pytest.mark.parametrize("source", [c[1] for c in DEFUSED_CASES], ids=[c[0] for c in DEFUSED_CASES])
def test_python_internals_render_as_nothing(source, still_works):
    outcome, _ = render_hostile(source, ROOMY)
    assert outcome == "<>"
    still_works()


def test_the_sandbox_is_byte_identical_to_jinja_renderer_on_every_stock_template():
    from engine.scenario import load_scenario

    scenario = load_scenario("parallel-tool-calls")
    history = [{"role": "user", "content": "Weather in Paris and Rome?"},
               {"role": "assistant", "content": "", "reasoning_content": "two calls",
                "tool_calls": [{"id": "c1", "type": "function",
                                "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    checked = []
    for model_id in ("qwen3.6", "qwen3.5", "glm-5.1", "kimi-k2.6", "gpt-oss"):
        spec = load_model(model_id).spec
        stock_source = resolve_asset(spec.id, spec.hub_repo, spec.assets["chat_template"]).data.decode("utf-8")
        name = Path(spec.assets["chat_template"].path).name
        in_process = JinjaRenderer(stock_source, model=model_id, source_path=name,
                                   special_tokens=special_token_vars(spec))
        sandboxed = SandboxedRenderer(stock_source, model=model_id, source_path=name,
                                      special_tokens=special_token_vars(spec), limits=ROOMY)
        assert sandboxed.source_lines() == in_process.source_lines()
        assert sandboxed.origin == in_process.origin == f"template {model_id}"
        for generation_prompt in (True, False):
            kwargs = spec.default_kwargs()
            expected = in_process.render(history, scenario.tools, add_generation_prompt=generation_prompt,
                                         kwargs=kwargs)
            assert sandboxed.render(history, scenario.tools, add_generation_prompt=generation_prompt,
                                    kwargs=kwargs) == expected
            checked.append((model_id, len(expected.text)))
    assert len(checked) == 10 and all(length > 0 for _, length in checked)


def kill_once_running(pid: int) -> None:
    """SIGKILL the worker once the render is under way: it runs (state R) instead of waiting for a request (S)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            if stat.read().rpartition(")")[2].split()[0] == "R":
                break
        time.sleep(0.01)  # a poll interval, not a wait for something to happen
    os.kill(pid, signal.SIGKILL)


def test_a_worker_killed_mid_render_is_a_clear_error_and_the_next_render_works(still_works):
    renderer = SandboxedRenderer("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                                 model=MODEL, source_path="custom.jinja", limits=ROOMY)
    pid = renderer.worker_pid
    assert pid is not None
    killer = threading.Thread(target=kill_once_running, args=(pid,))
    killer.start()
    started = time.monotonic()
    with pytest.raises(RenderError) as caught:
        renderer.render(BASIC, None, add_generation_prompt=True)
    killer.join()
    assert type(caught.value) is RenderError
    assert str(caught.value) == (f"custom.jinja for model {MODEL} crashed the sandbox worker (exit status -9); the "
                                 "memory limit is 1024 MB")
    assert time.monotonic() - started < HANG_GUARD_S
    assert renderer.worker_pid not in (None, pid)
    still_works()


# ---- uploads the validation refuses ---------------------------------------------------------------------------

def refused(workspace: Workspace, base: str, files: dict[str, tuple[str, bytes]], **kwargs) -> tuple[str, float]:
    before = workspace.list()
    started = time.monotonic()
    with pytest.raises(UploadError) as caught:
        workspace.add(base, files, "hostile", **kwargs)
    elapsed = time.monotonic() - started
    after = workspace.list()
    assert after == before  # nothing stored, nothing left half-written
    assert not workspace.root.exists() or not any(p.name.startswith(".tmp-") for p in workspace.root.iterdir())
    return str(caught.value), elapsed


TEMPLATE_REFUSALS = [
    ("unclosed-print", b"{% for m in messages %}{{ m.content }",
     "custom.jinja does not parse: unexpected '}' (line 1, column 37)"),
    ("unclosed-for", b"line1\n{% for m in messages %}\n{{ m.content }}\n",
     "custom.jinja does not parse: Unexpected end of template. Jinja was looking for the following tags: 'endfor' or "
     "'else'. The innermost block that needs to be closed is 'for'. (line 3, column 16)"),
    ("unknown-tag", b"x\ny\n  {% foo %}",
     "custom.jinja does not parse: Encountered unknown tag 'foo'. (line 3, column 6)"),
    ("unclosed-string", b"{{ 'abc }}", "custom.jinja does not parse: unexpected char \"'\" at 3 (line 1, column 4)"),
    ("unknown-filter", b"  {{ messages[0]['content'] | nosuchfilter }}",
     "custom.jinja does not parse: No filter named 'nosuchfilter'. (line 1, column 31)"),
    ("undefined-variable", b"{{ foo.bar }}", "custom.jinja for model qwen3.5 (upload) raised at line 1: 'foo' is "
     "undefined (rendering the first request of scenario tool-call)"),
    ("raise-exception", b"{{ raise_exception('no tools here') }}", "custom.jinja for model qwen3.5 (upload) raised at "
     "line 1: no tools here (rendering the first request of scenario tool-call)"),
    ("renders-nothing", b"{# nothing at all #}",
     "custom.jinja renders an empty prompt for the first request of scenario tool-call (base model qwen3.5)"),
    ("renders-only-whitespace", b"{% for m in messages %}{% endfor %}{{ '\\n  \\n' }}",
     "custom.jinja renders an empty prompt for the first request of scenario tool-call (base model qwen3.5): it "
     "rendered only '\\n  \\n'"),
    ("loops-forever", b"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
     "custom.jinja for model qwen3.5 (upload) was stopped after 1.5 s (render time limit)"),
    ("binary-file", bytes([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]) + os.urandom(64),
     "custom.jinja is not UTF-8 text: byte 0x89 at byte offset 0 cannot be decoded (invalid start byte)"),
    ("invalid-utf8-inside", "{{ messages[0].content }} café".encode() + b"\xc3\x28 more",
     "custom.jinja is not UTF-8 text: byte 0xc3 at byte offset 31 cannot be decoded (invalid continuation byte)"),
    ("nul-bytes", b"{{ x }}\x00\x00\x00", "custom.jinja contains a NUL byte at byte offset 7: it is a binary file, not "
     "text"),
    ("empty-file", b"", "custom.jinja is empty"),
]


@pytest.mark.parametrize("data,message", [c[1:] for c in TEMPLATE_REFUSALS], ids=[c[0] for c in TEMPLATE_REFUSALS])
def test_a_bad_template_upload_is_refused(tmp_path, data, message, still_works):
    text, elapsed = refused(Workspace(tmp_path), "qwen3.5", {"chat_template": ("custom.jinja", data)},
                            render_limits=FAST)
    assert text == message
    assert elapsed < FAST.timeout_s + HANG_GUARD_S
    still_works()


def test_a_50_mb_template_is_refused_before_it_is_read(tmp_path, still_works):
    data = b"{{ messages }}" * (50 * MB // 14 + 1)
    assert len(data) >= 50 * MB
    text, elapsed = refused(Workspace(tmp_path), "qwen3.5", {"chat_template": ("custom.jinja", data)})
    assert text == "custom.jinja is 50.0 MB, over the 5.0 MB limit for a chat template (DRIFT_UPLOAD_MAX_TEXT_BYTES)"
    assert elapsed < HANG_GUARD_S
    stream = io.BytesIO(data)
    with pytest.raises(UploadError) as caught:
        read_capped(stream, "custom.jinja", "chat_template", UploadLimits())
    assert str(caught.value) == ("custom.jinja is larger than the 5.0 MB limit for a chat template "
                                 "(DRIFT_UPLOAD_MAX_TEXT_BYTES)")
    assert stream.tell() == 5 * MB + 1  # read one byte past the cap, not the 50 MB
    still_works()


def test_a_tokenizer_over_50_mb_is_refused(tmp_path, stock_files, still_works):
    data = b" " * (50 * MB + 1)
    text, _ = refused(Workspace(tmp_path), "qwen3.5", {"chat_template": ("custom.jinja", stock_files["chat_template"]),
                                                         "tokenizer": ("tokenizer.json", data)})
    assert text == ("tokenizer.json is 50.0 MB, over the 50.0 MB limit for a tokenizer.json "
                    "(DRIFT_UPLOAD_MAX_TOKENIZER_BYTES)")
    still_works()


CONFIG_REFUSALS = [
    ("not-json", b'{"chat_template": "x" "bos_token": 1}',
     "tokenizer_config.json is not valid JSON: Expecting ',' delimiter (line 1, column 23)"),
    ("not-an-object", b'["chat_template"]', "tokenizer_config.json must be a JSON object, not a list"),
    ("template-list-without-default", json.dumps({"chat_template": [{"name": "tool_use", "template": "x"},
                                                                    {"name": "rag", "template": "y"}]}).encode(),
     "tokenizer_config.json: chat_template has no template named 'default' (it has: 'tool_use', 'rag')"),
    ("template-list-entry-malformed", json.dumps({"chat_template": [{"name": "default"}]}).encode(),
     "tokenizer_config.json: chat_template[0] must be an object with string 'name' and 'template'"),
    ("template-is-a-number", b'{"chat_template": 42}',
     "tokenizer_config.json: chat_template must be a string or a list of {name, template} objects, not a number"),
    ("special-token-mistyped", b'{"chat_template": "{{ messages }}", "eos_token": ["<|im_end|>"]}',
     "tokenizer_config.json: eos_token must be a string or an object with a string 'content', not a list"),
    ("template-does-not-parse", json.dumps({"chat_template": "{% if %}"}).encode(),
     "tokenizer_config.json (chat_template) does not parse: Expected an expression, got 'end of statement block' "
     "(line 1, column 7)"),
]


@pytest.mark.parametrize("data,message", [c[1:] for c in CONFIG_REFUSALS], ids=[c[0] for c in CONFIG_REFUSALS])
def test_a_bad_tokenizer_config_is_refused(tmp_path, data, message, still_works):
    text, _ = refused(Workspace(tmp_path), "qwen3.5", {"tokenizer_config": ("tokenizer_config.json", data)})
    assert text == message
    still_works()


def test_a_tokenizer_config_template_list_uses_default_and_its_tokens(tmp_path, stock, stock_files):
    source = stock_files["chat_template"].decode("utf-8")
    config = {"chat_template": [{"name": "tool_use", "template": "{{ raise_exception('not this one') }}"},
                                {"name": "default", "template": source}],
              "eos_token": {"content": "<|im_end|>", "special": True}, "bos_token": None}
    workspace = Workspace(tmp_path)
    upload = workspace.add("qwen3.5", {"tokenizer_config": ("tokenizer_config.json", json.dumps(config).encode())})
    assert (upload.label, upload.original_names) == ("tokenizer_config", {"tokenizer_config": "tokenizer_config.json"})
    model = workspace.load_model(upload.id, ROOMY)
    assert model.renderer.source_path == "tokenizer_config.json (chat_template)"
    assert run_cell_with(model, "tool-call", "raw", {}).status == run_cell_with(stock, "tool-call", "raw", {}).status


def _tokenizer_without(stock_files: dict[str, bytes], content: str) -> bytes:
    document = json.loads(stock_files["tokenizer"])
    document["added_tokens"] = [t for t in document["added_tokens"] if t["content"] != content]
    return json.dumps(document).encode()


TOKENIZER_REFUSALS = [
    ("not-json", lambda files: b"{\"model\": ",
     "tokenizer.json is not valid JSON: Expecting value (line 1, column 11)"),
    ("nested-too-deeply", lambda files: b"[" * 200000 + b"]" * 200000,
     "tokenizer.json is not usable JSON: it is nested too deeply"),
    ("no-model", lambda files: b'{"added_tokens": []}',
     "tokenizer.json is not a tokenizer.json: it has no \"model\" object with a \"type\""),
    ("added-tokens-not-a-list", lambda files: b'{"model": {"type": "BPE"}, "added_tokens": {}}',
     "tokenizer.json is not a tokenizer.json: \"added_tokens\" must be a list, not an object"),
    ("added-token-malformed", lambda files: b'{"model": {"type": "BPE"}, "added_tokens": [{"id": "1"}]}',
     "tokenizer.json: added_tokens[0] must be an object with an integer \"id\" and a string \"content\""),
    ("tokenizers-refuses-it", lambda files: b'{"model": {"type": "BPE"}, "added_tokens": []}',
     "tokenizer.json does not load with tokenizers 0.23.3: Missing vocab/merges at line 1 column 25"),
    ("special-tokens-do-not-match", lambda files: _tokenizer_without(files, "<|im_start|>"),
     "tokenizer.json has no single token for '<|im_start|>', which custom.jinja emits in the first request of "
     "scenario tool-call: the tokenizer does not match the template"),
    ("empty-vocabulary", lambda files: b'{"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}, '
     b'"added_tokens": []}',
     "tokenizer.json has no single token for '<|im_start|>', which custom.jinja emits in the first request of "
     "scenario tool-call: the tokenizer does not match the template (also missing: '<tool_call>', '</tool_call>', "
     "'<|im_end|>')"),
]


@pytest.mark.parametrize("make,message", [c[1:] for c in TOKENIZER_REFUSALS], ids=[c[0] for c in TOKENIZER_REFUSALS])
def test_a_bad_tokenizer_json_is_refused(tmp_path, stock_files, make, message, still_works):
    files = {"chat_template": ("custom.jinja", stock_files["chat_template"]),
             "tokenizer": ("tokenizer.json", make(stock_files))}
    text, elapsed = refused(Workspace(tmp_path), "qwen3.5", files)
    assert text == message
    assert elapsed < UploadLimits().load_timeout_s + HANG_GUARD_S
    still_works()


def test_loading_a_tokenizer_is_bounded_in_time_and_memory(tmp_path, stock_files, still_works):
    files = {"tokenizer": ("tokenizer.json", stock_files["tokenizer"])}
    slow, elapsed = refused(Workspace(tmp_path, upload_limits=UploadLimits(load_timeout_s=0.1)), "qwen3.5", files)
    assert slow == ("tokenizer.json could not be loaded within 0.1 s (load time limit) (DRIFT_UPLOAD_LOAD_TIMEOUT_S)")
    assert elapsed < HANG_GUARD_S
    small, _ = refused(Workspace(tmp_path, upload_limits=UploadLimits(load_memory_mb=100)), "qwen3.5", files)
    assert small == ("tokenizer.json could not be loaded within the 100 MB memory limit (DRIFT_UPLOAD_LOAD_MEMORY_MB)")
    still_works()


TIKTOKEN_REFUSALS = [
    ("not-two-fields", b"IQ== 0\nabc\n", "tiktoken.model line 2: expected '<base64 token> <rank>', got 'abc'."),
    ("bad-base64", b"IQ== 0\n!!!! 1\n", "tiktoken.model line 2: token '!!!!' is not valid base64 (Only base64 data is "
     "allowed)."),
    ("rank-not-a-number", b"IQ== 0\nIg== one\n", "tiktoken.model line 2: rank 'one' is not a non-negative integer."),
    ("duplicate-rank", b"IQ== 0\nIg== 1\nIw== 1\n", "tiktoken.model line 3: rank 1 appears a second time."),
    ("gap-in-ranks", b"IQ== 0\nIg== 2\n", "tiktoken.model: ranks are not contiguous, rank 1 is missing."),
    ("binary", bytes(range(256)) * 4, "tiktoken.model line 1: expected '<base64 token> <rank>', got "
     "'\\x00\\x01\\x02\\x03\\x04\\x05\\x06\\x07\\x08\\t'."),
    ("too-few-ranks", b"IQ== 0\nIg== 1\nIw== 2\n", "Kimi tokenizer file tiktoken.model has 3 ranks, expected 163584: "
     "this is not Kimi K2's tiktoken.model."),
]


@pytest.mark.parametrize("data,message", [c[1:] for c in TIKTOKEN_REFUSALS], ids=[c[0] for c in TIKTOKEN_REFUSALS])
def test_a_bad_tiktoken_model_is_refused(tmp_path, data, message, still_works):
    text, _ = refused(Workspace(tmp_path), "kimi-k2.6", {"tiktoken": ("tiktoken.model", data)})
    assert text == message
    still_works()


UPLOAD_SHAPE_REFUSALS = [
    ("unknown-base-model", "nosuch", {"chat_template": ("custom.jinja", b"x")},
     f"unknown base model 'nosuch'; known: {', '.join(model_ids())}"),
    ("unknown-role", "qwen3.5", {"vocab": ("vocab.txt", b"x")},
     "vocab.txt: unknown upload role 'vocab'; expected one of chat_template, tokenizer_config, tokenizer, tiktoken"),
    ("no-files", "qwen3.5", {}, "the upload for qwen3.5 holds no files"),
    ("tiktoken-for-qwen", "qwen3.5", {"tiktoken": ("tiktoken.model", b"IQ== 0\n")},
     "tiktoken.model: a tiktoken.model only fits a base model whose tokenizer is one (kimi-k2.6), not qwen3.5"),
    ("two-tokenizers", "kimi-k2.6", {"tokenizer": ("tokenizer.json", b"{}"), "tiktoken": ("tiktoken.model", b"x")},
     "tokenizer.json and tiktoken.model: upload one tokenizer, not two"),
]


@pytest.mark.parametrize("base,files,message", [c[1:] for c in UPLOAD_SHAPE_REFUSALS],
                         ids=[c[0] for c in UPLOAD_SHAPE_REFUSALS])
def test_a_malformed_upload_is_refused(tmp_path, base, files, message):
    text, _ = refused(Workspace(tmp_path), base, files)
    assert text == message


# ---- a template that passes validation and turns hostile later -------------------------------------------------

def test_a_template_hostile_only_on_tool_results_is_refused_and_a_stored_one_costs_one_limit_a_view(
        tmp_path, stock, stock_files, still_works):
    from engine.sandbox import render_scope

    source = stock_files["chat_template"].decode("utf-8")
    sneaky = ("{%- if messages | selectattr('role', 'equalto', 'tool') | list %}{% for i in range(100000) %}"
              "{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}" + source)
    workspace = Workspace(tmp_path)
    text, _ = refused(workspace, "qwen3.5", {"chat_template": ("sneaky.jinja", sneaky.encode())},
                      render_limits=FAST)
    # The probe (the first request of tool-call) renders; the sweep over every scenario finds the loop.
    assert text == ("sneaky.jinja for model qwen3.5 (upload) was stopped after 1.5 s (render time limit) on scenario "
                    "args-serialization; a template that hits a limit on any scenario is refused, so that no view "
                    "waits on it")
    assert workspace.list().uploads == ()
    # One stored before validation swept every scenario (written here as an older version would have): in one view,
    # the first cell pays the time limit and every later render of it says so at once.
    upload = workspace.add("qwen3.5", {"chat_template": ("sneaky.jinja", stock_files["chat_template"])}, "sneaky")
    replace_stored(upload, "chat_template", sneaky.encode())
    model = workspace.load_model(upload.id, FAST)
    started = time.monotonic()
    with render_scope():
        first = run_cell_with(model, "tool-call", "raw", {})
        second = run_cell_with(model, "parallel-tool-calls", "raw", {})
    assert (first.model, first.status) == ("qwen3.5+sneaky", "error")
    assert first.note == "sneaky.jinja for model qwen3.5+sneaky was stopped after 1.5 s (render time limit)"
    assert second.status == "error"
    assert second.note == (f"{first.note} earlier in this view, so it was not rendered again")
    assert time.monotonic() - started < FAST.timeout_s + HANG_GUARD_S
    assert run_cell_with(model, "no-tools-next-user", "raw", {}).status == \
        run_cell_with(stock, "no-tools-next-user", "raw", {}).status
    still_works()


# ---- the workspace survives crashes and keeps uploads apart ----------------------------------------------------

def test_a_crash_mid_write_never_breaks_the_next_start(tmp_path, good, stock_files):
    workspace = Workspace(tmp_path)
    kept = workspace.add("qwen3.5", {"chat_template": ("kept.jinja", stock_files["chat_template"])}, "kept")
    # What a crash can leave: a staging folder with a partial file, an entry whose meta.json was cut short
    # (e.g. copied by hand), and a stray file.
    staging = tmp_path / ".tmp-0123456789abcdef-deadbeef"
    staging.mkdir()
    (staging / ".meta.json.1234.part").write_bytes(b'{"id": "01234')
    truncated = tmp_path / "0123456789abcdef"
    truncated.mkdir()
    (truncated / "meta.json").write_bytes((kept.path / "meta.json").read_bytes()[:40])
    (tmp_path / "notes.txt").write_text("hello")
    listing = Workspace(tmp_path).list()
    assert listing.uploads == (kept,)
    assert listing.skipped == (
        f"1 entry in {tmp_path} is an upload or removal that was interrupted and is not used "
        "(.tmp-0123456789abcdef-deadbeef); the app removes them when it starts",
        f"upload 0123456789abcdef in {truncated} is damaged and was skipped: meta.json is not valid JSON "
        "(Unterminated string starting at, line 3, column 9)",
        f"1 entry in {tmp_path} is not an upload folder and was skipped: notes.txt",
    )
    with pytest.raises(UploadError) as caught:
        workspace.load_model("0123456789abcdef")
    assert str(caught.value) == listing.skipped[1]
    assert run_cell_with(workspace.load_model(kept.id, ROOMY), "tool-call", "raw", {}).status == "holds"


def test_removing_one_upload_touches_nothing_else(tmp_path, stock_files):
    workspace = Workspace(tmp_path)
    source = stock_files["chat_template"]
    first = workspace.add("qwen3.5", {"chat_template": ("a.jinja", source)}, "a")
    second = workspace.add("qwen3.6", {"chat_template": ("a.jinja", source)}, "b")
    third = workspace.add("qwen3.5", {"chat_template": ("c.jinja", source + b"\n")}, "c")
    before = {p: p.read_bytes() for folder in (second.path, third.path) for p in folder.iterdir()}
    assert len(before) == 4  # meta.json and the template, twice
    workspace.remove(first.id)
    assert workspace.list().uploads == (second, third)
    assert {p: p.read_bytes() for p in before} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([second.id, third.id])
    with pytest.raises(UploadError) as caught:
        workspace.remove(first.id)
    assert str(caught.value) == f"no upload {first.id!r} in {tmp_path}"


@pytest.mark.parametrize("bad_id", ["../outside", "0123", "0123456789ABCDEF", "", "0123456789abcdef/.."])
def test_an_upload_id_cannot_reach_outside_the_workspace(tmp_path, bad_id):
    outside = tmp_path / "outside"
    outside.mkdir()
    workspace = Workspace(tmp_path / "workspace")
    for action in (workspace.get, workspace.remove, workspace.load_model):
        with pytest.raises(UploadError) as caught:
            action(bad_id)
        assert str(caught.value) == f"no upload {bad_id!r} in {workspace.root}: an upload id is 16 hex digits"
    assert outside.is_dir()


def test_the_same_files_give_the_same_upload_and_a_damaged_file_is_named(tmp_path, stock_files):
    workspace = Workspace(tmp_path)
    files = {"chat_template": ("mine.jinja", stock_files["chat_template"])}
    first = workspace.add("qwen3.5", files, "mine")
    again = workspace.add("qwen3.5", files, "another label")
    assert again == first and again.label == "mine"
    assert [p.name for p in first.path.iterdir()] and len(workspace.list()) == 1
    stored = first.path / first.files[0].stored_as
    stored.write_bytes(stored.read_bytes().replace(b"<|im_start|>", b"<|im_begin|>"))
    with pytest.raises(UploadError) as caught:
        workspace.load_model(first.id)
    digest = __import__("hashlib").sha256(stored.read_bytes()).hexdigest()
    assert str(caught.value) == (f"upload {first.id}: mine.jinja (chat_template) is damaged: its sha256 is {digest}, "
                                 f"{first.files[0].sha256} was stored")


def test_a_good_upload_with_its_tokenizer_is_a_distinct_model(tmp_path, stock, stock_files):
    workspace = Workspace(tmp_path)
    upload = workspace.add("qwen3.5", {"chat_template": ("mine.jinja", stock_files["chat_template"]),
                                       "tokenizer": ("tokenizer.json", stock_files["tokenizer"])}, "mine v2!")
    assert (upload.label, upload.model_id) == ("mine-v2", "qwen3.5+mine-v2")
    model = workspace.load_model(upload.id, ROOMY)
    assert model.id == "qwen3.5+mine-v2" and model.tokenizer_unavailable is None
    assert model.asset_hashes == {"chat_template": upload.files[0].sha256, "tokenizer": upload.files[1].sha256}
    assert model.asset_hashes == stock.asset_hashes  # the same bytes as the stock files, so the same hashes
    assert model.asset_sources["tokenizer"] == f"upload {upload.id}: tokenizer.json"
    for engine in ("raw", "bridge"):
        cell = run_cell_with(model, "tool-call", engine, {})
        reference = run_cell_with(stock, "tool-call", engine, {})
        assert (cell.model, cell.status) == ("qwen3.5+mine-v2", reference.status)
        assert [b.token_prefix for b in cell.boundaries] == [b.token_prefix for b in reference.boundaries]


def test_bad_limit_settings_are_one_sentence(monkeypatch):
    monkeypatch.setenv("DRIFT_RENDER_TIMEOUT_S", "soon")
    with pytest.raises(ExplorerError) as caught:
        RenderLimits.from_env()
    assert str(caught.value) == ("environment variable DRIFT_RENDER_TIMEOUT_S must be a number greater than 0, "
                                 "got 'soon'")
    monkeypatch.setenv("DRIFT_RENDER_TIMEOUT_S", "2.5")
    monkeypatch.setenv("DRIFT_RENDER_MAX_DEPTH", "-3")
    with pytest.raises(ExplorerError) as caught:
        RenderLimits.from_env()
    assert str(caught.value) == ("render limit max_depth must be a positive number, got -3 (from the DRIFT_RENDER_* "
                                 "environment variables)")
    monkeypatch.setenv("DRIFT_RENDER_MAX_DEPTH", "50")
    assert RenderLimits.from_env() == RenderLimits(timeout_s=2.5, max_depth=50)
    monkeypatch.setenv("DRIFT_UPLOAD_MAX_TEXT_BYTES", "1.5")
    with pytest.raises(ExplorerError) as caught:
        UploadLimits.from_env()
    assert str(caught.value) == ("environment variable DRIFT_UPLOAD_MAX_TEXT_BYTES must be a whole number greater "
                                 "than 0, got '1.5'")


def test_the_default_workspace_folder(monkeypatch, tmp_path):
    from engine.workspace import default_root

    monkeypatch.setenv("DRIFT_WORKSPACE", str(tmp_path / "ws"))
    assert Workspace().root == tmp_path / "ws" == default_root()
    monkeypatch.delenv("DRIFT_WORKSPACE")
    assert default_root() == Path.home() / ".drift-explorer" / "workspace"
