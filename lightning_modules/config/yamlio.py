"""The one YAML dialect of ablate, read and written: what a person (and a YAML 1.2 reader) means,
and what reads back the same. PyYAML's own loader and dumper are left as they are."""

from __future__ import annotations

import re
from collections.abc import Hashable
from typing import Any, TypeAlias

import yaml

Json: TypeAlias = dict[str, "Json"] | list["Json"] | str | int | float | bool | None
"""A parsed YAML (or JSON) value: a mapping, a list or a scalar."""


class YamlLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no type hints
    """PyYAML's SafeLoader, reading what a person (and a YAML 1.2 reader) means:

    * a key given twice in one mapping is an error naming both lines (PyYAML keeps the last one
      silently); keys merged in with ``<<: *anchor`` may be overridden;
    * ``1e-3`` and ``5E4`` are floats (YAML 1.1 reads them as strings: it wants ``1.0e-3``);
    * only ``true`` and ``false`` are booleans: ``yes``, ``no``, ``on`` and ``off`` stay strings (a
      variant called ``no``, a choice ``off``); a boolean field still takes them, as pydantic does;
    * aliases may not expand a document far beyond what is written (:func:`check_expansion`: a
      "billion laughs" of a few lines is refused at once instead of hanging whoever reads it).
    """

    def get_single_node(self) -> yaml.Node | None:
        node: yaml.Node | None = super().get_single_node()
        if node is not None:
            check_expansion(node)
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, object]:
        seen: dict[Hashable, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"duplicate key {key!r} (first at line {seen[key]}); a key may appear once in a mapping",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line + 1
        mapping: dict[Hashable, object] = super().construct_mapping(node, deep=deep)
        return mapping


ALIAS_FLOOR = 10_000
"""Values (nodes) that aliases may add to any document, however short."""
ALIAS_FACTOR = 10
"""... and, beyond that, per value written: a document expands to at most ``written + max(ALIAS_FLOOR,
ALIAS_FACTOR * written)`` values. A config, study, report spec or catalog repeats a section a few
times; an alias bomb multiplies one a billion times."""


class AliasBombError(yaml.composer.ComposerError):  # type: ignore[misc]  # PyYAML ships no type hints
    """A document whose aliases expand it beyond the bound of :func:`check_expansion`."""


def check_expansion(root: yaml.Node) -> None:
    """Refuse a composed document whose aliases (``*name``, ``<<: *name`` merges included) expand it to
    more values than :data:`ALIAS_FLOOR` and :data:`ALIAS_FACTOR` allow, or that contains itself
    (``&a [*a]``). PyYAML composes an alias as the same node again, so the document is a graph of the
    nodes written; each node's expanded size is counted once, in time linear in what is written.

    Raises:
        AliasBombError: at the first node (in document order, innermost first) that alone expands
            beyond the bound, or at the node that contains itself.
    """
    written = _count_nodes(root)
    limit = written + max(ALIAS_FLOOR, ALIAS_FACTOR * written)
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in size:
            continue
        children = _children(node)
        if done:
            on_path.discard(id(node))
            size[id(node)] = min(limit + 1, 1 + sum(size[id(child)] for child in children))
            if size[id(node)] > limit:
                raise AliasBombError(
                    None,
                    None,
                    f"aliases expand this document to more than {limit} values ({written} written); "
                    f"a config, study or catalog repeats a section a few times, not this many",
                    node.start_mark,
                )
            continue
        on_path.add(id(node))
        stack.append((node, True))
        for child in children:
            if id(child) in on_path:
                raise AliasBombError(None, None, "an alias refers to a node that contains it", child.start_mark)
            if id(child) not in size:
                stack.append((child, False))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _count_nodes(root: yaml.Node) -> int:
    """How many distinct nodes the document has: what is written, each alias's target once."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen.add(id(node))
            stack.extend(_children(node))
    return len(seen)


YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$")
YamlLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789."))


class YamlDumper(yaml.SafeDumper):  # type: ignore[misc]  # PyYAML ships no type hints
    """PyYAML's safe dumper, quoting a string :class:`YamlLoader` would take for a float (``"1e-3"``),
    so that what :func:`dump_yaml` writes (a resolved config, ``to_yaml``) reads back the same.
    A subclass: PyYAML's own ``SafeDumper`` is left as it is for everyone else in the process."""


YamlDumper.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789."))


def dump_yaml(data: object, **options: object) -> str:
    """``data`` as YAML text through :class:`YamlDumper` (``options``: PyYAML's, e.g. ``sort_keys``)."""
    text: str = yaml.dump(data, Dumper=YamlDumper, **options)
    return text


def load_yaml(text: str) -> Any:
    """Parse YAML text with :class:`YamlLoader` (raises ``yaml.YAMLError``): a :data:`Json` value, typed
    ``Any`` for the callers that hand it straight to a config's validation."""
    return yaml.load(text, Loader=YamlLoader)  # a SafeLoader subclass: plain data only
