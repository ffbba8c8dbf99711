"""The constructs of a Jinja chat template that can change a model's text, made observable and undoable.

The template's AST is rewritten so that every construct that can transform or drop a message field reports what it
did and can be undone for one message at a time:
  - text filters (`|trim`, `|tojson`, `|string`, `|replace`, ...) and string methods (`.strip()`, `.lstrip('\\n')`,
    `.split('</think>')[-1]`, ...): `result|drift_op(id, input)`; undone, the input passes through unchanged;
  - conditions (`{% if %}`, `{% elif %}`, inline `a if c else b`): `test|drift_if(id)`; undone, the other branch;
  - outputs (`{{ ... }}` and literal template text): `value|drift_out(id)`; undone, nothing is emitted;
  - bindings: the value of every `{% set %}` (plain variables, `namespace` attributes) and every argument of a call to
    one of the template's own macros: `value|drift_set(id)`; recorded, and substituted by another value (the model's
    own text, a message's own index) when blame asks, never undone outright.
The rewritten template is compiled in the same sandboxed environment as the real one, and with nothing undone it
renders the same text (checked by the caller). Undoing only from the message whose rendering broke on leaves the rest
of the conversation, and so the previous prompt, as the real template renders it: that is the counterfactual "had
this construct not changed these messages".
"""

from __future__ import annotations

import ast
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import jinja2
from jinja2 import nodes
from jinja2.runtime import LoopContext
from jinja2.visitor import NodeTransformer

TEXT_FILTERS = frozenset({"trim", "string", "tojson", "replace", "lower", "upper", "title", "capitalize", "default",
                          "d", "join", "truncate", "indent", "striptags", "wordwrap", "format", "center"})
# Methods whose receiver is the value they change (not `sep.join(items)` or `template.format(...)`).
STRING_METHODS = frozenset({"strip", "lstrip", "rstrip", "split", "rsplit", "replace", "lower", "upper", "title",
                            "capitalize", "removeprefix", "removesuffix", "splitlines"})


@dataclass(frozen=True)
class Construct:
    """One rewritable construct: `kind` is "op" (filter or method), "condition", "output" or "set" (a binding)."""

    id: int
    kind: str
    # the filter or method name; "if" for a condition; "output" for an output; "set" for an assignment, "argument" for
    # a macro call's argument
    name: str
    line: int
    end_line: int
    description: str  # readable source of the construct, e.g. "content.strip()" or "{% if ... %}"
    # readable source of what an op is applied to, e.g. "content"; the variable a set assigns ("ns.last_user_index");
    # the parameter an argument binds ("visible_text(content)")
    receiver: str = ""
    names: frozenset[str] = frozenset()  # the variables a condition tests, or a binding's value reads


@dataclass(frozen=True)
class ConstructTable:
    """A rewritten source's constructs, and what its variables are assigned from: `aliases` (a variable -> the
    variables its value reads) and `assigned_at` (a variable -> the lines that assign it)."""

    constructs: tuple[Construct, ...]
    aliases: dict[str, frozenset[str]]
    assigned_at: dict[str, tuple[int, ...]]


class _Recording:
    """What both rewriters (Jinja and Python) keep while they number the constructs."""

    def __init__(self) -> None:
        self.constructs: list[Construct] = []
        self.aliases: dict[str, set[str]] = {}
        self.assigned_at: dict[str, list[int]] = {}

    def _new(self, kind: str, name: str, node, description: str, receiver: str = "",
             end_line: int | None = None, names: frozenset[str] = frozenset()) -> int:
        construct = Construct(len(self.constructs), kind, name, node.lineno, end_line or node.lineno, description,
                              receiver, names)
        self.constructs.append(construct)
        return construct.id

    def _assigned(self, target: str, read: set[str], line: int) -> None:
        self.aliases.setdefault(target, set()).update(read)
        self.assigned_at.setdefault(target, []).append(line)

    def table(self) -> ConstructTable:
        return ConstructTable(tuple(self.constructs), {k: frozenset(v) for k, v in self.aliases.items()},
                              {k: tuple(v) for k, v in self.assigned_at.items()})


@dataclass(frozen=True)
class Evaluation:
    """One run of a construct while the template rendered message `message` (-1: outside any message)."""

    construct: int
    message: int
    before: object = None  # an op's input; a condition's value; a binding's value (text and numbers only)
    after: object = None  # an op's result; for a binding, the `loop.index0` of the loop over that message, if any
    # How many characters of the prompt the render had put out when the construct ran (None: not known). Everything
    # before that is the same in any render that changes only this run or later ones.
    emitted: int | None = None


