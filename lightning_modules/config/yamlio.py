"""The one YAML dialect of ablate, read and written: what a person (and a YAML 1.2 reader) means,
and what reads back the same. PyYAML's own loader and dumper are left as they are."""

from __future__ import annotations

import re
from typing import Any

import yaml


class YamlLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no type hints
    """PyYAML's SafeLoader, reading what a person (and a YAML 1.2 reader) means:

    * a key given twice in one mapping is an error naming both lines (PyYAML keeps the last one
      silently); keys merged in with ``<<: *anchor`` may be overridden;
    * ``1e-3`` and ``5E4`` are floats (YAML 1.1 reads them as strings: it wants ``1.0e-3``);
    * only ``true`` and ``false`` are booleans: ``yes``, ``no``, ``on`` and ``off`` stay strings (a
      variant called ``no``, a choice ``off``); a boolean field still takes them, as pydantic does.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
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
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


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


def dump_yaml(data: Any, **options: Any) -> str:
    """``data`` as YAML text through :class:`YamlDumper` (``options``: PyYAML's, e.g. ``sort_keys``)."""
    text: str = yaml.dump(data, Dumper=YamlDumper, **options)
    return text


def load_yaml(text: str) -> Any:
    """Parse YAML text with :class:`YamlLoader` (raises ``yaml.YAMLError``)."""
    return yaml.load(text, Loader=YamlLoader)  # a SafeLoader subclass: plain data only
