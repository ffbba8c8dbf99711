"""Where a template runtime renders a request otherwise than transformers' Jinja, and the construct that does it,
rendered alone under both runtimes (issue 27).

The request is rendered from the marked template by both (engine.render.segments, engine.render.runtimes
.compare_renders); the segment of interest (the one holding a break, else the first that differs) names an output tag,
the literal text after one, or, where the two renders' outputs stop lining up, the conditions between. The values of
that construct's variables are captured from transformers' render of the same request (a capture variant of the
template), and the construct and each of its sub-expressions are rendered alone with them under both runtimes: the
innermost one whose output differs is the construct (a test or a condition compared by its truth value, a value that
is not a string only as the output prints it, since printing itself differs between runtimes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import jinja2
from jinja2 import nodes

from engine.prefix import common_prefix
from engine.render import segments as marks
from engine.render.runtimes import ComparedRenders, RenderFailure, RuntimeRenderer, compare_renders, reference_render
from engine.types import Contrast, Location, Rendered, RenderRequest

REFERENCE = f"transformers' Jinja (jinja2 {jinja2.__version__})"
_MAX_SHOWN = 400


@dataclass(frozen=True)
class RuntimeDifference:
    """What the runtime prints otherwise than transformers for one request: where (in the runtime's text), the
    construct (its template lines), what each printed there, and the construct rendered alone under both."""

    position: int
    location: Location
    kind: str  # "output" | "assignment" | "literal" | "condition"
    reference_text: str
    runtime_text: str
    contrast: Contrast | None
    emitted: Location | None = None  # the output that printed it, where the construct is an assignment before it

    def sentence(self, runtime: str) -> str:
        where = f"{self.location.path}:{self.location.line}"
        start = max(common_prefix(self.runtime_text, self.reference_text) - 12, 0)
        return (f"{runtime} prints {_clip(self.runtime_text, start)!r} where {REFERENCE} prints "
                f"{_clip(self.reference_text, start)!r} ({self.kind} {_clip(self.location.text, 0, 80)!r}, {where})")


def _clip(text: str, start: int, width: int = 40) -> str:
    """`width` characters of `text` from `start`, with … where text was left out."""
    shown = text[start:start + width]
    return ("…" if start else "") + shown + ("…" if start + width < len(text) else "")


def locate(renderer: RuntimeRenderer, request: RenderRequest, at: int | None = None) -> RuntimeDifference | None:
    """The runtime's difference from transformers for `request`: at character `at` of the runtime's text (a break),
    else the nearest difference before it; with `at` None, the first difference. None where the renders agree or the
    template cannot be marked."""
    compared = compare_renders(renderer, request.messages, request.tools, request.add_generation_prompt,
                               request.kwargs)
    if compared is None:
        return None
    index = _differing_segment(compared, at)
    if index is None:
        return None
    mine = compared.runtime_segments[index]
    theirs = compared.aligned(index)
    if theirs is None:
        return _diverging_condition(renderer, compared, index)
    if mine.literal:
        return _literal(renderer, compared, index)
    return _output(renderer, compared, index)


def _differing_segment(compared: ComparedRenders, at: int | None) -> int | None:
    segs = compared.runtime_segments

    def differs(i: int) -> bool:
        theirs = compared.aligned(i)
        return theirs is None or theirs.text != segs[i].text

    if not segs:
        return None
    if at is None:
        found = next((i for i in range(len(segs)) if differs(i)), None)
    else:
        at_segment = marks.segment_at(segs, min(at, max(len(compared.runtime_text) - 1, 0)))
        found = next((i for i in range(at_segment, -1, -1) if differs(i)), None)
    if found is None and compared.runtime_text != compared.reference_text:
        found = min(compared.agree, len(segs) - 1)  # the reference has segments the runtime does not
    return found


def _tag_location(renderer: RuntimeRenderer, tag: marks.Tag) -> Location:
    scanned = marks.scan(renderer.template_source)
    end_line = scanned.line_of(tag.end - 1) if scanned is not None else tag.line
    return Location(renderer.origin, renderer.source_path, tag.line, end_line if end_line != tag.line else None,
                    text=renderer.source_lines()[tag.line - 1].strip() if tag.line <= len(renderer.source_lines())
                    else "")


def _captured_row(renderer: RuntimeRenderer, compared: ComparedRenders, tag: marks.Tag, names: tuple[str, ...],
                  occurrence: int) -> dict | None:
    """The values `names` had at `tag`'s `occurrence`-th run in transformers' render of the request."""
    from engine.render.jinja import transformers_pieces

    source = compared.scanned.with_capture(tag, names)
    try:
        template = transformers_pieces()._compile_jinja_template(source)
        template.globals["drift_capture"] = marks.drift_capture
        rows = marks.captured(lambda: template.render(**compared.context))
    except Exception:  # noqa: BLE001 - a capture variant transformers refuses: no inputs to render with
        return None
    return rows[occurrence] if occurrence < len(rows) else None


def _render_pair(renderer: RuntimeRenderer, snippet: str, row: dict) -> tuple[str, str] | None:
    try:
        reference = reference_render(snippet, row)
    except Exception as err:  # noqa: BLE001 - transformers refusing the snippet alone: its message is the output
        reference = f"(error: {str(err)[:120]})"
    (mine,) = renderer.render_source(snippet, [row])
    runtime = f"(error: {str(mine)[:120]})" if isinstance(mine, RenderFailure) else mine
    return reference, runtime


def _inputs(row: dict, node: nodes.Node) -> str:
    names = marks.free_names(node)
    return json.dumps({name: row[name] for name in names if name in row}, ensure_ascii=False, default=str)[:_MAX_SHOWN]


def _is_condition(node: nodes.Node) -> bool:
    return isinstance(node, (nodes.Test, nodes.Compare, nodes.And, nodes.Or, nodes.Not))


def _sub_expressions(expression: nodes.Node, row: dict) -> list[nodes.Node]:
    """The expression's parts that compute something (filters, calls, subscripts, tests, comparisons,
    conditionals), innermost first, then the expression itself; of a conditional expression, the branch transformers
    takes with `row` only."""
    found: list[nodes.Node] = []

    def visit(node: nodes.Node) -> None:
        children = list(node.iter_child_nodes())
        if isinstance(node, nodes.CondExpr):
            test = marks.jinja_source(node.test)
            try:
                taken = test is not None and reference_render("{% if " + test + " %}1{% endif %}", row) == "1"
            except Exception:  # noqa: BLE001 - a test transformers cannot evaluate alone: both branches
                taken = None
            if taken is not None:
                children = [node.test, node.expr1 if taken else node.expr2]
        for child in children:
            if child is not None:
                visit(child)
        if isinstance(node, (nodes.Filter, nodes.Call, nodes.Getitem, nodes.Test, nodes.Compare, nodes.CondExpr,
                             nodes.Concat, nodes.And, nodes.Or, nodes.Not)) and node is not expression:
            found.append(node)

    visit(expression)
    return [*found, expression]


def isolate(renderer: RuntimeRenderer, body: str, row: dict) -> Contrast | None:
    """The innermost part of the expression `body` whose output, rendered alone with `row`, differs between the
    runtimes; the whole output when none of its parts does but it prints otherwise; None when it prints alike."""
    expression = marks.parse_expression(body)
    if expression is None:
        return None
    whole = "{{ " + body.strip() + " }}"
    for node in _sub_expressions(expression, row):
        source = whole if node is expression else marks.jinja_source(node)
        if source is None:
            continue
        if node is expression:
            snippet = source
        elif _is_condition(node):
            snippet = "{% if " + source + " %}true{% else %}false{% endif %}"
        else:
            try:  # a value that is not a string is compared only as the output prints it (printing differs)
                if reference_render("{{ (" + source + ") is string }}", row) != "True":
                    continue
            except Exception:  # noqa: BLE001 - a part transformers cannot evaluate alone: skipped
                continue
            snippet = "{{ " + source + " }}"
        pair = _render_pair(renderer, snippet, row)
        if pair is not None and pair[0] != pair[1]:
            return Contrast(snippet, _inputs(row, node), REFERENCE, pair[0][:_MAX_SHOWN], renderer.runtime.label,
                            pair[1][:_MAX_SHOWN])
    return None


def _output(renderer: RuntimeRenderer, compared: ComparedRenders, index: int) -> RuntimeDifference:
    mine = compared.runtime_segments[index]
    theirs = compared.aligned(index)
    assert theirs is not None
    tag = compared.scanned.outputs[mine.output]
    expression = marks.parse_expression(tag.body)
    contrast = None
    if expression is not None:
        row = _captured_row(renderer, compared, tag, marks.free_names(expression), mine.occurrence)
        if row is not None:
            contrast = isolate(renderer, tag.body, row)
        if contrast is None:  # the output prints a value a `set` computed: the assignment is the construct
            found = _through_assignment(renderer, compared, tag, expression, theirs.text)
            if found is not None:
                assignment, contrast = found
                return RuntimeDifference(mine.start, _tag_location(renderer, assignment), "assignment", theirs.text,
                                         mine.text, contrast, emitted=_tag_location(renderer, tag))
    return RuntimeDifference(mine.start, _tag_location(renderer, tag), "output", theirs.text, mine.text, contrast)


_SET = r"^\s*set\s+{name}\s*=\s*(.+)$"


def _through_assignment(renderer: RuntimeRenderer, compared: ComparedRenders, output: marks.Tag,
                        expression: nodes.Node, printed: str) -> tuple[marks.Tag, Contrast] | None:
    """For an output of variables: the nearest `{% set NAME = EXPR %}` before it, of one of them, whose EXPR
    (rendered alone by transformers with the values captured there) gives what the output printed, and EXPR's
    differing part under the runtime."""
    import re

    for name in marks.free_names(expression):
        pattern = re.compile(_SET.format(name=re.escape(name)), re.DOTALL)
        assignments = [t for t in compared.scanned.tags if t.kind == "block" and t.start < output.start
                       and pattern.match(t.body)]
        for assignment in reversed(assignments):
            value = pattern.match(assignment.body).group(1).strip()  # type: ignore[union-attr]
            assigned = marks.parse_expression(value)
            if assigned is None:
                continue
            names = marks.free_names(assigned)
            for occurrence in range(64):
                row = _captured_row(renderer, compared, assignment, names, occurrence)
                if row is None:
                    break
                try:
                    if reference_render("{{ " + value + " }}", row) != printed:
                        continue
                except Exception:  # noqa: BLE001 - not renderable alone: try the next
                    continue
                contrast = isolate(renderer, value, row)
                if contrast is not None:
                    return assignment, contrast
    return None


def _literal(renderer: RuntimeRenderer, compared: ComparedRenders, index: int) -> RuntimeDifference:
    """Literal text after an output prints otherwise: the template text from that output to the next one (whitespace
    control of the block tags there), shown as each runtime printed it."""
    mine = compared.runtime_segments[index]
    theirs = compared.aligned(index)
    assert theirs is not None
    outputs = compared.scanned.outputs
    start = outputs[mine.output].end if mine.output >= 0 else 0
    following = [t.start for t in outputs if t.start >= start]
    end = following[0] if following else len(renderer.template_source)
    region = renderer.template_source[start:end]
    first_line = compared.scanned.line_of(start + len(region) - len(region.lstrip()))
    last_line = compared.scanned.line_of(max(end - 1, start))
    lines = renderer.source_lines()
    location = Location(renderer.origin, renderer.source_path, first_line, last_line if last_line != first_line else
                        None, text=lines[first_line - 1].strip() if first_line <= len(lines) else "")
    contrast = Contrast(region.strip()[:_MAX_SHOWN], "{}", REFERENCE, theirs.text[:_MAX_SHOWN],
                        renderer.runtime.label, mine.text[:_MAX_SHOWN])
    return RuntimeDifference(mine.start, location, "literal", theirs.text, mine.text, contrast)


_CONDITION_KEYWORDS = ("if", "elif", "for")


def _condition_expression(tag: marks.Tag) -> tuple[nodes.Node, str] | None:
    """A block tag's test: `if X` / `elif X` (its truth), `for a in X` (how many items)."""
    words = tag.body.strip()
    keyword = tag.keyword
    if keyword in ("if", "elif"):
        source = words[len(keyword):].strip()
        expression = marks.parse_expression(source)
        return (expression, "{% if " + source + " %}true{% else %}false{% endif %}") if expression else None
    if keyword == "for" and " in " in words:
        source = words.split(" in ", 1)[1]
        source = source.split(" if ", 1)[0].replace(" recursive", "").strip()
        expression = marks.parse_expression(source)
        return (expression, "{{ ((" + source + ")|list)|length }}") if expression else None
    return None