@dataclass
class _Run:
    message_ids: dict[int, int]
    undo_from: int | None = None
    undo: frozenset[int] = frozenset()
    # construct id -> {a result it gave (substitution_key): the value to give instead}: "had it printed what the
    # model wrote", "had it assigned this message's own index"
    substitute: dict[int, dict[str, object]] = field(default_factory=dict)
    record: bool = True
    evaluations: list[Evaluation] = field(default_factory=list)
    emitted: int | None = None  # characters put out so far, where the render counts them (a template's)
    caller: object = None  # the frame that started the render: the frames of its template are all below it


def substitution_key(value: object) -> str | None:
    """What a substitution is keyed by: the text itself, or a tagged form of a number (the key must survive JSON, for
    the encoders run in an engine's worker); None for any other value, which is never substituted."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return f"\0int:{value}"
    return None


def _recordable(value: object) -> object:
    """A binding's value as recorded: text (a plain str, not the template's Markup) and numbers."""
    return str(value) if isinstance(value, str) else value


_COMPARISONS = {"eq": "==", "ne": "!=", "gt": ">", "gteq": ">=", "lt": "<", "lteq": "<=", "in": "in",
                "notin": "not in"}


def describe(node: nodes.Node) -> str:
    """A short readable rendering of an expression (enough to recognise it next to its template line)."""
    if isinstance(node, nodes.Name):
        return node.name
    if isinstance(node, nodes.Const):
        return repr(node.value)
    if isinstance(node, nodes.Getattr):
        return f"{describe(node.node)}.{node.attr}"
    if isinstance(node, nodes.Getitem):
        return f"{describe(node.node)}[{describe(node.arg)}]"
    if isinstance(node, nodes.Call):
        args = ", ".join(describe(a) for a in node.args)
        return f"{describe(node.node)}({args})"
    if isinstance(node, nodes.Filter):
        args = f"({', '.join(describe(a) for a in node.args)})" if node.args else ""
        return f"{describe(node.node) if node.node is not None else ''}|{node.name}{args}"
    if isinstance(node, nodes.Test):
        return f"{describe(node.node)} is {node.name}"
    if isinstance(node, nodes.Not):
        return f"not {describe(node.node)}"
    if isinstance(node, (nodes.And, nodes.Or)):
        word = "and" if isinstance(node, nodes.And) else "or"

        def side(child: nodes.Node) -> str:
            # A nested and/or of the other kind keeps the template's grouping visible.
            nested = isinstance(child, (nodes.And, nodes.Or)) and type(child) is not type(node)
            return f"({describe(child)})" if nested else describe(child)

        return f"{side(node.left)} {word} {side(node.right)}"
    if isinstance(node, nodes.BinExpr):
        return f"{describe(node.left)} {node.operator} {describe(node.right)}"
    if isinstance(node, nodes.Compare):
        ops = " ".join(f"{_COMPARISONS.get(op.op, op.op)} {describe(op.expr)}" for op in node.ops)
        return f"{describe(node.expr)} {ops}"

    if isinstance(node, nodes.Concat):
        return " ~ ".join(describe(child) for child in node.nodes)
    if isinstance(node, nodes.CondExpr):
        return f"{describe(node.expr1)} if {describe(node.test)} else {describe(node.expr2) if node.expr2 else '…'}"
    if isinstance(node, nodes.Slice):
        return ":".join(describe(part) if part is not None else "" for part in (node.start, node.stop))
    if isinstance(node, nodes.TemplateData):
        return repr(node.data)
    return "…"


def _names(node: nodes.Node) -> frozenset[str]:
    """The variables an expression reads (itself included when it is one)."""
    return frozenset(n.name for n in [node, *node.find_all(nodes.Name)] if isinstance(n, nodes.Name))


def _max_line(node: nodes.Node) -> int:
    return max([getattr(node, "lineno", 0) or 0, *(_max_line(child) for child in node.iter_child_nodes())])


def _target_text(node: nodes.Node) -> str:
    """The variable an assignment sets, as the template writes it: `content`, `ns.last_user_index`, `a, b`."""
    if isinstance(node, nodes.NSRef):
        return f"{node.name}.{node.attr}"
    if isinstance(node, nodes.Name):
        return node.name
    if isinstance(node, nodes.Tuple):
        return ", ".join(_target_text(item) for item in node.items)
    return describe(node)


def _dotted_names(node: nodes.Node) -> frozenset[str]:
    """The variables an expression reads, `namespace` attributes as `ns.attr` besides `ns`."""
    dotted = {f"{n.node.name}.{n.attr}" for n in [node, *node.find_all(nodes.Getattr)]
              if isinstance(n, nodes.Getattr) and isinstance(n.node, nodes.Name)}
    return _names(node) | frozenset(dotted)


class _Rewriter(NodeTransformer, _Recording):
    def __init__(self, macros: dict[str, tuple[str, ...]] | None = None) -> None:
        _Recording.__init__(self)
        self._macros = macros or {}  # the template's own macros and their parameters

    def visit_Assign(self, node: nodes.Assign) -> nodes.Assign:
        read = set(_dotted_names(node.node))
        target_text = _target_text(node.target)
        for target in [node.target, *node.target.find_all(nodes.Name), *node.target.find_all(nodes.NSRef)]:
            if isinstance(target, (nodes.Name, nodes.NSRef)):
                self._assigned(_target_text(target), read, node.lineno)
        description = f"{{% set {target_text} = {describe(node.node)} %}}"
        node = self.generic_visit(node)
        ident = self._new("set", "set", node, description, target_text, end_line=_max_line(node.node),
                          names=frozenset(read))
        node.node = self._call("drift_set", nodes.Const(ident, lineno=node.lineno), node.node, lineno=node.lineno)
        return node

    @staticmethod
    def _call(function: str, ident: nodes.Const, value: nodes.Expr, *args: nodes.Expr, lineno: int) -> nodes.Filter:
        # A filter, not a call: filters are called directly, calls go through the sandbox's checks on every run.
        return nodes.Filter(value, function, [ident, *args], [], None, None, lineno=lineno)

    def _op(self, node: nodes.Expr, receiver: nodes.Expr, name: str, description: str, receiver_text: str
            ) -> nodes.Expr:
        ident = self._new("op", name, node, description, receiver_text)
        return self._call("drift_op", nodes.Const(ident, lineno=node.lineno), node, receiver, lineno=node.lineno)

    # Descriptions are taken before the children are rewritten, so they read as the template's own source.
    def visit_Filter(self, node: nodes.Filter) -> nodes.Expr:
        description = describe(node)
        receiver_text = describe(node.node) if node.node is not None else ""
        node = self.generic_visit(node)
        if node.name in TEXT_FILTERS and node.node is not None:
            return self._op(node, node.node, node.name, description, receiver_text)
        return node

    def visit_Getitem(self, node: nodes.Getitem) -> nodes.Expr:
        # `x.split('</think>')[-1]` is one construct: a piece of x, undone as x itself.
        call = node.node
        if (isinstance(call, nodes.Call) and isinstance(call.node, nodes.Getattr)
                and call.node.attr in ("split", "rsplit")):
            description, receiver_text = describe(node), describe(call.node.node)
            receiver = self.visit(call.node.node)
            call.node.node = receiver
            call.args = [self.visit(a) for a in call.args]
            node.arg = self.visit(node.arg)
            return self._op(node, receiver, call.node.attr, description, receiver_text)
        return self.generic_visit(node)

    def visit_Call(self, node: nodes.Call) -> nodes.Expr:
        description = describe(node)
        receiver_text = describe(node.node.node) if isinstance(node.node, nodes.Getattr) else ""
        arguments = [describe(a) for a in node.args]
        node = self.generic_visit(node)
        if isinstance(node.node, nodes.Getattr) and node.node.attr in STRING_METHODS:
            return self._op(node, node.node.node, node.node.attr, description, receiver_text)
        if isinstance(node.node, nodes.Name) and node.node.name in self._macros:
            # A macro's parameter is a binding made at the caller: `visible_text(message.content)` hands the model's
            # field to the macro, whose `{{ content }}` only prints it.
            parameters = self._macros[node.node.name]
            for i, argument in enumerate(node.args):
                parameter = parameters[i] if i < len(parameters) else f"#{i + 1}"
                ident = self._new("set", "argument", argument, f"{node.node.name}({parameter}={arguments[i]})",
                                  f"{node.node.name}({parameter})", end_line=_max_line(argument),
                                  names=_dotted_names(argument))
                node.args[i] = self._call("drift_set", nodes.Const(ident, lineno=argument.lineno), argument,
                                          lineno=argument.lineno)
        return node

    def visit_If(self, node: nodes.If) -> nodes.Node:
        description, names = f"{{% if {describe(node.test)} %}}", _names(node.test)
        node = self.generic_visit(node)
        branches = [*node.body, *node.elif_, *node.else_]
        end = max([node.lineno, *(_max_line(child) for child in branches)])
        ident = self._new("condition", "if", node, description, end_line=end, names=names)
        node.test = self._call("drift_if", nodes.Const(ident, lineno=node.lineno), node.test, lineno=node.lineno)
        return node

    def visit_CondExpr(self, node: nodes.CondExpr) -> nodes.Expr:
        description, names = f"… if {describe(node.test)} else …", _names(node.test)
        node = self.generic_visit(node)
        ident = self._new("condition", "if", node, description, end_line=_max_line(node), names=names)
        node.test = self._call("drift_if", nodes.Const(ident, lineno=node.lineno), node.test, lineno=node.lineno)
        return node

    def visit_Output(self, node: nodes.Output) -> nodes.Output:
        described = [describe(child) for child in node.nodes]
        node = self.generic_visit(node)
        wrapped: list[nodes.Expr] = []
        for child, description in zip(node.nodes, described):
            value = nodes.Const(child.data, lineno=child.lineno) if isinstance(child, nodes.TemplateData) else child
            # An output of a bare variable names it: what it prints was computed by a `set` above.
            variable = child.name if isinstance(child, nodes.Name) else ""
            ident = self._new("output", "output", child, description, variable, end_line=child.lineno,
                              names=frozenset({variable} - {""}))
            wrapped.append(self._call("drift_out", nodes.Const(ident, lineno=child.lineno), value,
                                      lineno=child.lineno))
        node.nodes = wrapped
        return node


def derived_names(names: frozenset[str], aliases: dict[str, frozenset[str]]) -> frozenset[str]:
    """`names` and every variable assigned (directly or through others) from one of them."""
    found = set(names)
    changed = True
    while changed:
        changed = False
        for target, read in aliases.items():
            if target not in found and read & found:
                found.add(target)
                changed = True
    return frozenset(found)


def _loop_index(frame, run: _Run) -> int | None:
    """`loop.index0` of the template's loop whose current item is the message being rendered, if that loop is one."""
    if frame is None:
        return None
    for value in frame.f_locals.values():
        if type(value) is LoopContext and id(value._current) in run.message_ids:
            return value.index0
    return None


