"""Drives a vLLM release's own chat-completion serving code inside the worker (never in the explorer's process).

The release's `OpenAIServingChat` is built through its real constructor (fakes.call_with: the constructor's
arguments changed between releases), and its `chat_completion_full_generator` is called with a real
`RequestOutput` holding the model text, so what the serving layer does around the parsers (calls dropped without
declared tools, gpt-oss content handling, which parser runs when) is that release's code.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
from pathlib import Path
from typing import Any

from engine.serving.real.fakes import (
    HfConfig,
    Permissive,
    call_with,
    parameters_of,
    run_on,
    source_entry,
    streamed_message,
)

SERVING_MODULES = ("vllm.entrypoints.openai.chat_completion.serving", "vllm.entrypoints.openai.serving_chat")
TOOL_MANAGERS = ("vllm.tool_parsers", "vllm.entrypoints.openai.tool_parsers")
REASONING_MANAGERS = ("vllm.reasoning",)
# The DeepSeek tokenizer modes that render through an encoder the release bundles: vllm/renderers/<name>.py's class,
# vllm/tokenizers/<name>.py's get_<name>_tokenizer wrapper, vllm/tokenizers/<name>_encoding.py.
ENCODER_RENDERERS = {"deepseek_v4": ("deepseek_v4", "DeepseekV4Renderer"),
                     "deepseek_v32": ("deepseek_v32", "DeepseekV32Renderer")}


def model_config(model_type: str) -> Permissive:
    hf = HfConfig(model_type)
    return Permissive("model_config", hf_config=hf, hf_text_config=hf, hf_overrides={}, model="m",
                      served_model_name="m", max_model_len=1 << 20, tokenizer="m", generation_config="vllm",
                      logits_processors=None, get_diff_sampling_param=lambda: {}, runner_type="generate",
                      allowed_local_media_path="", allowed_media_domains=None, encoder_config=None,
                      trust_remote_code=False, skip_tokenizer_init=False, is_multimodal_model=False,
                      multimodal_config=None, io_processor_plugin=None, renderer_num_workers=1)


def _first_module(names: tuple[str, ...]):
    errors = []
    for name in names:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as err:
            if not err.name or not name.startswith(err.name):
                raise
            errors.append(err)
    raise errors[-1]


def _registered(manager: Any) -> list[str]:
    names: set[str] = set()
    for attr in ("tool_parsers", "reasoning_parsers", "lazy_parsers", "_lazy_parsers", "_tool_parsers",
                 "_reasoning_parsers"):
        value = getattr(manager, attr, None)
        if isinstance(value, dict):
            names.update(value)
    return sorted(names)


class Glue:
    def __init__(self, version: str, root: Path) -> None:
        self.version, self.root = version, root
        self.serving_module = _first_module(SERVING_MODULES)
        self.protocol = inspect.getmodule(self.serving_module.ChatCompletionRequest)
        self.outputs = importlib.import_module("vllm.outputs")
        self._servings: dict[tuple, Any] = {}
        self.loop = asyncio.new_event_loop()  # the serving code's coroutines run on it, one job after another

    def parsers(self) -> dict:
        tools = _first_module(TOOL_MANAGERS).ToolParserManager
        reasoning = _first_module(REASONING_MANAGERS).ReasoningParserManager
        return {"tool_parsers": _registered(tools), "reasoning_parsers": _registered(reasoning)}

    def serving(self, reasoning_parser: str | None, tool_parser: str | None, model_type: str, tokenizer: Any) -> Any:
        key = (reasoning_parser, tool_parser, model_type, id(tokenizer))
        if key not in self._servings:
            # Built anew when the parser pair changes: releases keep parser state at class level (vLLM 0.20-0.24
            # set _WrappedParser.reasoning_parser_cls in ParserManager.get_parser), one server being one pair.
            self._servings.clear()
            config = model_config(model_type)
            # The renderer holds the model's tokenizer, as a served model's does: vLLM >= 0.33 builds the parsers
            # with it at startup (ParserManager.validate_parser_tokenizer; hermes refuses a missing one).
            client = Permissive("engine_client", model_config=config, errored=False, is_running=True,
                               vllm_config=Permissive("vllm_config", model_config=config),
                               renderer=Permissive("renderer", tokenizer=tokenizer))
            models = Permissive("models", model_config=config, base_model_paths=[], lora_requests={})
            known = {"engine_client": client, "model_config": config, "models": models, "response_role": "assistant",
                     "request_logger": None, "chat_template": None, "chat_template_content_format": "auto",
                     "reasoning_parser": reasoning_parser or "", "tool_parser": tool_parser,
                     "enable_auto_tools": bool(tool_parser), "exclude_tools_when_tool_choice_none": False,
                     "enable_prompt_tokens_details": False, "enable_force_include_usage": False,
                     "enable_log_outputs": False, "return_tokens_as_token_ids": False}
            self._servings[key] = call_with(self.serving_module.OpenAIServingChat, known)
        return self._servings[key]

    def request(self, job: dict, stream: bool = False) -> Any:
        tools = job.get("tools") or None
        return self.protocol.ChatCompletionRequest(
            messages=[{"role": "user", "content": "hi"}], model="m", tools=tools, stream=stream,
            tool_choice="auto" if tools else None, chat_template_kwargs=job.get("chat_template_kwargs") or None)

    def result(self, job: dict, token_ids: list[int], prompt_ids: list[int]) -> Any:
        known = {"index": 0, "text": job["text"], "token_ids": token_ids, "cumulative_logprob": None,
                 "logprobs": None, "finish_reason": "stop", "stop_reason": None}
        output = call_with(self.outputs.CompletionOutput, known)
        known = {"request_id": "chatcmpl-drift", "prompt": None, "prompt_token_ids": prompt_ids,
                 "prompt_logprobs": None, "outputs": [output], "finished": True}
        return call_with(self.outputs.RequestOutput, known)

    @staticmethod
    def request_parsers(serving: Any, generator: Any, request: Any, tokenizer: Any, job: dict) -> dict:
        """The per-request parser objects that the release's create_chat_completion builds before it calls the
        full generator (0.10 builds them inside it; 0.15-0.20 pass a reasoning parser; 0.25+ one Parser)."""
        parameters = {name for name, _ in parameters_of(generator)}
        kwargs = job.get("chat_template_kwargs") or {}
        if "parser" in parameters:
            if hasattr(serving, "_make_parser"):
                parser = call_with(serving._make_parser, {"request": request, "tokenizer": tokenizer,
                                                          "chat_template_kwargs": kwargs})
            elif getattr(serving, "parser_cls", None) is not None:
                parser = call_with(serving.parser_cls, {"tools": request.tools, "chat_template_kwargs": kwargs,
                                                        "model_config": serving.model_config}, tokenizer)
            else:
                parser = None
            return {"parser": parser}
        if "reasoning_parser" in parameters:
            cls = getattr(serving, "reasoning_parser_cls", None)
            return {"reasoning_parser": call_with(cls, {"chat_template_kwargs": kwargs}, tokenizer) if cls else None}
        return {}

    def parse(self, job: dict, tokenizer: Any) -> dict:
        if job.get("stream"):
            return self.parse_stream(job, tokenizer)
        serving = self.serving(job.get("reasoning_parser"), job.get("tool_parser"), job.get("model_type", "generic"),
                               tokenizer)
        request = self.request(job)
        token_ids = job["token_ids"] if job.get("token_ids") is not None else tokenizer.ids_for(job["chunks"])
        prompt_ids = [tokenizer.convert_tokens_to_ids(t) for t in job.get("prompt_tail") or []] or [1]
        final = self.result(job, token_ids, prompt_ids)

        async def results():
            yield final

        metadata_cls = getattr(self.serving_module, "RequestResponseMetadata", None) or \
            self.protocol.RequestResponseMetadata
        known: dict[str, Any] = {"request": request, "result_generator": results(), "request_id": "chatcmpl-drift",
                                 "model_name": "m", "conversation": [], "tokenizer": tokenizer,
                                 "request_metadata": metadata_cls(request_id="chatcmpl-drift")}
        generator = serving.chat_completion_full_generator
        known.update(self.request_parsers(serving, generator, request, tokenizer, job))
        response = run_on(self.loop, call_with(generator, known))
        if not hasattr(response, "choices"):
            error = getattr(response, "error", response)
            return {"error": str(getattr(error, "message", error))}
        message = response.choices[0].message
        reasoning = getattr(message, "reasoning", None)
        if reasoning is None:
            reasoning = getattr(message, "reasoning_content", None)
        calls = [{"id": call.id, "name": call.function.name, "arguments": call.function.arguments}
                 for call in message.tool_calls or []]
        return {"reasoning": reasoning, "content": message.content, "tool_calls": calls, "error": None}

    def chunk_ids(self, job: dict, tokenizer: Any) -> list[list[int]]:
        if job.get("token_ids") is not None:  # harmony: one real id per chunk, as the detokenizer streams them
            return [[i] for i in job["token_ids"]]
        return [tokenizer.ids_for([chunk]) for chunk in job["chunks"]]

    def parse_stream(self, job: dict, tokenizer: Any) -> dict:
        """The release's chat_completion_stream_generator fed one RequestOutput per chunk (delta text and ids, the
        last one finished); the client's message is the accumulated deltas of the server-sent events."""
        serving = self.serving(job.get("reasoning_parser"), job.get("tool_parser"), job.get("model_type", "generic"),
                               tokenizer)
        request = self.request(job, stream=True)
        prompt_ids = [tokenizer.convert_tokens_to_ids(t) for t in job.get("prompt_tail") or []] or [1]
        chunks, ids = job["chunks"], self.chunk_ids(job, tokenizer)

        async def results():
            for position, (chunk, chunk_ids) in enumerate(zip(chunks, ids)):
                last = position == len(chunks) - 1
                known = {"index": 0, "text": chunk, "token_ids": chunk_ids, "cumulative_logprob": None,
                         "logprobs": None, "finish_reason": "stop" if last else None, "stop_reason": None}
                output = call_with(self.outputs.CompletionOutput, known)
                known = {"request_id": "chatcmpl-drift", "prompt": None, "prompt_token_ids": prompt_ids,
                         "prompt_logprobs": None, "outputs": [output], "finished": last}
                yield call_with(self.outputs.RequestOutput, known)

        metadata_cls = getattr(self.serving_module, "RequestResponseMetadata", None) or \
            self.protocol.RequestResponseMetadata
        generator = serving.chat_completion_stream_generator
        known: dict[str, Any] = {"request": request, "result_generator": results(), "request_id": "chatcmpl-drift",
                                 "model_name": "m", "conversation": [], "tokenizer": tokenizer,
                                 "request_metadata": metadata_cls(request_id="chatcmpl-drift"),
                                 "chat_template_kwargs": job.get("chat_template_kwargs") or {}}
        known.update(self.request_parsers(serving, generator, request, tokenizer, job))

        async def events() -> list[str]:
            return [event async for event in call_with(generator, known)]

        return streamed_message(run_on(self.loop, events()))

    # -- the request side --------------------------------------------------------------------------------------

    def chat_request(self, job: dict) -> Any:
        """The request as the release's protocol validates it (its before-validators rename reasoning_content)."""
        tools = job.get("tools") or None
        fields = {"reasoning_effort": job["reasoning_effort"]} if job.get("reasoning_effort") else {}
        return self.protocol.ChatCompletionRequest(
            messages=job["messages"], model="m", tools=tools, tool_choice="auto" if tools else None,
            chat_template_kwargs=job.get("chat_template_kwargs") or None, **fields)

    def render(self, job: dict, tokenizer: Any) -> dict:
        """What the release makes of one chat request before the model sees it, through its own code: the protocol's
        validation, then the renderer this release uses for the model (`job["renderer"]`):
          - "harmony": OnlineRenderer._make_request_with_harmony (the prompt ids, decoded);
          - "deepseek_v4" / "deepseek_v32": the tokenizer mode's renderer (DeepseekV4Renderer, DeepseekV32Renderer)
            .render_messages over the bundled encoder (the prompt text);
          - "jinja": HfRenderer.render_messages up to the tokenizer's apply_chat_template, whose arguments are
            returned (the conversation after parse_chat_messages, tools and the template kwargs it resolved), for
            the explorer to render with the model's template.
        Only the 0.33-era renderer API (vllm/renderers/) is driven; older releases answer an error sentence."""
        request = self.chat_request(job)
        try:
            renderer_module = importlib.import_module("vllm.renderers.hf")
            params_module = importlib.import_module("vllm.renderers.params")
        except ModuleNotFoundError:
            return {"unsupported": f"vLLM {self.version} predates vllm/renderers/ (0.15): its request side is not "
                                   "driven here"}
        if not hasattr(request, "build_chat_params"):
            return {"unsupported": f"vLLM {self.version}'s ChatCompletionRequest has no build_chat_params (0.16): "
                                   "its request side is not driven here"}
        config = model_config(job.get("model_type", "generic"))
        tool_dicts = [tool.model_dump() for tool in request.tools] if request.tools else None
        if job["renderer"] == "harmony":
            online = importlib.import_module("vllm.renderers.online_renderer")
            owner = Permissive("online_renderer", renderer=Permissive("renderer", tokenizer=tokenizer),
                               reasoning_effort_map={}, supports_browsing=False, supports_code_interpreter=False,
                               model_config=config)
            # The day the explorer asked for (RealEngine.render_request), as a server pins it with this variable
            os.environ["VLLM_SYSTEM_START_DATE"] = job.get("start_date") or ""
            _, inputs = online.OnlineRenderer._make_request_with_harmony(owner, request, tool_dicts is not None)
            ids = list(inputs[0]["prompt_token_ids"])
            return {"prompt_ids": ids, "prompt": tokenizer.decode(ids)}
        defaults = {"tools": tool_dicts, "tokenize": False}
        params = call_with(request.build_chat_params, {"default_template": job.get("chat_template"),
                                                       "default_template_content_format": "auto",
                                                       "reasoning_effort_map": {}})
        server_defaults = (job.get("server") or {}).get("default-chat-template-kwargs")
        if server_defaults and hasattr(params, "with_defaults"):
            # --default-chat-template-kwargs, as the release's online renderer applies them (renderers/
            # online_renderer.py: build_chat_params(...).with_defaults(default_template_kwargs))
            params = params.with_defaults(server_defaults)
        if hasattr(params, "with_defaults"):
            merge = getattr(params_module, "merge_kwargs", None)
            params = params.with_defaults(merge(None, defaults) if merge else defaults)
        if job["renderer"] in ENCODER_RENDERERS:
            from engine.serving.real.encoder_trace import encoder_reply, recorded_calls

            name, renderer_class = ENCODER_RENDERERS[job["renderer"]]
            module = importlib.import_module(f"vllm.renderers.{name}")
            tokenizer_module = importlib.import_module(f"vllm.tokenizers.{name}")
            # The tokenizer mode's wrapper: its apply_chat_template calls the bundled encoder.
            renderer = _renderer(getattr(module, renderer_class), config,
                                 getattr(tokenizer_module, f"get_{name}_tokenizer")(tokenizer))
            with recorded_calls(tokenizer_module, "encode_messages") as calls:
                _, prompt = renderer.render_messages(request.messages, params)
            encoder = importlib.import_module(f"vllm.tokenizers.{name}_encoding")
            return encoder_reply(prompt["prompt"], calls, encoder, self.root, job)
        _real_template_parser(renderer_module)
        tokenizer.chat_template = job.get("chat_template")
        renderer = _renderer(renderer_module.HfRenderer, config, tokenizer)
        tokenizer.calls.clear()
        renderer.render_messages(request.messages, params)
        entry = source_entry(renderer_module.HfRenderer.render_messages, self.root)
        return {**tokenizer.last_template_call(), "entry": entry}


