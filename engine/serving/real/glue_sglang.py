"""Drives an SGLang release's own chat serving code inside the worker (never in the explorer's process).

The release's `OpenAIServingChat` is built through its real constructor with a fake tokenizer manager (whose
server arguments name the parsers) and template manager, and its `_build_chat_response` turns one generation result
into the client's message: the reasoning parser, the tool-call parser, `null` vs `""` for an empty answer and the
call ids are that release's code. The process-wide runtime context (0.5.2x's `get_serving()` …) is a Permissive.
"""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path
from typing import Any

from engine.serving.real.fakes import HfConfig, Permissive, call_with, run_on, source_entry, streamed_message

SERVING_MODULE = "sglang.srt.entrypoints.openai.serving_chat"
FUNCTION_CALL_MODULE = "sglang.srt.function_call.function_call_parser"
REASONING_MODULES = ("sglang.srt.parser.reasoning_parser", "sglang.srt.reasoning_parser")
# The encoders a release bundles, by the explorer's renderer name, and the architecture that selects each.
ENCODERS = {"deepseek_v4": "sglang.srt.entrypoints.openai.encoding_dsv4",
            "deepseek_v32": "sglang.srt.entrypoints.openai.encoding_dsv32"}
ARCHITECTURES = {"deepseek_v4": "DeepseekV4ForCausalLM", "deepseek_v32": "DeepseekV32ForCausalLM"}


class _Result(dict):
    """A generation result's dict: keys the release reads that a CPU run does not produce are None."""

    def __missing__(self, key: str) -> None:
        return None


def _fake_runtime_context() -> None:
    """0.5.2x reads process-wide config through runtime_context.get_*(), published by the launcher: each getter
    answers a Permissive where nothing was published (in the module and wherever it was imported by name)."""
    import sys

    try:
        context = importlib.import_module("sglang.srt.runtime_context")
    except ModuleNotFoundError:
        return
    wrapped = {}
    for name, value in list(vars(context).items()):
        if name.startswith("get_") and callable(value) and getattr(value, "__module__", "") == context.__name__:
            def getter(*args: Any, _real=value, _name=name, **kwargs: Any) -> Any:
                try:
                    return _real(*args, **kwargs)
                except Exception:  # noqa: BLE001 - not published in this process
                    return Permissive(_name)

            wrapped[value] = getter
            setattr(context, name, getter)
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("sglang.") and module is not None:
            for name, value in list(vars(module).items()):
                if callable(value) and value in wrapped:
                    setattr(module, name, wrapped[value])


