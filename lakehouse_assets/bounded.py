"""Bounded YAML and JSON loading: size, depth and alias expansion limits,
duplicate keys refused, and errors that never quote the text.

``yaml.safe_load`` composes nested nodes recursively: a 10,000-deep
``config.yml`` stopped every command with ``RecursionError``, and a
5,000-deep mapping with a traceback. A dozen aliases of aliases (the
"billion laughs") build a document that is small in memory but whose
expansion is exponential for whatever walks it (validation, ``json.dumps``).
Duplicate keys silently took the last value. Here:

* the text is refused above ``max_bytes`` before it is parsed;
* a node nested deeper than ``max_depth`` is refused as it is composed
  (before recursion can run out), naming its line;
* a document whose nodes, with every alias expanded, number more than
  ``max_nodes`` is refused, as is an alias of a node that contains it;
* a key that occurs twice in a mapping is refused, naming both lines (merge
  keys ``<<`` may still be overridden: that is what they are for);
* a syntax error says its line, column and kind of problem, never the text
  around it (PyYAML's own message quotes the offending line, and a
  ``config.yml`` may be a file planted to show another file's content).

:class:`BoundedParseError` carries the message without a location prefix;
callers prefix the file they read and raise their own error class.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node

#: Nesting deeper than this is refused (a config or mapping needs about 8).
MAX_DEPTH = 64
#: The largest mapping text (``mappings.parse_queries``; a real one is a few KB).
MAX_MAPPING_BYTES = 4 * 1024 * 1024
#: Nodes after alias expansion (a 1 MiB config has far fewer than this).
MAX_NODES = 1_000_000

MERGE_TAG = "tag:yaml.org,2002:merge"


class BoundedParseError(ValueError):
    """Text that is too big, too deep, has a duplicate key or is not valid YAML/JSON.

    The message names the line (and column) where it applies, never quotes the text.
    """


def _unquoted(problem: str) -> str:
    """PyYAML's problem without the text it quotes (``found character '\\t'
    that cannot start ...``, ``found undefined alias 'x'``); token kinds such
    as ``'<block end>'`` are kept, they are not the file's content."""
    problem = re.sub(r"""\s*(?:'(?!<[a-z ]+>')[^']*'|"[^"]*")""", "", problem)
    return problem[:120]


def _key_shown(key: Any) -> str:
    shown = repr(key)
    return shown if len(shown) <= 40 else shown[:37] + "..."


class _BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` that counts depth and expanded nodes while composing and
    refuses duplicate keys while constructing."""

    def __init__(self, text: str, max_depth: int, max_nodes: int) -> None:
        super().__init__(text)
        self.max_depth = max_depth
        self.max_nodes = max_nodes
        self.depth = 0
        self.nodes = 0
        #: expanded size of every finished node (by id): an alias adds its node's
        self.sizes: dict[int, int] = {}

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]
        line = event.start_mark.line + 1 if event.start_mark is not None else 0
        if isinstance(event, yaml.AliasEvent):
            node = super().compose_node(parent, index)
            size = self.sizes.get(id(node))
            if size is None:
                raise BoundedParseError(
                    f"an alias at line {line} refers to a node that contains it"
                )
            self._count(size, line)
            return node
        self.depth += 1
        if self.depth > self.max_depth:
            raise BoundedParseError(f"nested deeper than {self.max_depth} levels at line {line}")
        before = self.nodes
        self._count(1, line)
        node = super().compose_node(parent, index)
        self.depth -= 1
        self.sizes[id(node)] = self.nodes - before
        return node

    def _count(self, size: int, line: int) -> None:
        self.nodes += size
        if self.nodes > self.max_nodes:
            raise BoundedParseError(
                f"expands to more than {self.max_nodes:,} values (anchors and aliases "
                f"included) at line {line}"
            )

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    if key in first:
                        raise BoundedParseError(
                            f"duplicate key {_key_shown(key)} at line {line} "
                            f"(first at line {first[key]})"
                        )
                    first[key] = line
                except TypeError:
                    continue  # unhashable: the constructor says so below
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def _text(data: str | bytes, max_bytes: int) -> str:
    size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise BoundedParseError(f"larger than the {max_bytes:,} bytes allowed")
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BoundedParseError(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None


def load_yaml(
    data: str | bytes,
    *,
    max_bytes: int,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_NODES,
) -> Any:
    """One YAML document, like ``yaml.safe_load`` but bounded (see the module
    docstring); :class:`BoundedParseError` otherwise."""
    text = _text(data, max_bytes)
    loader: _BoundedLoader | None = None
    try:
        # the reader checks the characters as it is made
        loader = _BoundedLoader(text, max_depth, max_nodes)
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = _unquoted(exc.problem or exc.context or type(exc).__name__)
        raise BoundedParseError(f"not valid YAML{at}: {problem}") from None
    except yaml.reader.ReaderError as exc:
        raise BoundedParseError(
            f"not valid YAML at character {exc.position}: {exc.reason}"
        ) from None
    except yaml.YAMLError as exc:
        raise BoundedParseError(f"not valid YAML: {type(exc).__name__}") from None
    finally:
        if loader is not None:
            loader.dispose()


def json_depth_exceeds(text: str, max_depth: int) -> int | None:
    """The line where JSON ``text`` nests deeper than ``max_depth`` (None: it
    does not). One pass, no recursion: brackets inside strings do not count."""
    depth = 0
    line = 1
    in_string = escaped = False
    for char in text:
        if char == "\n":
            line += 1
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > max_depth:
                return line
        elif char in "]}":
            depth -= 1
    return None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise BoundedParseError(f"duplicate key {_key_shown(key)}")
        result[key] = value
    return result


def load_json(data: str | bytes, *, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """A JSON value, bounded in size and depth, duplicate keys refused;
    :class:`BoundedParseError` otherwise (never ``RecursionError``)."""
    text = _text(data, max_bytes)
    line = json_depth_exceeds(text, max_depth)
    if line is not None:
        raise BoundedParseError(f"nested deeper than {max_depth} levels at line {line}")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise BoundedParseError(
            f"not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
