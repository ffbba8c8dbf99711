"""Import machinery for running a release's parsers and serving code without its heavy dependencies.

Runs only inside a sandboxed worker (worker.py), never in the explorer's own process.

- Heavy packages (torch, CUDA kernels, servers, transformers …) are stubbed even when installed; so is any package
  the real import system cannot find (a catch-all: fixed lists miss new imports). Light parser dependencies are
  installed for real (requirements.txt) and imported as they are; a few the release pins itself (fetch.DEPENDENCIES:
  mistral_common for vLLM) are run for real from the cache at the version it requires, when the backend fetched it.
- Hardware probes are never stubbed: a stub answering "yes" to `import libtpu` makes vLLM see a second platform.
- A stub records every attribute read or call made on it while `TOUCHES.armed` is set (during a parse), so the
  result can say which stub the parse actually relied on.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import sys
import types
from pathlib import Path
from typing import Any

# Stubbed even when installed: heavy, GPU-bound or server-side; none of them shapes parsed text.
HEAVY_ROOTS = frozenset({
    "torch", "torchvision", "torchaudio", "triton", "transformers", "tokenizers", "safetensors", "huggingface_hub",
    "sentencepiece", "xgrammar", "llguidance", "outlines", "outlines_core", "lm_format_enforcer", "flashinfer",
    "sgl_kernel", "vllm_flash_attn", "xformers", "compressed_tensors", "gguf", "ray", "zmq", "uvloop", "uvicorn",
    "fastapi", "aiohttp", "requests", "httpx", "urllib3", "prometheus_client", "prometheus_fastapi_instrumentator",
    "psutil", "cpuinfo", "setproctitle", "cloudpickle", "PIL", "cv2", "av", "librosa", "soundfile", "scipy",
    "decord", "einops", "mistral_common", "tiktoken", "grpc", "opentelemetry", "modelscope", "hf_transfer",
    "blobfile", "IPython", "tqdm", "starlette", "sse_starlette", "pydantic_settings", "anthropic", "mcp",
    "diskcache", "filelock", "watchfiles", "depyf", "blake3", "cbor2", "pybase64", "openai", "pandas",
    "tabulate", "lark", "model_hosting_container_standards", "msgpack", "python_multipart", "multipart", "numba",
    "cupy", "deep_gemm", "deep_ep", "nixl", "lmcache", "mooncake", "quack", "cuda", "nvidia", "apache_tvm_ffi",
    "tvm_ffi", "pynvml", "torch_memory_saver", "dill", "yaml", "numpy",
})
# Never stubbed, even when missing: their absence is how the engines learn what hardware there is.
HARDWARE_PROBES = frozenset({
    "libtpu", "torch_xla", "jax", "tpu_info", "amdsmi", "habana_frameworks", "intel_extension_for_pytorch",
    "vllm_tpu", "tpu_commons", "tpu_inference", "torch_npu", "vllm_ascend", "mindie_turbo", "pyrsmi", "aiter",
    "vllm_gaudi", "vllm_spyre", "vllm_neuron", "neuronx_distributed", "torch_neuronx", "ixformer", "mlx",
})
# The engines' own subpackages that only the model runner and scheduler need (importing them pulls GPU code).
FORCED_STUBS = {
    "vllm": ("vllm.config", "vllm.distributed", "vllm.multimodal", "vllm.model_executor", "vllm.ir",
             "vllm.attention.layer"),  # the last two register torch ops at import
    # What the serving path would otherwise pull in from the scheduler and model runner (found by running releases).
    "sglang": ("sglang.srt.managers.scheduler", "sglang.srt.models", "sglang.srt.layers", "sglang.srt.distributed",
               "sglang.srt.model_executor", "sglang.srt.mem_cache", "sglang.srt.disaggregation",
               "sglang.srt.speculative", "sglang.srt.model_loader", "sglang.srt.compilation", "sglang.srt.eplb",
               "sglang.srt.connector", "sglang.srt.batch_overlap", "sglang.srt.hardware_backend",
               "sglang.srt.multimodal", "sglang.srt.managers.tokenizer_manager", "sglang.srt.managers.mm_utils",
               "sglang.srt.managers.schedule_batch", "sglang.srt.managers.detokenizer_manager",
               "sglang.srt.managers.data_parallel_controller", "sglang.srt.entrypoints.engine",
               "sglang.srt.entrypoints.http_server", "sglang.srt.sampling", "sglang.srt.constrained",
               "sglang.srt.grpc", "sglang.srt.managers.template_manager", "sglang.srt.dllm", "sglang.srt.configs",
               "sglang.kernels", "sglang.jit_kernel"),
}


class Touches:
    """Which stubbed names were used while armed (during a parse)."""

    def __init__(self) -> None:
        self.armed = False
        self.names: set[str] = set()

    def note(self, name: str) -> None:
        if self.armed and not _importing():
            self.names.add(name)


def _importing() -> bool:
    """Whether a module body is executing (a parser module imported lazily on first use): not a parse's touch."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "<module>":
            return True
        frame = frame.f_back
    return False