def message_in_frame(frame, message_ids: dict[int, int]) -> int | None:
    """The message a compiled template's frame renders (`message_ids`: id of each message -> its index): the current
    item of a loop over the conversation's messages, else a local variable that is one of them (a macro's parameter, a
    loop variable), but not a variable of the template's top level (`{% set system_message = messages[0] %}` is not
    what the code around it renders)."""
    found = None
    for name, value in frame.f_locals.items():
        kind = type(value)
        if kind is LoopContext:
            index = message_ids.get(id(value._current))
            if index is not None:
                return index
        elif kind is dict and found is None and not name.startswith("l_0_"):
            found = message_ids.get(id(value))
    return found


def _message_in_locals(frame, run: _Run) -> int | None:
    return message_in_frame(frame, run.message_ids)


class InstrumentedTemplate:
    """A template compiled with every construct observable; `render` says which ran for which message."""

    def __init__(self, environment: jinja2.Environment, source: str) -> None:
        parsed = environment.parse(source)
        macros = {m.name: tuple(a.name for a in m.args) for m in parsed.find_all(nodes.Macro)}
        rewriter = _Rewriter(macros)
        tree = rewriter.visit(parsed)
        self.table = rewriter.table()
        self._local = threading.local()  # the web app renders from several threads
        self._filename = "<template>"  # what Jinja names the code it compiles
        self._message_of_frame: Callable[[object, _Run], int | None] = _message_in_locals
        environment = environment.overlay()
        # The overlay shares its parent's filter table: give it its own before adding ours.
        environment.filters = {**environment.filters,
                               "drift_op": lambda result, ident, value: self._op(ident, result, value),
                               "drift_if": lambda test, ident: self._if(ident, test),
                               "drift_out": lambda value, ident: self._out(ident, value),
                               "drift_set": lambda value, ident: self._set(ident, value)}
        self._template = environment.from_string(tree)

    def render(self, chat: list[dict], variables: dict, *, undo_from: int | None = None,
               undo: frozenset[int] = frozenset(), substitute: dict[int, dict[str, object]] | None = None
               ) -> tuple[str, list[Evaluation]]:
        """Render; the constructs in `undo` are undone, and an op in `substitute` gives the text instead of that
        result, while message `undo_from` or a later one is being rendered. Every construct's runs are recorded when
        nothing is changed (a trace); a changed render records nothing."""
        template = self._template

        def counted(pieces: Iterator[str]) -> Iterator[str]:
            # A trace counts what the template has put out when each construct runs (Evaluation.emitted): the root
            # render yields its output in order (a macro's or a block's when it is done, so a count is never ahead).
            run = self._local.run
            run.emitted = 0
            for piece in pieces:
                run.emitted += len(piece)
                yield piece

        def call() -> str:
            # Template.render without its traceback rewriting: a counterfactual that fails only needs to fail.
            pieces = template.root_render_func(template.new_context({"messages": chat, **variables}))
            return template.environment.concat(counted(pieces) if not undo and not substitute else pieces)

        return self.run(call, {id(m): i for i, m in enumerate(chat)}, undo_from=undo_from, undo=undo,
                        substitute=substitute)

    def run(self, call: Callable[[], str], message_ids: dict[int, int], *, undo_from: int | None = None,
            undo: frozenset[int] = frozenset(), substitute: dict[int, dict[str, object]] | None = None
            ) -> tuple[str, list[Evaluation]]:
        """`call` (which renders) with the constructs observed and changed as `render` says; `message_ids` maps what
        `_message_of_frame` reads off a frame to the conversation's message index."""
        substitute = dict(substitute or {})
        run = _Run(message_ids, undo_from, frozenset(undo) | frozenset(substitute), substitute,
                   record=not undo and not substitute, caller=sys._getframe())
        self._local.run = run
        try:
            text = call()
        finally:
            self._local.run = None
            run.caller = None
        return text, run.evaluations

    def _message(self, run: _Run) -> int:
        return self._message_frame(run)[0]

    def _message_frame(self, run: _Run) -> tuple[int, object]:
        """The message being rendered, and the template's frame that renders it (None: outside any message)."""
        frame = sys._getframe(1)
        caller = run.caller
        # Up to the frame that started the render (a construct outside any message would walk the whole stack).
        while frame is not None and frame is not caller:
            if frame.f_code.co_filename == self._filename:
                found = self._message_of_frame(frame, run)
                if found is not None:
                    return found, frame
            frame = frame.f_back
        return -1, None

    def _message_if_wanted(self, run: _Run, ident: int) -> int | None:
        # Finding the message walks the frames: only when this run records, or may undo this construct.
        if run.record or ident in run.undo:
            return self._message(run)
        return None

    def _undone(self, run: _Run, ident: int, message: int | None) -> bool:
        # undo_from -1: everywhere, outside any message too
        return (message is not None and run.undo_from is not None
                and (message >= run.undo_from or run.undo_from == -1) and ident in run.undo)

    def _op(self, ident: int, result: object, value: object) -> object:
        run = self._local.run
        if not run.record and ident not in run.undo:
            return result  # the common case of a counterfactual render: this construct is left as it is
        message = self._message_if_wanted(run, ident)
        if run.record:
            run.evaluations.append(Evaluation(ident, message, value, result, run.emitted))
        if not self._undone(run, ident, message):
            return result
        if ident in run.substitute:
            return run.substitute[ident].get(result, result) if isinstance(result, str) else result
        return value

    def _if(self, ident: int, test: object) -> object:
        run = self._local.run
        if not run.record and ident not in run.undo:
            return test
        message = self._message_if_wanted(run, ident)
        if run.record:
            run.evaluations.append(Evaluation(ident, message, bool(test), None, run.emitted))
        return (not test) if self._undone(run, ident, message) else test

    def _set(self, ident: int, value: object) -> object:
        run = getattr(self._local, "run", None)
        if run is None or (not run.record and ident not in run.substitute):
            return value  # an encoder's module-level assignments run outside any render
        if substitution_key(value) is None and not isinstance(value, float):
            return value  # a namespace, a list of messages: never compared nor substituted, not worth a frame walk
        message, frame = self._message_frame(run)
        if run.record:
            run.evaluations.append(Evaluation(ident, message, _recordable(value), _loop_index(frame, run),
                                                  run.emitted))
        replacements = run.substitute.get(ident)
        if replacements and self._undone(run, ident, message):
            key = substitution_key(value)
            if key is not None and key in replacements:
                return replacements[key]
        return value

    def _out(self, ident: int, value: object) -> object:
        run = self._local.run
        if not run.record and ident not in run.undo:
            return value
        message = self._message_if_wanted(run, ident)
        if run.record:
            run.evaluations.append(Evaluation(ident, message, value, None, run.emitted))
        if not self._undone(run, ident, message):
            return value
        if ident in run.substitute:
            return run.substitute[ident].get(value, value) if isinstance(value, str) else value
        return ""


