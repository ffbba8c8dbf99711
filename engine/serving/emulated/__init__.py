"""The engine emulations, one package per pinned release (vllm_0_33_0, sglang_0_5_23, sglang_0_5_12) with one module
per model family; engine/serving/registry.py maps the engines' names to them and to the real-engine backend."""