TOUCHES = Touches()


class _StubMeta(type):
    """The class of every stub attribute: callable, subclassable, subscriptable, falsy-free, never iterable."""

    def __new__(mcs, name, bases, namespace, **kwargs):
        return super().__new__(mcs, name, bases, namespace)

    def __init__(cls, name, bases, namespace, **kwargs) -> None:
        super().__init__(name, bases, namespace)

    def __getattr__(cls, name: str):  # noqa: N805
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        TOUCHES.note(f"{cls.__qualname__}.{name}")
        return stub_class(f"{cls.__qualname__}.{name}")

    def __getitem__(cls, item):  # noqa: N805
        return cls

    def __setitem__(cls, item, value):  # noqa: N805 - registries of stubbed libraries (transformers' CONFIG_MAPPING)
        pass

    def __contains__(cls, item):  # noqa: N805
        return False

    def __or__(cls, other):  # noqa: N805
        return cls

    def __ror__(cls, other):  # noqa: N805
        return cls

    def __iter__(cls):  # noqa: N805 - iterating a stub must end (SGLang 0.5.23 iterates one at import)
        return iter(())

    def __call__(cls, *args, **kwargs):  # noqa: N805
        TOUCHES.note(f"{cls.__qualname__}()")
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], _StubMeta):
            return args[0]  # used as a decorator
        return super().__call__(*args, **kwargs)


