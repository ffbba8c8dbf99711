"""The sandboxed worker that runs one LiteLLM release's own code offline: `python -m
engine.serving.proxies.litellm_worker ROOT` (ROOT: the release's sources in the engine cache), started by litellm.py
under `unshare -rn` where the kernel allows it, with RLIMIT_AS and a clean environment.

`litellm.completion(model="hosted_vllm/…", …)` runs as a client calls it, with an HTTP client that never touches the
network: it keeps the body LiteLLM would send to the vLLM server and answers with the engine's reply the job gives.
So the request side (the provider's transformation of the history and the tools) and the response side (the reply as
the client gets it) are the release's whole code path, not a copy of its transformation.

Protocol: one JSON object per line on stdin, one reply per line on the file descriptor DRIFT_REPLY_FD names (the
package's own prints go to stderr). {"op": "hello"}; {"op": "request", "model", "messages", "tools"} -> the body sent;
{"op": "response", "model", "reply"} -> the message the client gets. Each answer carries `lines`: the executed lines
of the provider's transformation modules (`TRACED`), in order, which name the code that made an edit. Anything the
package imports that is not installed here is stubbed (its native Rust bridge too); `importlib_metadata` is the
standard library's importlib.metadata.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from engine.serving.real import stubs

# The provider's transformation code, whose executed lines are kept (relative to the release's root).
TRACED = ("litellm/llms/hosted_vllm/", "litellm/llms/openai/chat/gpt_transformation.py",
          "litellm/litellm_core_utils/prompt_templates/common_utils.py",
          "litellm/litellm_core_utils/llm_response_utils/convert_dict_to_response.py")
FORCED_STUBS = ("litellm.rust_bridge._native",)  # a 44 MB native extension the sources fetch leaves out


class _StubMissing(importlib.abc.MetaPathFinder):
    """Stubs what is not installed (the catch-all of engine.serving.real.stubs) and the forced stubs."""

    def __init__(self) -> None:
        self._loader = stubs.StubLoader()
        self.stubbed: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        root = fullname.split(".")[0]
        if any(fullname == f or fullname.startswith(f + ".") for f in FORCED_STUBS):
            return self._stub(fullname)
        if root in sys.stdlib_module_names or root.startswith("_") or root == "litellm":
            return None
        spec = stubs.found_by_others(self, fullname, path, target)
        if spec is not None:
            return spec
        if "." in fullname and root not in self.stubbed:
            return None
        return self._stub(fullname)

    def _stub(self, fullname: str) -> Any:
        self.stubbed.add(fullname.split(".")[0] if not fullname.startswith("litellm.") else fullname)
        return importlib.machinery.ModuleSpec(fullname, self._loader, is_package=True)


class _Lines:
    """The executed lines of TRACED files while armed."""

    def __init__(self, root: Path) -> None:
        self.prefixes = tuple(str(root / p) for p in TRACED)
        self.root = str(root) + os.sep
        self.seen: list[list[Any]] = []
        self._known: set[tuple[str, int]] = set()

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "call":
            return self._local if frame.f_code.co_filename.startswith(self.prefixes) else None
        return None

    def _local(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            key = (frame.f_code.co_filename, frame.f_lineno)
            if key not in self._known:
                self._known.add(key)
                self.seen.append([key[0][len(self.root):], key[1]])
        return self._local

    def run(self, function: Any) -> Any:
        self.seen, self._known = [], set()
        sys.settrace(self)
        try:
            return function()
        finally:
            sys.settrace(None)


def _client(reply: dict) -> Any:
    import httpx
    from litellm.llms.custom_httpx.http_handler import HTTPHandler

    class OfflineEngine(HTTPHandler):
        """Keeps the body LiteLLM sends and answers with the engine's reply; no socket is opened."""

        def __init__(self) -> None:
            super().__init__()
            self.sent: dict | None = None

        def post(self, url: str, data: Any = None, json: Any = None, **kwargs: Any) -> Any:  # noqa: A002
            import json as codec

            self.sent = codec.loads(data) if isinstance(data, (str, bytes)) else json
            return httpx.Response(200, json=reply, request=httpx.Request("POST", url))

    return OfflineEngine()


def _completion(model: str, messages: list[dict], tools: list[dict] | None, reply: dict) -> tuple[dict, Any]:
    import litellm

    client = _client(reply)
    response = litellm.completion(model=f"hosted_vllm/{model}", messages=messages, tools=tools or None,
                                  api_base="http://engine.invalid/v1", api_key="none", client=client)
    return client.sent or {}, response


def _placeholder_reply(model: str) -> dict:
    return {"id": "chatcmpl-drift", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def main() -> None:
    root = Path(sys.argv[1])
    reply_fd = int(os.environ["DRIFT_REPLY_FD"])
    out = os.fdopen(reply_fd, "w", encoding="utf-8")
    sys.stdout = sys.stderr  # the package's prints must not reach the replies
    sys.path.insert(0, str(root))
    sys.modules["importlib_metadata"] = importlib.metadata
    finder = _StubMissing()
    sys.meta_path.insert(0, finder)
    lines = _Lines(root)

    def answer(payload: dict) -> None:
        out.write(json.dumps(payload) + "\n")
        out.flush()

    try:
        import litellm  # noqa: F401 - the release's import, once, before the first job
    except BaseException as err:  # noqa: BLE001 - the release does not load here: said once, then exit
        answer({"ok": False, "error": f"{type(err).__name__}: {err}"[:500]})
        return
    answer({"ok": True, "version": importlib.metadata.version("litellm"), "stubbed": sorted(finder.stubbed)})
    for line in sys.stdin:
        try:
            job = json.loads(line)
            model = job.get("model", "model")
            if job["op"] == "request":
                request = (model, job["messages"], job.get("tools"), _placeholder_reply(model))
                sent, _ = lines.run(lambda request=request: _completion(*request))
                answer({"ok": True, "sent": sent, "lines": lines.seen})
            elif job["op"] == "response":
                request = (model, [{"role": "user", "content": "."}], None, job["reply"])
                _, response = lines.run(lambda request=request: _completion(*request))
                message = response.choices[0].message.model_dump()
                answer({"ok": True, "message": json.loads(json.dumps(message, default=str)), "lines": lines.seen})
            else:
                answer({"ok": False, "error": f"unknown op {job.get('op')!r}"})
        except BaseException as err:  # noqa: BLE001 - the release refusing the job: its own sentence
            where = traceback.extract_tb(err.__traceback__)[-1] if err.__traceback__ else None
            answer({"ok": False, "error": f"{type(err).__name__}: {err}"[:500],
                    "where": f"{where.filename}:{where.lineno}" if where else ""})


if __name__ == "__main__":
    main()
