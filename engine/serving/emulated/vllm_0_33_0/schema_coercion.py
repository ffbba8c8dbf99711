"""vLLM 0.33.0's coercion of tool-call argument values to the request's tool schema, shared by the parser-engine
families (GLM, Kimi K2, DeepSeek V4): tool_parsers/utils.py (find_tool_properties 335-353, extract_types_from_schema
1080-1123, aliases 1126-1150, coerce_to_schema_type 1153-1242) and parser_engine.py (_coerce_value 292-331, the
streamable string keys 420-435)."""

from __future__ import annotations

import json
import math

TYPE_ALIASES = {  # tool_parsers/utils.py:1126-1150
    "str": "string",
    "text": "string",
    "varchar": "string",
    "char": "string",
    "enum": "string",
    "int": "integer",
    "int32": "integer",
    "int64": "integer",
    "uint": "integer",
    "uint32": "integer",
    "uint64": "integer",
    "long": "integer",
    "short": "integer",
    "unsigned": "integer",
    "float": "number",
    "float32": "number",
    "float64": "number",
    "double": "number",
    "bool": "boolean",
    "dict": "object",
    "arr": "array",
    "list": "array",
    "sequence": "array",
}


def schema_types(schema: object) -> list[str]:
    """extract_types_from_schema (utils.py:1080-1123): type, enum value types, anyOf/oneOf/allOf; default string."""
    if not isinstance(schema, dict):
        return ["string"]
    types: set[str] = set()
    declared = schema.get("type")
    if isinstance(declared, str):
        types.add(declared)
    elif isinstance(declared, list):
        types.update(t for t in declared if isinstance(t, str))
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        for value in enum:
            if value is None:
                types.add("null")
            elif isinstance(value, bool):
                types.add("boolean")
            elif isinstance(value, int):
                types.add("integer")
            elif isinstance(value, float):
                types.add("number")
            elif isinstance(value, str):
                types.add("string")
            elif isinstance(value, list):
                types.add("array")
            elif isinstance(value, dict):
                types.add("object")
    for keyword in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(keyword)
        if isinstance(branches, list):
            for branch in branches:
                types.update(schema_types(branch))
    return list(types) if types else ["string"]


def json_finite(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(json_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(json_finite(v) for v in value)
    return True


def coerce_to_schema_type(value: str, schema_type: list[str]) -> object:
    """utils.py:1153-1242: null > integer > number > boolean > object > array > string, then a json.loads fallback.

    Returns `value` itself when nothing applies: the caller tests identity, as parser_engine.py:301 does."""
    types = {TYPE_ALIASES.get(t.strip().lower(), t.strip().lower()) for t in schema_type}
    for candidate in ("null", "integer", "number", "boolean", "object", "array", "string"):
        if candidate not in types:
            continue
        if candidate == "null":
            if value.lower() == "null":
                return None
            continue
        if candidate == "string":
            return value
        if candidate == "integer":
            try:
                return int(value)
            except (ValueError, TypeError):
                continue
        if candidate == "number":
            try:
                return int(value)
            except (ValueError, TypeError):
                pass
            try:
                number = float(value)
            except (ValueError, TypeError):
                continue
            if not math.isfinite(number):
                continue
            return number if number != int(number) else int(number)
        if candidate == "boolean":
            lowered = value.lower().strip()
            if lowered in ("true", "1"):
                return True
            if lowered in ("false", "0"):
                return False
            continue
        if candidate in ("object", "array"):
            try:
                parsed = json.loads(value)
            except ValueError:
                continue
            if json_finite(parsed):
                return parsed
            continue
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if json_finite(parsed) else value


def coerce_value(value: object, schema: dict) -> tuple[object, bool]:
    """parser_engine.py:292-331: strings are coerced; dicts and lists recurse when the schema describes them."""
    if isinstance(value, str):
        coerced = coerce_to_schema_type(value, schema_types(schema))
        return (coerced, True) if coerced is not value else (value, False)
    if isinstance(value, dict):
        nested = schema.get("properties")
        if isinstance(nested, dict):
            return value, coerce_dict(value, nested)
        return value, False
    if isinstance(value, list):
        items = schema.get("items")
        if not isinstance(items, dict):
            return value, False
        changed = False
        for position, item in enumerate(value):
            coerced, item_changed = coerce_value(item, items)
            if item_changed:
                value[position] = coerced
                changed = True
        return value, changed
    coerced = coerce_to_schema_type(json.dumps(value, ensure_ascii=False), schema_types(schema))
    if type(coerced) is not type(value) or coerced != value:
        return coerced, True
    return value, False


def coerce_dict(args: dict, properties: dict) -> bool:
    changed = False
    for key, value in args.items():
        declared = properties.get(key)
        if not isinstance(declared, dict):
            continue
        coerced, value_changed = coerce_value(value, declared)
        if value_changed:
            args[key] = coerced
            changed = True
    return changed


def tool_properties(tools: list[dict] | None, name: str) -> dict:
    """find_tool_properties (utils.py:335-353): the declared tool's `properties`, or {}."""
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        if function.get("name") == name:
            parameters = function.get("parameters") or {}
            properties = parameters.get("properties", {}) if isinstance(parameters, dict) else {}
            return properties if isinstance(properties, dict) else {}
    return {}


def streamable_string_keys(properties: dict) -> set[str] | None:
    """parser_engine.py:420-435: keys whose open string value may stream before the value closes (None: no schema)."""
    if not properties:
        return None
    return {key for key, schema in properties.items() if set(schema_types(schema)) == {"string"}}
