"""A function's own source, specialised to one config: what fastlab.code prints of fastlab.training.

With libcst (a concrete syntax tree: comments and layout survive the rewrite):
- each `cfg.<knob>` becomes its value, and expressions of constants only are folded;
- an `if` whose test is now constant keeps only the branch taken (its comment moves onto that branch's first line);
- a name given a constant once and never again is replaced by it; an argument left at its default is dropped;
- the watch touches go: `w(batches)` is `batches`, `w.step_done(...)` goes, `w.paused()` blocks are their body;
- the parameters only the harness passes are dropped, each replaced by the value a plain script has;
- a comment that names what was removed from its statement (a dropped argument's keyword, the watch) goes with it,
  and a name assigned a constant that nothing reads any more goes too.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import json
import textwrap
from collections.abc import Callable, Mapping
from typing import Any

import libcst as cst

FOLDABLE = (ast.Expression, ast.Constant, ast.Compare, ast.BoolOp, ast.UnaryOp, ast.BinOp, ast.IfExp, ast.Tuple,
            ast.List, ast.Dict, ast.Subscript, ast.Load, ast.cmpop, ast.boolop, ast.unaryop, ast.operator)
SECTION = "# ----"  # a section's title comment: dropped with its section when nothing of it is left
# keyword arguments whose value equals the callee's default: the line reads as a person writes it without them
DEFAULTS = {"non_blocking": False, "pin_memory": False, "sampler": None, "enabled": True, "num_workers": 0,
            "persistent_workers": False, "prefetch_factor": None, "channels_last": False,
            "set_to_none": True}
# the names in these fields are not values: a keyword, an attribute, an assignment's target, a parameter
_NOT_VALUES = {cst.Arg: "keyword", cst.Attribute: "attr", cst.AssignTarget: "target", cst.AnnAssign: "target",
               cst.AugAssign: "target", cst.Param: "name", cst.FunctionDef: "name", cst.AsName: "name"}


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _constant(node: cst.BaseExpression) -> tuple[bool, Any]:
    """(True, value) when node is an expression of constants only (and so can be folded)."""
    with contextlib.suppress(Exception):  # not an expression alone, or one that fails (1 / 0)
        tree = ast.parse(_code(node).strip(), mode="eval")
        if all(isinstance(n, FOLDABLE) for n in ast.walk(tree)):
            return True, eval(compile(tree, "<fold>", "eval"), {"__builtins__": {}}, {})  # noqa: S307 (constants only)
    return False, None


def _literal(value: Any) -> cst.BaseExpression:
    return cst.parse_expression(json.dumps(value) if isinstance(value, str) else repr(value))  # "double quotes"


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


class Specialise(cst.CSTTransformer):
    """One pass of the rewrite (see the module's text); run it until the text stops changing."""

    def __init__(self, cfg: Any, known: Mapping[str, str], calls: Mapping[str, Callable[[Any], str]],
                 drop_params: set[str], constants: Mapping[str, Any], unread: set[str] = frozenset()) -> None:
        self.cfg, self.known, self.calls, self.drop_params = cfg, known, calls, drop_params
        self.constants, self.unread = constants, unread
        self.elifs: set[int] = set()  # If nodes in an elif's place
        self.pending: list[list[cst.EmptyLine]] = [[]]  # per block: comment lines of removed statements
        self.protected: set[int] = set()  # ids of the names in _NOT_VALUES' fields
        self.removed: list[set[str]] = []  # per statement being rewritten: the words naming what left it

    def on_visit(self, node: cst.CSTNode) -> bool:
        name = getattr(node, _NOT_VALUES.get(type(node), ""), None)
        if isinstance(name, cst.Name):
            self.protected.add(id(name))
        return super().on_visit(node)

    # ---- values
    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        if isinstance(updated.value, cst.Name) and updated.value.value == "cfg":
            return _literal(getattr(self.cfg, updated.attr.value))
        if isinstance(updated.value, cst.Name) and updated.value.value == "p" and updated.attr.value == "accuracy":
            return cst.Name("accuracy")
        return updated

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        if id(original) in self.protected:
            return updated
        if updated.value in self.known:
            return cst.parse_expression(self.known[updated.value])
        if updated.value in self.constants:
            return _literal(self.constants[updated.value])
        return updated

    def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript) -> cst.BaseExpression:
        if _code(updated) in self.known:  # AMP_DTYPES["bf16"]: torch.bfloat16
            return cst.parse_expression(self.known[_code(updated)])
        return self._fold(updated)

    def leave_Comparison(self, original: cst.CSTNode, updated: cst.BaseExpression) -> cst.BaseExpression:
        return self._fold(updated)

    leave_UnaryOperation = leave_Comparison

    def leave_BinaryOperation(self, original: cst.BinaryOperation,
                              updated: cst.BinaryOperation) -> cst.BaseExpression:
        ok, right = _constant(updated.right)
        if ok and right == 1 and isinstance(updated.operator, (cst.Divide, cst.Multiply)):
            atom = isinstance(updated.left, (cst.Name, cst.Attribute, cst.Call, cst.Subscript))
            return updated.left if atom else updated.left.with_changes(lpar=updated.lpar, rpar=updated.rpar)
        if ok and right == 1 and isinstance(updated.operator, cst.Modulo):
            return cst.Integer("0")
        return self._fold(updated)

    def leave_BooleanOperation(self, original: cst.BooleanOperation,
                               updated: cst.BooleanOperation) -> cst.BaseExpression:
        ok, left = _constant(updated.left)
        is_and = isinstance(updated.operator, cst.And)
        if ok:  # `False and x` is False, `True and x` is x (and the same for or)
            return updated.right if bool(left) == is_and else _literal(left)
        ok, right = _constant(updated.right)
        if ok and bool(right) == is_and:  # `x and True` is x, `x or False` is x
            return updated.left
        return updated

    def leave_IfExp(self, original: cst.IfExp, updated: cst.IfExp) -> cst.BaseExpression:
        ok, test = _constant(updated.test)
        return (updated.body if test else updated.orelse) if ok else updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        func = _code(updated.func)
        if _code(updated) in self.known:  # isinstance(data, tuple): what it is in a plain script
            return cst.parse_expression(self.known[_code(updated)])
        if func == "w" and len(updated.args) == 1:  # w(batches): the batches themselves
            self._removed("watch")
            return updated.args[0].value
        if func in self.calls and len(updated.args) == 1:
            ok, value = _constant(updated.args[0].value)
            if ok:
                return cst.parse_expression(self.calls[func](value))
        args: list[cst.Arg] = []
        for arg in updated.args:
            if not self._default(arg):
                args.append(arg)
            elif args and _breaks(arg.comma) and not _breaks(args[-1].comma):  # the line break stays, not its comment
                after = arg.comma.whitespace_after
                args[-1] = args[-1].with_changes(comma=args[-1].comma.with_changes(whitespace_after=after.with_changes(
                    first_line=cst.TrailingWhitespace())))
        if len(args) != len(updated.args):
            kept = {id(a) for a in args}
            self._removed(*(a.keyword.value for a in updated.args if id(a) not in kept and a.keyword is not None))
            if args:
                args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return updated.with_changes(args=args)
        return updated

    def _removed(self, *words: str) -> None:
        if self.removed:
            self.removed[-1].update(words)

    def _statement(self, node: cst.CSTNode) -> None:
        self.removed.append(set())

    visit_SimpleStatementLine = visit_For = visit_With = visit_While = _statement

    def _without_stale_comments(self, node: Any) -> Any:
        """node (a statement just left) without the comments that name what was removed from it."""
        words = self.removed.pop()
        if not words or not isinstance(node, cst.CSTNode):
            return node

        def stale(comment: cst.Comment | None) -> bool:
            return comment is not None and any(w in comment.value for w in words)

        changes: dict[str, Any] = {}
        lines = list(getattr(node, "leading_lines", ()))
        blocks: list[list[cst.EmptyLine]] = []  # a comment running over several lines is one comment
        for line in lines:
            if blocks and line.comment is not None and blocks[-1][-1].comment is not None:
                blocks[-1].append(line)
            else:
                blocks.append([line])
        if any(stale(line.comment) for line in lines):
            changes["leading_lines"] = [line for block in blocks if not any(stale(x.comment) for x in block)
                                        for line in block]
        trailing = getattr(node, "trailing_whitespace", None)
        if trailing is not None and stale(trailing.comment):
            changes["trailing_whitespace"] = trailing.with_changes(comment=None, whitespace=cst.SimpleWhitespace(""))
        body = getattr(node, "body", None)
        if isinstance(body, cst.IndentedBlock) and stale(body.header.comment):
            changes["body"] = body.with_changes(header=body.header.with_changes(
                comment=None, whitespace=cst.SimpleWhitespace("")))
        return node.with_changes(**changes) if changes else node

    def _default(self, arg: cst.Arg) -> bool:
        if isinstance(arg.value, cst.Name) and arg.value.value == "cfg" and arg.keyword is None:
            return True  # evaluate(cfg, ...): the script's functions are specialised, they take no config
        if arg.star == "**":
            return _constant(arg.value) == (True, {})
        if arg.keyword is None or arg.keyword.value not in DEFAULTS:
            return False
        ok, value = _constant(arg.value)
        return ok and value == DEFAULTS[arg.keyword.value] and type(value) is type(DEFAULTS[arg.keyword.value])

    def _fold(self, node: cst.BaseExpression) -> cst.BaseExpression:
        ok, value = _constant(node)
        return _literal(value) if ok and _scalar(value) else node

    # ---- statements: a removed statement's comment lines go onto the next statement of its block
    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self.pending.append([])

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        self.pending.pop()
        return updated

    def _emit(self, result: Any, removed: cst.CSTNode | None = None) -> Any:
        """result in place of a statement; a removed statement's comment lines wait for the next one."""
        pending = self.pending[-1]
        if result is cst.RemovalSentinel.REMOVE:
            lines = list(getattr(removed, "leading_lines", ()))
            if any(_title(line) for line in lines):  # a new section began: the one before it is empty
                pending[:] = [line for line in pending if not _title(line)]
            pending.extend(lines)
            return result
        if not pending:
            return result
        carried = list(pending)
        pending.clear()
        first_lines = (list(result.nodes)[0] if isinstance(result, cst.FlattenSentinel) else result).leading_lines
        if any(_title(line) for line in first_lines):
            carried = [line for line in carried if not _title(line)]  # an empty section's title
        carried = [line for i, line in enumerate(carried)  # one blank line at most
                   if line.comment is not None or i == 0 or carried[i - 1].comment is not None]
        if carried and first_lines and carried[-1].comment is None and first_lines[0].comment is None:
            carried = carried[:-1]
        if isinstance(result, cst.FlattenSentinel):
            first, *rest = list(result.nodes)
            return cst.FlattenSentinel([first.with_changes(leading_lines=[*carried, *first.leading_lines]), *rest])
        return result.with_changes(leading_lines=[*carried, *result.leading_lines])

    def leave_For(self, original: cst.For, updated: cst.For) -> Any:
        return self._emit(self._without_stale_comments(updated))

    def leave_While(self, original: cst.While, updated: cst.While) -> Any:
        return self._without_stale_comments(updated)

    def visit_If(self, node: cst.If) -> None:
        if isinstance(node.orelse, cst.If):
            self.elifs.add(id(node.orelse))

    def leave_If(self, original: cst.If, updated: cst.If) -> Any:
        ok, test = _constant(updated.test)
        if not ok:
            return updated if id(original) in self.elifs else self._emit(updated)
        if id(original) in self.elifs:  # an elif: it becomes the else, or what follows it
            if test:
                return cst.Else(body=updated.body, leading_lines=updated.leading_lines)
            return updated.orelse if updated.orelse is not None else cst.RemovalSentinel.REMOVE
        if test:
            return self._emit(_with_comment(updated.body, updated.leading_lines))
        if updated.orelse is None:
            return self._emit(cst.RemovalSentinel.REMOVE, updated)
        if isinstance(updated.orelse, cst.If):
            return self._emit(updated.orelse.with_changes(leading_lines=updated.leading_lines))
        return self._emit(_with_comment(updated.orelse.body, updated.leading_lines))

    def leave_With(self, original: cst.With, updated: cst.With) -> Any:
        updated = self._without_stale_comments(updated)
        items = []
        for item in updated.items:
            call = item.item
            if isinstance(call, cst.Call) and _code(call.func) in ("w.paused", "w.step"):
                continue  # the watch's block: its body stays
            if isinstance(call, cst.Call) and any(a.keyword is not None and a.keyword.value == "enabled"
                                                  and _constant(a.value) == (True, False) for a in call.args):
                continue  # a context switched off (autocast with enabled=False): the body runs without it
            items.append(item)
        if len(items) == len(updated.items):
            return self._emit(updated)
        if not items:  # the header's comment spoke of what is gone
            return self._emit(_with_comment(updated.body, updated.leading_lines, keep_comment=False))
        items[-1] = items[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return self._emit(updated.with_changes(items=items))

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine) -> Any:
        updated = self._without_stale_comments(updated)
        first = original.body[0]
        watch = isinstance(first, cst.Expr) and isinstance(first.value, cst.Call) and _code(first.value.func)[:2] == "w."
        target = first.targets[0].target if isinstance(first, cst.Assign) and len(first.targets) == 1 else (
            first.target if isinstance(first, cst.AnnAssign) else None)
        # w.step_done(...), a constant's assignment (its value is written where it is used), or one nothing reads
        constant = isinstance(target, cst.Name) and (target.value in self.constants or target.value in self.unread)
        return self._emit(cst.RemovalSentinel.REMOVE, updated) if watch or constant else self._emit(updated)

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        params = updated.params
        kept = [p for p in params.params if p.name.value not in self.drop_params]
        kwonly = [p for p in params.kwonly_params if p.name.value not in self.drop_params]
        if kept:
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        star = params.star_arg if kwonly else cst.MaybeSentinel.DEFAULT
        body = updated.body
        if body.body and _is_docstring(body.body[0]):
            body = body.with_changes(body=body.body[1:])  # the docstring speaks of the harness's parameters
        return updated.with_changes(params=params.with_changes(params=kept, kwonly_params=kwonly, star_arg=star),
                                    body=body)


