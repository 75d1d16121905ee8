"""A small HTML builder that escapes everything it is given.

Text is escaped on the way in; only :class:`Markup` (what this module builds) is
kept as is. Pages are therefore safe by construction: a job name, error or
payload holding ``<script>`` renders as text.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
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
    return Markup(html.escape(str(value), quote=True))


def _children(items: Iterable[Child]) -> Iterable[str]:
    for item in items:
        if item is None or item is False:
            continue
        if isinstance(item, str | int | float):
            yield escape(item)
        else:
            yield from _children(item)


def el(tag: str, attrs: Mapping[str, object] | None = None, *children: Child) -> Markup:
    """``<tag attrs>children</tag>``. An attribute whose value is None or False is
    left out; True gives a bare attribute. Tag and attribute names come from code."""
    parts = [f"<{tag}"]
    for name, value in (attrs or {}).items():
        if value is None or value is False:
            continue
        if value is True:
            parts.append(f" {name}")
        else:
            parts.append(f' {name}="{escape(value)}"')
    parts.append(">")
    if tag in _VOID:
        return Markup("".join(parts))
    parts.extend(_children(children))
    parts.append(f"</{tag}>")
    return Markup("".join(parts))


def join(*children: Child) -> Markup:
    return Markup("".join(_children(children)))