def _renderer(renderer_class: type, config: Any, tokenizer: Any) -> Any:
    """The release's renderer (HfRenderer, a DeepSeek tokenizer mode's) with what its __init__ sets, but the tokenizer
    it would load: from 0.17 it keeps `model_config` and `tokenizer`; 0.15-0.16 keep the model config as `config` and
    the tokenizer as `_tokenizer`, behind a read-only `tokenizer` property."""
    renderer = object.__new__(renderer_class)
    renderer.use_unified_vision_chunk = False
    if isinstance(inspect.getattr_static(renderer_class, "tokenizer", None), property):
        renderer.config, renderer._tokenizer = config, tokenizer
    else:
        renderer.model_config, renderer.tokenizer = config, tokenizer
    return renderer


def _real_template_parser(hf_module: Any) -> None:
    """vLLM reads the template's syntax tree through transformers' Jinja compiler (hf.py:568-571, stubbed in the
    worker) to detect the content format; a real Jinja environment with the same parse settings and extensions gives
    the same tree."""
    import jinja2
    import jinja2.ext
    import jinja2.sandbox

    def compile_template(source: str) -> Any:
        environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[hf_module.AssistantTracker, jinja2.ext.loopcontrols])
        return environment.from_string(source)

    importlib.import_module("transformers.utils.chat_template_utils")._compile_jinja_template = compile_template
