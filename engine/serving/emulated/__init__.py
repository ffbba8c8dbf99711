"""The engine emulations, one package per emulated release (vllm_0_33_0, sglang_0_5_23) with one module per model
family; engine/serving/registry.py maps the engines' names to them and to the real-engine backend (which serves the
pinned sglang@0.5.12 and every family an emulation lacks)."""
