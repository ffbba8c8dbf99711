"""SGLang 0.5.12 Kimi K2.x (kimi_k2).

The same code as 0.5.23 for this family unless this module says otherwise."""

from __future__ import annotations

from engine.parsers.sglang_0_5_23.kimi_k2 import SglangKimiK2Parser


class SglangKimiK2Parser0512(SglangKimiK2Parser):
    pass