def _diverging_condition(renderer: RuntimeRenderer, compared: ComparedRenders, index: int) -> RuntimeDifference:
    """The two renders stop lining up at segment `index`: a condition between the last output both printed and the
    next one takes another branch (or a loop runs another number of times); the first such block tag whose test,
    rendered alone with transformers' values, differs."""
    mine = compared.runtime_segments[index]
    agree = compared.agree
    last = compared.runtime_segments[agree - 1] if agree > 0 else None
    outputs = compared.scanned.outputs
    start = outputs[last.output].start if last is not None and last.output >= 0 else 0
    theirs = compared.reference_segments[agree] if agree < len(compared.reference_segments) else None
    candidates = [t.start for t in (outputs[mine.output] if mine.output >= 0 else None,
                                    outputs[theirs.output] if theirs is not None and theirs.output >= 0 else None)
                  if t is not None and t.start > start]
    end = max(candidates) if candidates else len(renderer.template_source)
    blocks = [t for t in compared.scanned.tags if t.kind == "block" and t.keyword in _CONDITION_KEYWORDS
              and start <= t.start <= end]
    reference_text = theirs.text if theirs is not None else ""
    for tag in blocks:
        test = _condition_expression(tag)
        if test is None:
            continue
        expression, snippet = test
        names = marks.free_names(expression)
        for occurrence in range(64):
            row = _captured_row(renderer, compared, tag, names, occurrence)
            if row is None:
                break
            pair = _render_pair(renderer, snippet, row)
            if pair is not None and pair[0] != pair[1]:
                contrast = Contrast(snippet, _inputs(row, expression), REFERENCE, pair[0], renderer.runtime.label,
                                    pair[1])
                return RuntimeDifference(mine.start, _tag_location(renderer, tag), "condition", reference_text,
                                         mine.text, contrast)
    first_line = compared.scanned.line_of(start)
    lines = renderer.source_lines()
    location = Location(renderer.origin, renderer.source_path, first_line, compared.scanned.line_of(end),
                        text=lines[first_line - 1].strip() if first_line <= len(lines) else "")
    return RuntimeDifference(mine.start, location, "condition", reference_text, mine.text, None)


def prompt_note(renderer: RuntimeRenderer, prompts: list[tuple[int, Rendered, RenderRequest | None]]) -> str:
    """Whether the runtime's prompts (request number, prompt, its request) are the ones transformers renders: the
    first that is not, where and which construct, or that all are."""
    label = renderer.runtime.label
    for number, prompt, request in prompts:
        if request is None:
            continue
        reference = renderer.base.render(request.messages, request.tools,
                                         add_generation_prompt=request.add_generation_prompt, kwargs=request.kwargs)
        if reference.text == prompt.text:
            continue
        found = locate(renderer, request)
        where = f"request {number}'s prompt differs from {REFERENCE}'s"
        if found is None:
            return f"{where}; the construct is not located (the template cannot be marked)"
        return f"{where} at character {found.position}: {found.sentence(label)}"
    return f"{label} renders every prompt here as {REFERENCE} does"
