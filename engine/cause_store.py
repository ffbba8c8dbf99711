"""Causes kept across runs: a broken cell's cause, found by re-running the cell with each candidate change undone
(engine.blame), stored in the engine cache's result store (engine.serving.real.results, under
`causes/<fingerprint>/`, the fingerprint of `code_fingerprint()`) and read back when the same cell breaks the same way
again.

The key covers everything the search reads: the explorer's own code and data (every module of `engine`, the model
manifests, the installed packages' versions), the model's assets by hash and where they came from, the scenario, the
column, the kwargs, and the cell's boundaries as this run computed them (prompts, ids, the completion, the engine's
parse and edits). The cell itself is always computed; only the search is skipped, and only for a cell that breaks
exactly as it broke when its cause was proved. A template changed, a tokenizer replaced, a release's code or this
package edited: another key, and the cause is searched for again.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from array import array
from typing import Any

from engine.fingerprint import code_fingerprint
from engine.scenario import Scenario
from engine.serving.real.results import FingerprintFolder, persisted_results_enabled, result_cache
from engine.serving.spec import EngineSpec
from engine.types import Boundary, Cause, Contrast, Edit, Fix, Location

STORE = "causes"  # the result store's folder for them


def _hash_boundary(digest: Any, b: Boundary) -> None:
    # Fed piece by piece (each with its length): a JSON document of every prompt would be built only to be hashed
    for text in (b.prev_prompt.text, b.next_prompt.text, repr((b.index, b.trigger, b.completion, b.parse,
                                                             b.request_edits))):
        data = text.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little") + data)
    for ids in (b.completion_ids, b.prev_prompt_ids, b.next_ids):
        data = b"-" if ids is None else array("q", ids).tobytes()
        digest.update(len(data).to_bytes(8, "little") + data)


def cause_key(model: Any, scenario: Scenario, engine: EngineSpec, user_kwargs: dict, kwargs: dict, hints: bool,
              boundaries: tuple[Boundary, ...]) -> str | None:
    """The key of this cell's cause in the store, or None when causes are not kept (DRIFT_CAUSE_STORE=0, or
    DRIFT_RESULT_CACHE=0: no persisted answers at all)."""
    if not persisted_results_enabled() or os.environ.get("DRIFT_CAUSE_STORE", "1") == "0":
        return None
    # The assets' sources too: two uploads of the same bytes are two visitors' files, and a cause names its file
    inputs = [code_fingerprint(), model.id, sorted(model.asset_hashes.items()), sorted(model.asset_sources.items()),
              repr(scenario), str(engine), user_kwargs, kwargs, hints, len(boundaries)]
    digest = hashlib.sha256(json.dumps(inputs, ensure_ascii=True, default=repr).encode())
    for b in boundaries:
        _hash_boundary(digest, b)
    return digest.hexdigest()


@functools.cache
def cause_folder() -> FingerprintFolder:
    """Where this code's causes are kept (results/causes/<fingerprint>/): another code's are pruned as a release's
    answers of another glue are (ResultCache.prune)."""
    return FingerprintFolder.of(STORE, {"code": code_fingerprint()})


def stored_cause(key: str) -> Cause | None:
    entry = result_cache().get(cause_folder(), key)
    return cause_from_json(entry["cause"]) if entry is not None else None


def store_cause(key: str, cause: Cause) -> None:
    result_cache().put(cause_folder(), key, {"cause": cause_to_json(cause)})


def cause_to_json(cause: Cause) -> dict:
    """Every field, losslessly (Cause.to_json is the evidence's shape, which leaves some out)."""
    def encode(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, tuple):
            return [encode(v) for v in value]
        return value

    return encode(cause)


def cause_from_json(data: dict) -> Cause:
    edit = data["edit"]
    return Cause(stage=data["stage"], kind=data["kind"], locations=tuple(Location(**d) for d in data["locations"]),
                 changed=data["changed"], fix=Fix(**data["fix"]) if data["fix"] else None, proof=data["proof"],
                 detail=data["detail"],
                 edit=Edit(**{**edit, "location": Location(**edit["location"])}) if edit else None,
                 contrast=Contrast(**data["contrast"]) if data["contrast"] else None)
