"""A small HTML builder that escapes everything it is given.

Text is escaped on the way in; only :class:`Markup` (what this module builds) is
kept as is. Pages are therefore safe by construction: a job name, error or
payload holding ``<script>`` renders as text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from html import escape as _escape
from typing import Union

#: Elements with no closing tag.
_VOID = frozenset({"br", "hr", "img", "input", "link", "meta"})


class Markup(str):
    """HTML built by this module: safe to concatenate without escaping again."""

    __slots__ = ()


Child = Union[Markup, str, int, float, None, Iterable["Child"]]  # noqa: UP007 (recursive)


def escape(value: object) -> Markup:
    if isinstance(value, Markup):
        return value
    return Markup(_escape(str(value), quote=True))


def _append(out: list[str], item: Child) -> None:
    if item is None or item is False:
        return
    if isinstance(item, Markup):
        out.append(item)
    elif isinstance(item, str):
        out.append(_escape(item, quote=True))
    elif isinstance(item, int | float):
        out.append(str(item))  # digits, a sign, a dot: nothing to escape
    else:
        for child in item:
            _append(out, child)


def el(tag: str, attrs: Mapping[str, object] | None = None, *children: Child) -> Markup:
    """``<tag attrs>children</tag>``. An attribute whose value is None or False is
    left out; True gives a bare attribute. Tag and attribute names come from code."""
    out = ["<", tag]
    if attrs:
        for name, value in attrs.items():
            if value is None or value is False:
                continue
            if value is True:
                out.append(f" {name}")
            else:
                out.append(f' {name}="{escape(value)}"')
    out.append(">")
    if tag in _VOID:
        return Markup("".join(out))
    for child in children:
        _append(out, child)
    out.append(f"</{tag}>")
    return Markup("".join(out))


def join(*children: Child) -> Markup:
    out: list[str] = []
    for child in children:
        _append(out, child)
    return Markup("".join(out))
