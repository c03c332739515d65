"""What a config dataclass's validators allow, read from their source with :mod:`ast`.

:func:`rules_of` walks the ``__post_init__`` and ``from_dict`` of a section's dataclass,
and the helpers of the config package they call (:func:`_walk`), and reads every
``check_int``, ``check_float``, ``check_choice``, ``check_list``, ``check_text`` and
``_int_list`` call (with its bounds) and every ``SpecError`` whose message does not
depend on the value, as text for ``docs/study-files.md``
(:mod:`autotune.cli.docgen`). A bound is evaluated in the validator's module, with the
variables of the literal ``for`` loops around the call bound (``for name, top in (("tp",
MAX_DEGREE), ...)``); what reads a local instead (``self.x``, a comprehension's variable)
is shown as its source text, never raised.
"""

from __future__ import annotations

import ast
import copy
import inspect
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from autotune.config._fields import MAX_LIST_ITEMS, check_text

__all__ = ["Rules", "rules_of", "yaml_text"]


@dataclass
class Rules:
    """What a dataclass's validators say about each of its keys."""

    allowed: dict[str, list[str]] = field(default_factory=dict)
    required: dict[str, str] = field(default_factory=dict)
    """Key path -> the loader's words (``required when launcher.kind is 'replay'``)."""

    int_ranges: dict[tuple[str, bool], tuple[str, tuple[Any, Any]]] = field(
        default_factory=dict)
    """(path, item) -> the text and (minimum, maximum) of its integer rule so far."""

    def add(self, path: str, text: str) -> None:
        texts = self.allowed.setdefault(path, [])
        if text not in texts:
            texts.append(text)

    def add_int(self, path: str, item: bool, minimum: Any, maximum: Any) -> None:
        """An integer range; two checks of one key (a reader's and a cross-field rule's)
        both hold, so they show as one range, the tighter bound of each side."""
        key = (path, item)
        if key in self.int_ranges:
            old, (lo, hi) = self.int_ranges.pop(key)
            self.allowed[path].remove(old)
            minimum = _tighter(lo, minimum, max)
            maximum = _tighter(hi, maximum, min)
        text = f"{'each item ' if item else ''}an integer {_bounds(minimum, maximum)}"
        self.int_ranges[key] = (text, (minimum, maximum))
        self.add(path, text)


def _tighter(a: Any, b: Any, pick: Any) -> Any:
    """``pick(a, b)`` of two bounds, where both are numbers; the one that is, else ``a``."""
    numbers = [v for v in (a, b) if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return pick(numbers) if len(numbers) == 2 else (numbers[0] if numbers else a)


_VALIDATORS = {"check_int", "check_float", "check_choice", "check_list", "check_text",
               "_int_list", "SpecError"}
"""The calls :func:`_rule` reads (no other call's arguments are evaluated)."""
_TEXT_CHARS = inspect.signature(check_text).parameters["max_chars"].default
"""``check_text``'s default length limit."""


def rules_of(cls: type) -> Rules:
    """The constraints ``cls``'s validators state, by key path: every ``check_int``,
    ``check_float``, ``check_choice``, ``check_list``, ``check_text`` and ``_int_list`` call
    and every ``SpecError`` with a fixed message in its ``__post_init__`` and ``from_dict``
    (loops over literal tuples expanded, one pass per item; an f-string key such as
    ``f"search.zero_stage[{i}]"`` names each item)."""
    rules = Rules()
    for name in ("__post_init__", "from_dict"):
        fn = cls.__dict__.get(name)
        if fn is not None:
            _walk(getattr(fn, "__func__", fn), {}, rules, ())
    return rules


_HELPER_DEPTH = 2
"""How deep :func:`_walk` follows the config package's own helpers (``__post_init__`` ->
``check_strategy_axes``; ``from_dict`` -> ``parse_strategy_axes`` -> ``_ints``)."""


def _walk(fn: Any, env: dict[str, Any], rules: Rules, stack: tuple[Any, ...]) -> None:
    """Read the rules of ``fn``'s validator calls, and of the helpers it calls that are
    defined in :mod:`autotune.config` (a validator may sit in a helper module of a
    section, e.g. :mod:`autotune.config._strategy_axes`), each with the parameters its
    call binds to values (``max_degree=MAX_DEGREE``, a field name) in ``env``. ``stack``:
    the helpers walked into so far (no recursion)."""
    namespace = vars(sys.modules[fn.__module__])
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    for node, loop_env in _calls(tree, env, namespace):
        scope = {**namespace, **loop_env}
        _rule(node, scope, rules)
        helper = scope.get(node.func.id) if isinstance(node.func, ast.Name) else None
        if (len(stack) < _HELPER_DEPTH and inspect.isfunction(helper)
                and helper is not fn and helper not in stack
                and helper.__name__ not in _VALIDATORS
                and helper.__module__.startswith("autotune.config")):
            _walk(helper, _arguments(helper, node, scope), rules, (*stack, fn))


def _arguments(fn: Any, call: ast.Call, scope: dict[str, Any]) -> dict[str, Any]:
    """The parameters of ``fn`` that ``call`` binds to a value readable in ``scope`` (a
    literal, a constant, a bound parameter); the others stay unbound (read as source)."""
    args = [_value(a, scope) for a in call.args if not isinstance(a, ast.Starred)]
    kwargs = {k.arg: _value(k.value, scope) for k in call.keywords if k.arg}
    try:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs).arguments
    except TypeError:
        return {}
    return {k: v for k, v in bound.items() if not isinstance(v, _Source)}