def _breaks(comma: Any) -> bool:
    """Whether a comma is followed by a line break."""
    return isinstance(comma, cst.Comma) and isinstance(comma.whitespace_after, cst.ParenthesizedWhitespace)


def _title(line: cst.EmptyLine) -> bool:
    return line.comment is not None and line.comment.value.startswith(SECTION)


def _is_docstring(statement: cst.BaseStatement) -> bool:
    return (isinstance(statement, cst.SimpleStatementLine) and isinstance(statement.body[0], cst.Expr)
            and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


def _with_comment(block: cst.BaseSuite, leading: Any, keep_comment: bool = True) -> Any:
    """A block's statements in place of the compound statement that held them, the header's comment above them."""
    statements = list(block.body)
    if not statements:
        return cst.RemovalSentinel.REMOVE
    comment = block.header.comment if isinstance(block, cst.IndentedBlock) and keep_comment else None
    lines = list(leading)
    if comment is not None:
        lines.append(cst.EmptyLine(comment=comment))
    if isinstance(block, cst.SimpleStatementSuite):  # `if x: y` on one line
        statements = [cst.SimpleStatementLine(body=list(block.body))]
    first = statements[0]
    statements[0] = first.with_changes(leading_lines=[*lines, *first.leading_lines])
    return cst.FlattenSentinel(statements)


class _Assignments(cst.CSTVisitor):
    """Names assigned in a function: how often, the value of an assignment of None, a bool or {}, and the names
    changed in place (x[k] = ..., x.append(...)), which {} cannot stand for."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.value: dict[str, Any] = {}
        self.mutated: set[str] = set()
        self.constant_assigned: set[str] = set()  # names assigned an expression of constants
        self.mentions: dict[str, int] = {}  # every Name node of that name: its assignments, reads, attributes...

    def visit_Name(self, node: cst.Name) -> None:
        self.mentions[node.value] = self.mentions.get(node.value, 0) + 1

    def unread(self) -> set[str]:
        """Names assigned a constant once and never mentioned anywhere else: nothing reads them."""
        return {n for n in self.constant_assigned if self.count.get(n) == 1 and self.mentions.get(n) == 1}

    def _assigned(self, target: cst.CSTNode, value: cst.BaseExpression | None = None) -> None:
        for name in _names(target):
            self.count[name] = self.count.get(name, 0) + 1
        ok, constant = _constant(value) if value is not None else (False, None)
        if isinstance(target, cst.Name) and ok:
            self.constant_assigned.add(target.value)
        if isinstance(target, cst.Name) and ok and (constant is None or isinstance(constant, bool) or constant == {}):
            self.value[target.value] = constant

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if isinstance(target.target, cst.Subscript) and isinstance(target.target.value, cst.Name):
                self.mutated.add(target.target.value.value)
            self._assigned(target.target, node.value if len(node.targets) == 1 else None)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._assigned(node.target, node.value)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._assigned(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._assigned(node.target)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if isinstance(node.value, cst.Name):
            self.mutated.add(node.value.value)


def _names(node: cst.CSTNode) -> list[str]:
    if isinstance(node, cst.Name):
        return [node.value]
    if isinstance(node, cst.Tuple):
        return [n for e in node.elements for n in _names(e.value)]
    return []


def specialise(fn: Callable[..., Any], cfg: Any, *, known: Mapping[str, str] | None = None,
               calls: Mapping[str, Callable[[Any], str]] | None = None, drop_params: set[str] | None = None) -> str:
    """fn's source specialised to cfg. known: expression -> what it is in a plain script; calls: a function of one
    constant argument -> the code its call becomes."""
    module = cst.parse_module(textwrap.dedent(inspect.getsource(fn)))
    drop = set(drop_params or ()) | {"cfg", "w"}
    constants: dict[str, Any] = {}
    unread: set[str] = set()
    for _ in range(10):  # until nothing changes: a folded test may make a name constant, and so on
        before = module.code
        module = module.visit(Specialise(cfg, known or {}, calls or {}, drop, constants, unread))
        seen = _Assignments()
        module.visit(seen)
        # None, True, False and {} only: a number or a string keeps its name (total_steps reads better than 65)
        constants = {name: value for name, value in seen.value.items()
                     if seen.count[name] == 1 and not (value == {} and name in seen.mutated)}
        unread = seen.unread()
        if module.code == before and not constants and not unread:
            break
    return module.code.rstrip() + "\n"
