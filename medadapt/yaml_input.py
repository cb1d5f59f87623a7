"""The YAML input policy (docs/guarantees.md, "Untrusted input"): every YAML file medadapt reads (recipes,
``--set`` values, accelerate configs, a run folder's ``recipe.yaml``) goes through :class:`PolicyLoader`,
PyYAML's safe loader plus bounds checked while the document is composed, before anything is built or
validated: aliases bounded in expansion, nesting bounded, duplicate keys, lone surrogates and unreadable
numbers refused with their line. :func:`read_yaml` adds a size cap and strict UTF-8; every problem is one
:class:`~medadapt.errors.ConfigError` ``file:line: ...``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from yaml.events import AliasEvent, CollectionStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from medadapt.errors import ConfigError

__all__ = ["MAX_ALIAS_VALUES", "MAX_DEPTH", "MAX_YAML_BYTES", "PolicyLoader", "YamlPolicyError",
           "first_clause", "has_surrogate", "line_of", "load_yaml", "read_yaml"]

#: a recipe or config is a few kB (the largest shipped recipe: 7 kB); a larger file is refused before PyYAML's
#: pure-Python parser (~100 kB/s) spends seconds on it
MAX_YAML_BYTES = 64 * 1024
#: values that aliases may add to a document, all uses together (a few anchors reused a few times need
#: hundreds; 8 levels of 9-fold aliases, 900 bytes, would add 43 million)
MAX_ALIAS_VALUES = 10_000
#: nesting depth of a document, aliases expanded (recipes nest 4 or 5 levels)
MAX_DEPTH = 64

_MERGE_TAG = "tag:yaml.org,2002:merge"
_SURROGATE = re.compile(r"[\ud800-\udfff]")


class YamlPolicyError(yaml.MarkedYAMLError):
    """YAML that parses but breaks the input policy (too many alias values, too deep, a duplicate key, a lone
    surrogate, a number Python cannot read); ``problem_mark`` is where."""

    def __init__(self, problem: str, mark: Any) -> None:
        super().__init__(problem=problem, problem_mark=mark)


class PolicyLoader(yaml.SafeLoader):
    """PyYAML's :class:`~yaml.SafeLoader` (no tags that run code) plus the input policy: while composing, each
    alias adds the size of what it repeats to a running count (memoised per node, so the check is linear in
    the file), refused past :data:`MAX_ALIAS_VALUES` or :data:`MAX_DEPTH`, and an alias inside its own
    anchor (a cyclic document) is refused; duplicate keys of a mapping (merge keys ``<<`` aside) are refused
    where the second one is written; a scalar holding a lone surrogate (``"\\ud800"``) or a value its
    constructor cannot read (a 5,000-digit integer, ``2024-13-45``) is refused at its line."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._alias_values = 0
        self._open: set[str] = set()  # anchors whose collection is still being composed
        self._extents: dict[int, tuple[int, int]] = {}  # id(node) -> (values, height), aliases expanded
        self._explicit: dict[Node, list[ScalarNode]] = {}  # mapping -> its own scalar keys (merges aside)

    # ---------------------------------------------------------------------------------------- composing
    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            node = self.anchors.get(event.anchor)
            if node is not None:  # an undefined alias is PyYAML's own error
                if event.anchor in self._open:
                    raise YamlPolicyError(f"alias *{event.anchor} inside its own anchor (a cyclic document)",
                                          event.start_mark)
                values, height = self._extent(node)
                self._alias_values += values
                if self._alias_values > MAX_ALIAS_VALUES:
                    raise YamlPolicyError(f"aliases expand to more than {MAX_ALIAS_VALUES:,} values (an "
                                          "alias bomb?); write the values out", event.start_mark)
                if self._depth + height > MAX_DEPTH:
                    raise YamlPolicyError(f"nested more than {MAX_DEPTH} levels deep (aliases expanded)",
                                          event.start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise YamlPolicyError(f"nested more than {MAX_DEPTH} levels deep", event.start_mark)
        anchor = event.anchor if isinstance(event, CollectionStartEvent) else None
        if anchor is not None:
            self._open.add(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1
            self._open.discard(anchor)  # type: ignore[arg-type]

    def compose_scalar_node(self, anchor: str | None) -> ScalarNode:
        node = super().compose_scalar_node(anchor)
        found = _SURROGATE.search(node.value)
        if found:
            raise YamlPolicyError(f"\\u{ord(found.group()):04x} is a lone surrogate, not a character "
                                  "(text must be valid Unicode)", node.start_mark)
        return node

    def compose_mapping_node(self, anchor: str | None) -> MappingNode:
        node = super().compose_mapping_node(anchor)
        self._explicit[node] = [k for k, _ in node.value if isinstance(k, ScalarNode) and k.tag != _MERGE_TAG]
        return node

    def _extent(self, node: Node) -> tuple[int, int]:
        """``(values, height)`` of ``node`` with its aliases expanded; memoised, so shared nodes cost once.
        Heights are bounded by :data:`MAX_DEPTH` (checked at every alias), and so is this recursion."""
        key = id(node)
        if key not in self._extents:
            if isinstance(node, SequenceNode):
                children = list(node.value)
            elif isinstance(node, MappingNode):
                children = [n for pair in node.value for n in pair]
            else:
                children = []
            parts = [self._extent(child) for child in children]
            self._extents[key] = (1 + sum(p[0] for p in parts), 1 + max((p[1] for p in parts), default=0))
        return self._extents[key]

    # ------------------------------------------------------------------------------------- constructing
    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict:
        first: dict[Any, int] = {}
        for key_node in self._explicit.get(node, []):
            key = self.construct_object(key_node)
            try:
                hash(key)
            except TypeError:
                continue  # PyYAML's own "unhashable key" error follows
            if key in first:
                raise YamlPolicyError(f"duplicate key {key!r} (also on line {first[key] + 1}); YAML would "
                                      "keep only the last one", key_node.start_mark)
            first[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as exc:  # int('9' * 5000), date(2024, 13, 45), !!float x
            value = node.value if isinstance(node, ScalarNode) else ""
            what = node.tag.rsplit(":", 1)[-1]
            if isinstance(value, str) and len(value) > 40:
                value = f"{value[:20]}...{value[-10:]} ({len(value)} characters)"
            else:
                value = repr(value)
            problem = f"cannot read {value} as {what}: {first_clause(exc)}"
            raise YamlPolicyError(problem, node.start_mark) from None


def first_clause(exc: Exception) -> str:
    """An exception's message up to its first ``;`` (Python's int-size error goes on to suggest
    ``sys.set_int_max_str_digits``, which is no advice for a recipe)."""
    return str(exc).split(";", 1)[0]


def load_yaml(text: str, source: str) -> tuple[Any, Node | None]:
    """Parse one YAML document with :class:`PolicyLoader`: ``(data, root node)`` (the node tree gives the
    line of a key path, :func:`line_of`). Every problem, syntax or policy, is one
    :class:`~medadapt.errors.ConfigError` ``source:line: ...``."""
    loader = None
    try:
        loader = PolicyLoader(text)  # the reader refuses control characters here, at once
        node = loader.get_single_node()
        return (loader.construct_document(node) if node is not None else None), node
    except YamlPolicyError as exc:
        raise ConfigError(f"{source}:{exc.problem_mark.line + 1}: {exc.problem}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{source}{where}: invalid YAML ({exc.problem or exc.context})") from None
    except yaml.reader.ReaderError as exc:  # a control character: position is an index into the text
        line = text.count("\n", 0, exc.position) + 1
        char = f"U+{exc.character:04X}" if isinstance(exc.character, int) else repr(exc.character)
        problem = f"control character {char} is not allowed"
        raise ConfigError(f"{source}:{line}: invalid YAML ({problem})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML ({exc})") from None
    except (ValueError, OverflowError, RecursionError) as exc:  # the scanner's chr() of "\UFFFFFFFF", ...
        where = f":{loader.get_mark().line + 1}" if loader is not None else ""
        raise ConfigError(f"{source}{where}: invalid YAML ({first_clause(exc)})") from None
    finally:
        if loader is not None:
            loader.dispose()


def line_of(root: Node | None, path: list) -> int | None:
    """The 1-based line where ``path`` (keys and list indices) is written under ``root``, or its deepest
    ancestor that is (``None`` for the document itself)."""
    node, line = root, None
    for part in path:
        if isinstance(node, MappingNode):
            # the last match: after a merge (<<) PyYAML puts the merged pairs first, the explicit ones after
            match = next(((k, v) for k, v in reversed(node.value)
                          if isinstance(k, ScalarNode) and k.value == str(part)), None)
            if match is None:
                break
            line, node = match[0].start_mark.line + 1, match[1]
        elif isinstance(node, SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def has_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate (undecodable bytes of a command line or file name arrive as
    ``\\udcXX``; a YAML escape can write ``\\ud800``): not Unicode, refused before it reaches a hash or a
    tokenizer."""
    return _SURROGATE.search(text) is not None


def read_yaml(path: str | Path, *, max_bytes: int = MAX_YAML_BYTES) -> tuple[Any, Node | None]:
    """Read and parse the YAML file ``path`` under the policy: ``(data, root node)``. A file above
    ``max_bytes``, bytes that are not UTF-8 (with the line), invalid YAML or YAML that breaks the policy
    (:func:`load_yaml`) is a :class:`~medadapt.errors.ConfigError`; a missing file is the caller's to report
    (``OSError``)."""
    path = Path(path)
    with open(path, "rb") as fh:
        raw = fh.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise ConfigError(f"{path}: larger than {max_bytes:,} bytes; a YAML file medadapt reads is at most "
                          "that")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        problem = f"not valid UTF-8 (byte offset {exc.start}); save it as UTF-8"
        raise ConfigError(f"{path}:{line}: {problem}") from None
    return load_yaml(text, str(path))