def _calls(node: ast.AST, env: dict[str, Any], namespace: dict[str, Any]
           ) -> Iterator[tuple[ast.Call, dict[str, Any]]]:
    """Every call under ``node`` with the loop variables bound around it: the body of a
    ``for`` over a literal tuple or list (``for key, top in (("tp", MAX_DEGREE), ...)``)
    is walked once per item, its variables bound to the item's values."""
    if (isinstance(node, ast.For) and isinstance(node.iter, (ast.Tuple, ast.List))
            and (names := _target_names(node.target)) is not None):
        items = _value(node.iter, {**namespace, **env})
        bindings = [] if isinstance(items, _Source) else [_bind(names, i) for i in items]
        if bindings and None not in bindings:
            for bound in bindings:
                for stmt in node.body:
                    yield from _calls(stmt, {**env, **(bound or {})}, namespace)
            for stmt in node.orelse:
                yield from _calls(stmt, env, namespace)
            return
    if isinstance(node, ast.Call):
        yield node, env
    for child in ast.iter_child_nodes(node):
        yield from _calls(child, env, namespace)


def _target_names(target: ast.expr) -> list[str] | str | None:
    """A ``for`` target as a name or a flat list of names (``None``: anything else)."""
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
        return [e.id for e in target.elts if isinstance(e, ast.Name)]
    return None


def _bind(names: list[str] | str, item: Any) -> dict[str, Any] | None:
    """The loop variables ``names`` bound to one ``item`` (``None`` if it does not unpack)."""
    if isinstance(names, str):
        return {names: item}
    if not isinstance(item, (tuple, list)) or len(item) != len(names):
        return None
    return dict(zip(names, item, strict=True))