def stub_class(qualname: str) -> type:
    def _init(self, *args, **kwargs) -> None:
        pass

    def _schema(cls, source, handler):
        from pydantic_core import core_schema

        return core_schema.any_schema()

    def _init_subclass(cls, **kwargs) -> None:
        pass

    def _call(self, *args, **kwargs):
        TOUCHES.note(f"{type(self).__qualname__}()()")
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return self

    def _instance_getattr(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        TOUCHES.note(f"{type(self).__qualname__}.{attr}")
        return stub_class(f"{type(self).__qualname__}.{attr}")

    namespace = {
        "__call__": _call, "__getattr__": _instance_getattr, "__init__": _init,
        "__init_subclass__": classmethod(_init_subclass), "__module__": "stub",
        "__get_pydantic_core_schema__": classmethod(_schema), "__iter__": lambda self: iter(()),
        # falsy: `if torch.cuda.is_available():` on a stub must take the no-hardware branch
        "__bool__": lambda self: False,
        "__getitem__": lambda self, item: self, "__setitem__": lambda self, item, value: None,
        "__contains__": lambda self, item: False, "__len__": lambda self: 0,
        "__qualname__": qualname,
    }
    return _StubMeta(qualname.rsplit(".", 1)[-1], (), namespace)


class StubModule(types.ModuleType):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []
        self.__file__ = f"<stub {name}>"
        self.__stub__ = True

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__") and name != "__version__":
            raise AttributeError(name)
        TOUCHES.note(f"{self.__name__}.{name}")
        value = _import_time_value(self.__name__, name)
        setattr(self, name, value)
        return value


def _import_time_value(module: str, name: str):
    """Values real code computes with at import time, where a class would not do."""
    if name == "__version__":
        return "99.0.0"
    if module == "torch" and name in ("iinfo", "finfo"):
        return lambda dtype=None: types.SimpleNamespace(max=2**63 - 1, min=-(2**63), eps=1e-7, tiny=1e-38,
                                                        bits=64)
    if module.split(".")[0] == "openai" and name.endswith("Param"):
        return typed_dict_stub(f"{module}.{name}")
    return stub_class(f"{module}.{name}")


def typed_dict_stub(qualname: str) -> type:
    """openai's `...Param` types are TypedDicts: the request side builds message parts with them
    (`ChatCompletionContentPartTextParam(type="text", text=...)`), which must give a dict, as a TypedDict does."""

    def _schema(cls, source, handler):
        from pydantic_core import core_schema

        return core_schema.any_schema()

    def _init_subclass(cls, **kwargs) -> None:  # `class X(Param, total=False)`
        pass

    return type(qualname.rsplit(".", 1)[-1], (dict,), {"__get_pydantic_core_schema__": classmethod(_schema),
                                                       "__init_subclass__": classmethod(_init_subclass),
                                                       "__module__": "stub", "__qualname__": qualname})


class StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return StubModule(spec.name)

    def exec_module(self, module) -> None:
        pass


def found_by_others(finder: importlib.abc.MetaPathFinder, fullname: str, path: Any = None, target: Any = None) -> Any:
    """The module spec the other finders on sys.meta_path give (what is installed for real), else None."""
    for other in sys.meta_path:
        if other is finder or not hasattr(other, "find_spec"):
            continue
        spec = other.find_spec(fullname, path, target)
        if spec is not None:
            return spec
    return None


class StubFinder(importlib.abc.MetaPathFinder):
    """Stubs the heavy roots and the engine's forced subpackages, and, as a catch-all, anything not installed."""

    def __init__(self, engine: str, real: frozenset[str] = frozenset()) -> None:
        self.forced = FORCED_STUBS[engine]
        self.engine = engine
        self.real = real  # heavy roots whose release-pinned sources are on sys.path: imported as they are
        self.stubbed: set[str] = set()

    def find_spec(self, fullname, path=None, target=None):
        root = fullname.split(".")[0]
        if root in HARDWARE_PROBES or root in sys.stdlib_module_names or root.startswith("_"):
            return None  # optional standard-library modules (_winapi …) must stay missing
        if any(fullname == f or fullname.startswith(f + ".") for f in self.forced) or (
                root in HEAVY_ROOTS and root not in self.real):
            return self._stub(fullname)
        if root == self.engine:
            return None  # the release's own modules load from its sources (a missing one is a real error)
        spec = found_by_others(self, fullname, path, target)
        if spec is not None:
            return spec
        if "." in fullname and fullname.split(".")[0] not in self.stubbed:
            return None  # a missing submodule of a real package: let the import fail as it would
        return self._stub(fullname)

    def _stub(self, fullname: str):
        self.stubbed.add(fullname.split(".")[0])
        return importlib.machinery.ModuleSpec(fullname, StubLoader(), is_package=True)


def _bare_package(engine: str, root: Path) -> None:
    """The engine's top package without running its __init__.py (which imports the whole server); attributes it
    would export lazily (vLLM's MODULE_ATTRS table, e.g. `from vllm import PoolingParams`) are resolved on demand."""
    init = root / engine / "__init__.py"
    lazy: dict[str, str] = {}
    try:
        tree = ast.parse(init.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == "MODULE_ATTRS" for t in targets):
                    lazy = ast.literal_eval(node.value)
    except (OSError, SyntaxError, ValueError):
        lazy = {}
    module = types.ModuleType(engine)
    module.__path__ = [str(root / engine)]
    module.__file__ = str(init)

    def __getattr__(name: str):  # noqa: N807
        if name in lazy:
            module_name, _, attr = lazy[name].partition(":")
            value = getattr(importlib.import_module(module_name, engine), attr or name)
            setattr(module, name, value)
            return value
        raise AttributeError(f"module {engine!r} has no attribute {name!r}")

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    sys.modules[engine] = module


def _fake_distribution_versions(engine: str, version: str) -> None:
    real_version = importlib.metadata.version

    def version_of(name: str) -> str:
        if name.lower() == engine:
            return version
        try:
            return real_version(name)
        except importlib.metadata.PackageNotFoundError:
            if name.lower().replace("-", "_") in HEAVY_ROOTS:
                return "99.0.0"
            raise

    importlib.metadata.version = version_of


def install(engine: str, version: str, root: Path, dependencies: dict[str, Path] | None = None) -> StubFinder:
    """`dependencies`: name -> the folder holding that package's sources (the release's pinned version, fetched by
    the backend), imported for real instead of stubbed; their own heavy imports (numpy, PIL …) stay stubs."""
    sys.path.insert(0, str(root))
    for folder in (dependencies or {}).values():
        sys.path.insert(1, str(folder))
    _fake_distribution_versions(engine, version)
    finder = StubFinder(engine, frozenset(dependencies or ()))
    sys.meta_path.insert(0, finder)
    _bare_package(engine, root)
    return finder
