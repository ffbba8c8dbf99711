"""Import shims that let the real vLLM / SGLang parser classes run without their heavy dependencies.

Runs only inside the throw-away oracle venv (see generate.py), never in the project's own process.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from pathlib import Path

SGLANG_STUB_ROOTS = (
    "transformers",
    "msgspec",
    "openai",
    "xgrammar",
    "numpy",
    "pybase64",
    "requests",
    "IPython",
    "tqdm",
    "torch",
    "triton",
    "sentencepiece",
    "tiktoken",
    "jinja2",
    "fastapi",
    "uvicorn",
    "aiohttp",
    "psutil",
    "huggingface_hub",
    "PIL",
    "zmq",
    "uvloop",
    "setproctitle",
    "starlette",
    "safetensors",
    "einops",
    "outlines",
    "llguidance",
    "compressed_tensors",
    "blobfile",
    "pynvml",
    "sgl_kernel",
    "flashinfer",
    "modelscope",
    "openai_harmony",
    "hf_transfer",
    "decord",
    "soundfile",
    "msgpack",
    "cloudpickle",
)
VLLM_STUB_ROOTS = (
    "openai",
    "fastapi",
    "torch",
    "transformers",
    "huggingface_hub",
    "safetensors",
    "numpy",
    "prometheus_client",
    "pybase64",
    "PIL",
    "aiohttp",
    "requests",
    "urllib3",
    "msgspec",
    "cloudpickle",
    "zmq",
    "uvloop",
    "cpuinfo",
    "psutil",
    "xgrammar",
    "ijson",
    "mistral_common",
    "starlette",
    "uvicorn",
    "jinja2",
    "tiktoken",
    "sentencepiece",
    "tokenizers",
    "triton",
    "einops",
    "gguf",
    "lark",
    "llguidance",
    "outlines_core",
    "compressed_tensors",
    "blake3",
    "cbor2",
    "setproctitle",
    "diskcache",
    "tqdm",
    "filelock",
    "yaml",
    "watchfiles",
    "prometheus_fastapi_instrumentator",
    "pyzmq",
    "depyf",
    "opentelemetry",
    "av",
    "cv2",
    "librosa",
    "soundfile",
    "scipy",
    "lm_format_enforcer",
    "anthropic",
    "pydantic_settings",
    "sse_starlette",
    "python_multipart",
    "multipart",
    "httpx",
    "grpc",
    "ray",
    "model_hosting_container_standards",
    "tabulate",
    "pandas",
    "mcp",
    "openai_harmony_stub_never",
)
VLLM_FORCED_STUBS = ("vllm.config", "vllm.distributed", "vllm.multimodal", "vllm.model_executor")


class _StubAttr(type):
    """A class standing in for any attribute of a stubbed module: callable, subclassable, subscriptable."""

    def __new__(mcs, name, bases, namespace, **kwargs):
        return super().__new__(mcs, name, bases, namespace)

    def __init__(cls, name, bases, namespace, **kwargs) -> None:
        super().__init__(name, bases, namespace)

    def __getattr__(cls, name: str):  # noqa: N805
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _make_stub_class(f"{cls.__name__}.{name}")

    def __getitem__(cls, item):  # noqa: N805
        return cls

    def __or__(cls, other):  # noqa: N805
        return cls

    def __ror__(cls, other):  # noqa: N805
        return cls


def _make_stub_class(name: str) -> type:
    def _init(self, *args, **kwargs) -> None:
        pass

    def _schema(cls, source, handler):
        from pydantic_core import core_schema

        return core_schema.any_schema()

    def _init_subclass(cls, **kwargs) -> None:
        pass

    def _call(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # used as a decorator
        return self

    def _instance_getattr(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _make_stub_class(attr)

    namespace = {
        "__call__": _call,
        "__getattr__": _instance_getattr,
        "__init__": _init,
        "__init_subclass__": classmethod(_init_subclass),
        "__module__": "stub",
        "__get_pydantic_core_schema__": classmethod(_schema),
    }
    return _StubAttr(name.rsplit(".", 1)[-1], (), namespace)


class StubModule(types.ModuleType):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []
        self.__file__ = f"<stub {name}>"

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _make_stub_class(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return StubModule(spec.name)

    def exec_module(self, module) -> None:
        pass


class StubFinder(importlib.abc.MetaPathFinder):
    """Serves a stub for any module under the given roots that the real import system cannot find."""

    def __init__(self, roots: tuple[str, ...], forced: tuple[str, ...]) -> None:
        self.roots = set(roots)
        self.forced = forced

    def find_spec(self, fullname, path=None, target=None):
        if any(fullname == f or fullname.startswith(f + ".") for f in self.forced):
            return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)
        if fullname.split(".")[0] not in self.roots:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)


def register_bare_package(name: str, root: Path) -> None:
    """Make `name` importable as a package without executing its heavy __init__.py."""
    module = types.ModuleType(name)
    module.__path__ = [str(root / name)]
    module.__file__ = str(root / name / "__init__.py")
    sys.modules[name] = module


def _fake_versions_for(roots: tuple[str, ...]) -> None:
    import importlib.metadata as metadata

    real_version = metadata.version

    def version(name: str) -> str:
        try:
            return real_version(name)
        except metadata.PackageNotFoundError:
            if name.replace("-", "_") in roots or name in ("vllm", "sglang"):
                return "99.0.0"
            raise

    metadata.version = version


def install(engine: str, root: Path, extra_real: tuple[str, ...] = ()) -> None:
    sys.path.insert(0, str(root))
    _fake_versions_for(SGLANG_STUB_ROOTS if engine == "sglang" else VLLM_STUB_ROOTS)
    if engine == "sglang":
        roots = tuple(r for r in SGLANG_STUB_ROOTS if r not in extra_real)
        sys.meta_path.insert(0, StubFinder(roots, ()))
        register_bare_package("sglang", root)
    else:
        roots = tuple(r for r in VLLM_STUB_ROOTS if r not in extra_real)
        sys.meta_path.insert(0, StubFinder(roots, VLLM_FORCED_STUBS))
        register_bare_package("vllm", root)