class Glue:
    def __init__(self, version: str, root: Path) -> None:
        self.version, self.root = version, root
        self.serving_module = importlib.import_module(SERVING_MODULE)
        _fake_runtime_context()
        self.protocol = importlib.import_module("sglang.srt.entrypoints.openai.protocol")
        self._servings: dict[tuple, Any] = {}
        self.loop = asyncio.new_event_loop()  # the serving code's coroutines run on it, one job after another

    def parsers(self) -> dict:
        tools = importlib.import_module(FUNCTION_CALL_MODULE).FunctionCallParser.ToolCallParserEnum
        reasoning = None
        for name in REASONING_MODULES:
            try:
                reasoning = importlib.import_module(name).ReasoningParser.DetectorMap
                break
            except ModuleNotFoundError:
                continue
        return {"tool_parsers": sorted(tools), "reasoning_parsers": sorted(reasoning or {})}

    def serving(self, job: dict, tokenizer: Any, *, force_reasoning: bool, content_format: str = "string",
                hf_config: HfConfig | None = None) -> Any:
        """The release's OpenAIServingChat for the job's parser pair, as a server launched with them would hold it:
        built by its constructor once per pair, tokenizer and checkpoint config (`hf_config`: the architecture a
        release picks its chat encoding by; None a generic one), then reused. What a request may differ in is set
        from this job alone before each use (the template manager's force_reasoning and content format, the server's
        default chat-template kwargs), so that an answer never depends on the jobs asked before it."""
        pair = (job.get("reasoning_parser"), job.get("tool_parser"))
        key = (*pair, id(tokenizer), (hf_config.model_type, *hf_config.architectures) if hf_config else None)
        if key not in self._servings:
            if any(known[:2] != pair for known in self._servings):
                # Built anew when the parser pair changes: releases keep parser state at class level (vLLM 0.20-0.24
                # set _WrappedParser.reasoning_parser_cls in ParserManager.get_parser), one server being one pair.
                self._servings.clear()
            self._servings[key] = self._build_serving(*pair, tokenizer, hf_config or HfConfig("generic"))
        serving = self._servings[key]
        object.__setattr__(serving, "template_manager", Permissive(
            "template_manager", force_reasoning=force_reasoning, chat_template_name=None,
            jinja_template_content_format=content_format))
        if hasattr(serving, "default_chat_template_kwargs"):
            # --default-chat-template-kwargs, which the release's _process_messages fills in under the request's own
            # (its constructor reads them from server arguments this process does not have)
            serving.default_chat_template_kwargs = dict(
                (job.get("server") or {}).get("default-chat-template-kwargs") or {})
        return serving

    def _build_serving(self, reasoning_parser: str | None, tool_parser: str | None, tokenizer: Any,
                       hf_config: HfConfig) -> Any:
        config = {"reasoning_parser": reasoning_parser, "tool_call_parser": tool_parser}
        server_args = Permissive("server_args", **config, context_length=None, enable_custom_logit_processor=False,
                                 tokenizer_worker_num=1, served_model_name="m",
                                 get_hf_config=lambda: hf_config)  # 0.5.6's lookup
        model_config = Permissive("model_config", get_default_sampling_params=lambda: {}, hf_config=hf_config,
                                  hf_text_config=hf_config)
        manager = Permissive("tokenizer_manager", server_args=server_args, tokenizer=tokenizer,
                             served_model_name="m", model_path="", model_config=model_config,
                             config_value=lambda name, default=None: config.get(name, default))
        template = Permissive("template_manager", force_reasoning=True, chat_template_name=None,
                              jinja_template_content_format="string")
        return call_with(self.serving_module.OpenAIServingChat,
                         {"tokenizer_manager": manager, "template_manager": template})

    def request(self, job: dict, stream: bool = False) -> Any:
        tools = job.get("tools") or None
        messages: list[dict] = [{"role": "user", "content": "hi"}]
        history = int(job.get("history_tool_calls") or 0)
        if history:  # SGLang numbers Kimi call ids after the calls already in the conversation
            calls = [{"id": f"functions.f:{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                     for i in range(history)]
            messages += [{"role": "assistant", "content": "", "tool_calls": calls},
                         *({"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls),
                         {"role": "user", "content": "hi"}]
        return self.protocol.ChatCompletionRequest(
            messages=messages, model="m", tools=tools, tool_choice="auto" if tools else "none", stream=stream,
            chat_template_kwargs=job.get("chat_template_kwargs") or None)

    def parse(self, job: dict, tokenizer: Any) -> dict:
        if job.get("stream"):
            return self.parse_stream(job, tokenizer)
        serving = self.serving(job, tokenizer, force_reasoning=bool(job.get("force_reasoning", True)))
        request = self.request(job)
        ids = job["token_ids"] if job.get("token_ids") is not None else tokenizer.ids_for(job["chunks"])
        meta = _Result(id="chatcmpl-drift", finish_reason={"type": "stop", "matched": None}, prompt_tokens=1,
                       completion_tokens=len(ids), cached_tokens=0, weight_version="default")
        ret = [_Result(text=job["text"], output_ids=ids, meta_info=meta, index=0)]
        response = call_with(serving._build_chat_response, {"request": request, "ret": ret, "created": 0})
        if not hasattr(response, "choices"):
            body = getattr(response, "body", b"")
            return {"error": body.decode("utf-8", "replace") if isinstance(body, bytes) else str(response)}
        message = response.choices[0].message
        calls = [{"id": call.id, "name": call.function.name, "arguments": call.function.arguments}
                 for call in message.tool_calls or []]
        return {"reasoning": message.reasoning_content, "content": message.content, "tool_calls": calls,
                "error": None}

    def render_prompt(self, job: dict, tokenizer: Any) -> dict:
        """The prompt the release's serving code builds for a chat request (messages, tools, chat_template_kwargs),
        through its own request path, `_process_messages` (its chat encodings, e.g. 0.5.23's deepseek-recipe for
        DeepSeek V4, or the Jinja template it was given): the prompt ids and their decoded text, or the sentence the
        server would answer 400 with."""
        serving = self.serving(job, tokenizer, force_reasoning=bool(job.get("force_reasoning", True)))
        try:
            request = self.protocol.ChatCompletionRequest(
                messages=job["messages"], model="m", tools=job.get("tools") or None,
                tool_choice="auto" if job.get("tools") else "none",
                chat_template_kwargs=job.get("chat_template_kwargs") or None)
            processed = call_with(serving._process_messages, {"request": request, "is_multimodal": False})
        except ValueError as err:  # the server's 400: the request's own fault, one sentence
            return {"ids": None, "text": None, "error": str(err).splitlines()[0] if str(err) else type(err).__name__}
        ids = list(processed.prompt_ids or [])
        text = tokenizer.decode(ids) if ids else processed.prompt
        return {"ids": ids, "text": text, "error": None}

    def parse_stream(self, job: dict, tokenizer: Any) -> dict:
        """The release's _generate_chat_stream fed by a tokenizer manager whose generate_request yields the text so
        far chunk by chunk (as SGLang's detokenizer does); the client's message is the accumulated SSE deltas."""
        serving = self.serving(job, tokenizer, force_reasoning=bool(job.get("force_reasoning", True)))
        request = self.request(job, stream=True)
        chunks = job["chunks"]
        ids = [[i] for i in job["token_ids"]] if job.get("token_ids") is not None else \
            [tokenizer.ids_for([chunk]) for chunk in chunks]

        async def generate_request(*args: Any, **kwargs: Any):
            text, output_ids = "", []
            for position, (chunk, chunk_ids) in enumerate(zip(chunks, ids)):
                text += chunk
                output_ids = output_ids + chunk_ids
                last = position == len(chunks) - 1
                meta = _Result(id="chatcmpl-drift", prompt_tokens=1, completion_tokens=len(output_ids),
                               cached_tokens=0, finish_reason={"type": "stop", "matched": None} if last else None,
                               weight_version="default")
                yield _Result(text=text, output_ids=list(output_ids), meta_info=meta, index=0)

        object.__setattr__(serving.tokenizer_manager, "generate_request", generate_request)
        stream = call_with(serving._generate_chat_stream, {"adapted_request": Permissive("adapted_request"),
                                                             "request": request,
                                                             "raw_request": Permissive("raw_request")})

        async def events() -> list[str]:
            return [event async for event in stream]

        return streamed_message(run_on(self.loop, events()))

    # -- the request side --------------------------------------------------------------------------------------

    def render(self, job: dict, tokenizer: Any) -> dict:
        """What the release makes of one chat request before the model sees it, through its own serving code:
        `_convert_to_internal_request` (reasoning_effort moved out of chat_template_kwargs, the messages processed
        for the template's content format, arguments parsed into dicts, SGLang's DeepSeek V4 encoder where the
        release has one). The tokenizer records the call the release makes: apply_chat_template's arguments (for
        the explorer to render with the model's template) or, for an encoder, the prompt text it tokenizes.
        A job without `renderer` asks for the prompt ids of the whole request path instead (render_prompt:
        engine/render/deepseek_recipe.py)."""
        if "renderer" not in job:
            return self.render_prompt(job, tokenizer)
        content_format = "string"
        if job.get("chat_template"):
            content_format = _template_utils().detect_jinja_template_content_format(job["chat_template"])
        encoder_module = ENCODERS.get(job["renderer"])
        hf_config = None
        if encoder_module is not None:  # the checkpoint's architecture, as the release picks its encoder by it
            hf_config = HfConfig(job.get("model_type") or "generic")
            hf_config.architectures = [ARCHITECTURES[job["renderer"]]]
        serving = self.serving(job, tokenizer, force_reasoning=True, content_format=content_format,
                               hf_config=hf_config)
        tools = job.get("tools") or None
        request = self.protocol.ChatCompletionRequest(
            messages=job["messages"], model="m", tools=tools, tool_choice="auto" if tools else "none",
            chat_template_kwargs=job.get("chat_template_kwargs") or None)
        tokenizer.calls.clear()
        if encoder_module is not None:
            from engine.serving.real.encoder_trace import encoder_reply, recorded_calls

            encoder = importlib.import_module(encoder_module)
            # 0.5.6-0.5.11 import V3.2's encode_messages by name into serving_chat; later releases call the module's
            owner = self.serving_module if getattr(self.serving_module, "encode_messages", None) is \
                encoder.encode_messages else encoder
            with recorded_calls(owner, "encode_messages") as calls:
                failure = _attempt(serving, request)
            texts = [c["text"] for c in tokenizer.calls if c["kind"] == "encode"]
            if not texts:
                return {"error": failure or "the release's request side never encoded a prompt"}
            return encoder_reply(texts[0], calls, encoder, self.root, job)
        failure = _attempt(serving, request)
        reply = tokenizer.last_template_call()
        if failure and "error" in reply:
            return {"error": failure}
        return {**reply, "entry": source_entry(type(serving)._apply_jinja_template, self.root)}


    def cache_kept(self, job: dict, tokenizer: Any) -> dict:
        """How many tokens of a finished request the release keeps in its radix cache under the job's server flags
        (--strip-thinking-cache), by its own code: the Req method that reads the flag and the reasoning-token counter
        it reads, compiled from schedule_batch.py (a module the worker does not import: the scheduler's GPU code)
        and run on a request holding the job's prompt length and output ids. The flag read from the server
        arguments is the job's; `where` is the release's line that reads it."""
        import ast
        import inspect
        import types

        path = self.root / "sglang" / "srt" / "managers" / "schedule_batch.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        req = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Req"), None)
        methods = {f.name: f for f in (req.body if req else []) if isinstance(f, ast.FunctionDef)}
        reader = next((f for f in methods.values() if "strip_thinking_cache" in ast.unparse(f)), None)
        if reader is None:
            return {"unsupported": f"SGLang {self.version} has no --strip-thinking-cache"}
        line = next(n.lineno for n in ast.walk(reader) if isinstance(n, ast.Attribute) and
                    n.attr == "strip_thinking_cache")
        wanted = [reader, *(methods[n] for n in ("update_reasoning_tokens", "update_self_opened_reasoning_tokens")
                            if n in methods)]
        module = ast.Module([ast.ClassDef("Req", [], [], wanted, [])], [])
        flags = types.SimpleNamespace(strip_thinking_cache=bool((job.get("server") or {}).get("strip-thinking-cache")))
        namespace: dict[str, Any] = {"get_serving": lambda: flags, "get_server_args": lambda: flags,
                                     "get_global_server_args": lambda: flags}
        try:
            namespace["TokenSequenceMatcher"] = importlib.import_module(
                "sglang.srt.utils.token_sequence_matcher").TokenSequenceMatcher
        except (ModuleNotFoundError, AttributeError):
            pass
        exec(compile(ast.fix_missing_locations(module), str(path), "exec"), namespace)  # noqa: S102 - the release's
        request = object.__new__(namespace["Req"])
        prompt, output = int(job["prompt_len"]), list(job["output_ids"])
        committed = prompt + len(output)
        request.__dict__.update(
            origin_input_ids=[0] * prompt, output_ids=output, output_ids_through_stop=output, finished_len=len(output),
            kv_committed_len=committed, kv=types.SimpleNamespace(kv_committed_len=committed), reasoning_tokens=0,
            require_reasoning=bool(job["require_reasoning"]), _is_reasoning_over=False, _think_end_matcher=None,
            _think_end_match_len=0, _think_start_match_len=0)
        end_ids = list(job["think_end_ids"])
        counter = request.update_reasoning_tokens
        end = end_ids if "think_end_ids" in inspect.signature(counter).parameters else (end_ids or [None])[0]
        if job["require_reasoning"]:
            counter(output, end)
        elif hasattr(request, "update_self_opened_reasoning_tokens") and job.get("think_start_ids"):
            request.update_self_opened_reasoning_tokens(output, list(job["think_start_ids"]), end)
        kept = getattr(request, reader.name)()
        return {"kept": int(kept), "reasoning_tokens": int(request.reasoning_tokens), "method": reader.name,
                "where": f"sglang/srt/managers/schedule_batch.py:{line}",
                "line": path.read_text(encoding="utf-8").splitlines()[line - 1].strip()}


def _attempt(serving: Any, request: Any) -> str | None:
    """Run the release's request conversion; what follows the template call (sampling parameters, the internal
    request) may fail on the fakes, and only matters when the template call was not reached."""
    try:
        serving._convert_to_internal_request(request)
    except Exception as exc:  # noqa: BLE001 - reported only when the template call was not reached
        return f"{type(exc).__name__}: {exc}"
    return None


def _template_utils() -> Any:
    for name in ("sglang.srt.parser.jinja_template_utils", "sglang.srt.jinja_template_utils"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError("jinja_template_utils")