def _paths(node: ast.expr, scope: dict[str, Any]) -> list[tuple[str, bool]]:
    """The key paths a validator's first argument names, each with whether it is an item
    of a list (``[...]``); empty when it cannot be read. An f-string's fields are
    evaluated in ``scope`` (module constants and loop variables); one that cannot be ends
    the path: after ``[`` it is an item, after ``.`` every key of the section."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [(node.value, False)]
    if isinstance(node, ast.Name) and isinstance(scope.get(node.id), str):
        return [(scope[node.id], False)]  # a helper's parameter bound to a field name
    if not isinstance(node, ast.JoinedStr) or not node.values:
        return []
    text = ""
    for part in node.values:
        if isinstance(part, ast.Constant):
            text += str(part.value)
            continue
        value = (_value(part.value, scope) if isinstance(part, ast.FormattedValue)
                 else _Source(""))
        if not isinstance(value, _Source):
            text += str(value)
        elif text.endswith("["):
            return [(text[:-1], True)]
        elif text.endswith("."):
            return [(text + "*", False)]  # every key of the section
        else:
            return []
    return [(text, False)]


def _rule(call: ast.Call, scope: dict[str, Any], rules: Rules) -> None:
    fn = call.func.id if isinstance(call.func, ast.Name) else None
    if fn not in _VALIDATORS or not call.args:
        return
    kwargs = {k.arg: _value(k.value, scope) for k in call.keywords if k.arg}
    text = None
    if fn == "check_int":
        for path, item in _paths(call.args[0], scope):
            rules.add_int(path, item, kwargs.get("minimum", 1), kwargs.get("maximum"))
        return
    elif fn == "check_float":
        text = "a number " + _bounds(kwargs.get("minimum", 0.0), kwargs.get("maximum"),
                                     strict=kwargs.get("strict") is True)
    elif fn == "check_choice" and len(call.args) == 3:
        choices = _value(call.args[2], scope)
        text = ("one of " + ", ".join(f"`{yaml_text(c)}`" for c in choices)
                if not isinstance(choices, _Source) else f"one of `{choices}`")
    elif fn == "check_list":
        text = f"a non-empty list of at most {_number(kwargs.get('maximum', MAX_LIST_ITEMS))} " \
               "entries"
    elif fn == "check_text":
        text = ("one line of printable text of at most "
                f"{_number(kwargs.get('max_chars', _TEXT_CHARS))} characters")
    elif fn == "_int_list":
        text = (f"a list of at most {_number(MAX_LIST_ITEMS)} integers "
                f"{_bounds(kwargs.get('minimum', 1), kwargs.get('maximum'))}")
        if kwargs.get("allow_auto", True):
            text += ", or `auto`"
    elif fn == "SpecError" and len(call.args) == 3:
        message = _fixed_text(call.args[2], scope)
        if message is None:
            return
        for path, _ in _paths(call.args[0], scope):
            if message.startswith("required"):
                rules.required[path] = ("required" if message.startswith("required:")
                                        else message.replace("'", "`"))
            elif message.startswith("allowed: "):
                rules.add(path, message.removeprefix("allowed: "))
        return
    if text is None:
        return
    for path, item in _paths(call.args[0], scope):
        rules.add(path, f"each item {text}" if item else text)


class _Source(str):
    """The source text of an expression that cannot be evaluated where it is documented
    (it reads a local, e.g. ``MAX_LINK_GBPS if k.endswith("gbps") else ...``)."""


def _value(node: ast.expr, scope: dict[str, Any]) -> Any:
    """An argument of a validator call in our own source (a literal, a module constant
    such as ``ZERO_STAGES``, a loop variable), evaluated in ``scope``. What cannot be
    evaluated (it reads a local) is its :class:`_Source`, with the parts that can be
    replaced by their values; a conditional whose branches agree is that value."""
    try:
        return _eval(node, scope)
    except Exception:  # a local (NameError) or anything else: shown as its source
        if isinstance(node, ast.IfExp):
            body, orelse = _value(node.body, scope), _value(node.orelse, scope)
            if not isinstance(body, _Source) and type(body) is type(orelse) \
                    and body == orelse:
                return body
        return _Source(ast.unparse(_Fold(scope).visit(copy.deepcopy(node))))


def _eval(node: ast.expr, scope: dict[str, Any]) -> Any:
    return eval(compile(ast.Expression(node), "<docgen>", "eval"), dict(scope))


class _Fold(ast.NodeTransformer):
    """Replace each name, attribute or subscript with a plain value in ``scope`` by that
    value (``MAX_NODES`` -> ``100000``), for :class:`_Source` text a reader can use."""

    def __init__(self, scope: dict[str, Any]) -> None:
        self.scope = scope

    def _fold(self, node: ast.expr) -> ast.expr:
        try:
            value = _eval(node, self.scope)
        except Exception:  # not foldable: keep it, fold what is inside
            return self.generic_visit(node)  # type: ignore[return-value]
        if value is None or isinstance(value, (bool, int, float, str)):
            return ast.copy_location(ast.Constant(value), node)
        return self.generic_visit(node)  # type: ignore[return-value]

    visit_Name = visit_Attribute = visit_Subscript = _fold


def _number(value: Any) -> str:
    """A bound as the reference shows it: ``100000``, ``0.9``, ``1000000`` (not ``1e+06``);
    an expression docgen could not evaluate as code."""
    if isinstance(value, _Source):
        return f"`{value}`"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _bounds(minimum: Any, maximum: Any, *, strict: bool = False) -> str:
    """``>= 1``, ``> 0 and <= 1000000``: a validator's range."""
    text = f"{'>' if strict else '>='} {_number(minimum)}"
    return text if maximum is None else f"{text} and <= {_number(maximum)}"


def _fixed_text(node: ast.expr, scope: dict[str, Any]) -> str | None:
    """A message that does not depend on the value: a literal, or an f-string whose only
    fields are ``X={self.X}`` (read as ``X``) and module constants (``{MAX_N_TRIALS}``,
    read as their value)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if not isinstance(node, ast.JoinedStr):
        return None
    out = ""
    for part in node.values:
        if isinstance(part, ast.Constant):
            out += str(part.value)
        elif (isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Attribute)
              and isinstance(part.value.value, ast.Name) and part.value.value.id == "self"
              and out.endswith(part.value.attr + "=")):
            out = out[:-1]
        elif (isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name)
              and part.format_spec is None and part.value.id in scope):
            out += _number(scope[part.value.id])
        else:
            return None
    return out


def yaml_text(value: Any) -> str:
    """``value`` as a study file would spell it (``null``, ``true``, ``[0, 1]``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(yaml_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_text(v)}" for k, v in value.items()) + "}"
    if value == "":
        return '""'
    return str(value)