class PythonRewriter(ast.NodeTransformer, _Recording):
    """The same rewrite for a Python encoder: string methods and `json.dumps`-like helpers (ops), `if` tests and
    conditional expressions (conditions), every `prompt += ...` (outputs) and every assignment (bindings)."""

    def __init__(self, functions: frozenset[str]) -> None:
        _Recording.__init__(self)
        self._functions = functions  # helpers whose call re-prints a value (e.g. to_json)

    def visit_Assign(self, node: ast.Assign) -> ast.Assign:
        read = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
        for target in node.targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    self._assigned(name.id, read, node.lineno)
        description = ast.unparse(node)
        targets = ", ".join(ast.unparse(t) for t in node.targets)
        node = self.generic_visit(node)
        ident = self._new("set", "set", node, description, targets, end_line=node.end_lineno, names=frozenset(read))
        node.value = self._call("drift_set", ast.Constant(ident), node.value, like=node.value)
        return node

    @staticmethod
    def _call(function: str, *args: ast.expr, like: ast.AST) -> ast.Call:
        call = ast.Call(ast.Name(function, ast.Load()), list(args), [])
        return ast.copy_location(call, like)

    def visit_Call(self, node: ast.Call) -> ast.expr:
        node = self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in STRING_METHODS:
            ident = self._new("op", func.attr, node, ast.unparse(node), ast.unparse(func.value))
            return self._call("drift_op", ast.Constant(ident), node, func.value, like=node)
        if isinstance(func, ast.Name) and func.id in self._functions and node.args:
            ident = self._new("op", func.id, node, ast.unparse(node), ast.unparse(node.args[0]))
            return self._call("drift_op", ast.Constant(ident), node, node.args[0], like=node)
        return node

    def visit_If(self, node: ast.If) -> ast.If:
        node = self.generic_visit(node)
        end = max(child.end_lineno or child.lineno for child in [*node.body, *node.orelse]) if node.orelse else \
            max(child.end_lineno or child.lineno for child in node.body)
        ident = self._new("condition", "if", node, f"if {ast.unparse(node.test)}:", end_line=end,
                          names=frozenset(n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)))
        node.test = self._call("drift_if", ast.Constant(ident), node.test, like=node.test)
        return node

    def visit_IfExp(self, node: ast.IfExp) -> ast.expr:
        node = self.generic_visit(node)
        ident = self._new("condition", "if", node, ast.unparse(node), end_line=node.end_lineno,
                          names=frozenset(n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)))
        node.test = self._call("drift_if", ast.Constant(ident), node.test, like=node.test)
        return node

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.AugAssign:
        description = ast.unparse(node)
        node = self.generic_visit(node)
        if isinstance(node.target, ast.Name) and node.target.id == "prompt" and isinstance(node.op, ast.Add):
            ident = self._new("output", "output", node, description, end_line=node.end_lineno)
            node.value = self._call("drift_out", ast.Constant(ident), node.value, like=node.value)
        elif isinstance(node.target, ast.Name) and isinstance(node.op, ast.Add):
            # `tc_content += '\n\n' + ...`: a binding of what is appended
            ident = self._new("set", "set", node, description, node.target.id, end_line=node.end_lineno,
                              names=frozenset(n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)))
            node.value = self._call("drift_set", ast.Constant(ident), node.value, like=node.value)
        return node


class InstrumentedModule(InstrumentedTemplate):
    """A Python encoder module executed with every construct observable (the same protocol as a template).

    `message_of_frame(frame)` says which conversation message a frame of the encoder is rendering, or None.
    """

    def __init__(self, source: str, filename: str, reprinting_functions: frozenset[str],
                 message_of_frame: Callable[[object, _Run], int | None]) -> None:
        rewriter = PythonRewriter(reprinting_functions)
        tree = ast.fix_missing_locations(rewriter.visit(ast.parse(source, filename)))
        self.table = rewriter.table()
        self._local = threading.local()
        self._filename = filename
        self._message_of_frame = message_of_frame
        self.namespace: dict = {"__name__": "drift_matrix_instrumented_encoder", "__file__": filename,
                                "drift_op": self._op, "drift_if": self._if, "drift_out": self._out,
                                "drift_set": self._set}
        exec(compile(tree, filename, "exec"), self.namespace)  # noqa: S102 - the pinned encoder, hash-checked
