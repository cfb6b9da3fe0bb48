"""Safe YAML loading that remembers where every value came from.

PyYAML's SafeLoader already refuses Python-object tags; on top of it this module refuses
alias bombs (a few lines that expand to millions of nodes) and duplicate keys, and keeps the
node tree so that errors found later, by the schema, can name the line they come from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuenv.matrix.errors import MatrixError
from gpuenv.matrix.files import read_regular

MAX_BYTES = 1_000_000
# A real matrix has a few hundred nodes; this bound only stops alias bombs.
MAX_EXPANDED_NODES = 100_000


@dataclass
class YamlDocument:
    path: Path
    data: Any
    root: yaml.Node | None

    def node_at(self, loc: tuple[str | int, ...]) -> yaml.Node | None:
        """The deepest node found along ``loc`` (mapping keys and sequence indices).

        A ``"[key]"`` part (pydantic's location of a bad mapping key) gives the key's node.
        """
        return self._walk(loc)[1]

    def line_of(self, loc: tuple[str | int, ...]) -> int | None:
        """The line of the deepest key (or sequence item) found along ``loc``.

        The key's line, not its value's: for ``tpyo:`` followed by an indented block, the
        error belongs on the ``tpyo:`` line, where the block value's node does not start.
        """
        marker = self._walk(loc)[0]
        return marker.start_mark.line + 1 if marker is not None else None

    def _walk(self, loc: tuple[str | int, ...]) -> tuple[yaml.Node | None, yaml.Node | None]:
        marker = node = self.root
        for part in loc:
            if part == "[key]":
                return marker, marker
            found = _child(node, part)
            if found is None:
                break
            marker, node = found
        return marker, node


def _child(node: yaml.Node | None, part: str | int) -> tuple[yaml.Node, yaml.Node] | None:
    """(key node, value node) of a mapping entry, or (item, item) of a sequence item."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                return key, value
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
        return node.value[part], node.value[part]
    return None


def write_one(path: Path) -> str:
    """What to do about a matrix file that is not there, for every verb that reads one: the
    `gpuenv init` that writes it (for the directory it is in; init writes DIR/matrix.yaml),
    or -f/--file and GPUENV_MATRIX naming another (issue 48: a first run in a directory
    holding only a script)."""
    import os
    import shlex

    where = path.parent
    here = os.path.abspath(where) == os.getcwd()
    init = "gpuenv init" if here else f"gpuenv init {shlex.quote(str(where))}"
    if path.name == "matrix.yaml":
        return (f"write one for the project {'here' if here else 'there'} with `{init}` (it "
                "chooses the cells from requirements.txt or pyproject.toml), or pass "
                "-f/--file or set GPUENV_MATRIX")  # fmt: skip
    return (f"pass -f/--file or set GPUENV_MATRIX to a matrix that exists, or write one with "
            f"`{init}` (it writes {where / 'matrix.yaml'})")  # fmt: skip


def load(path: Path) -> YamlDocument:
    try:
        raw = read_regular(path, MAX_BYTES)
    except FileNotFoundError:
        raise MatrixError(path, f"no such file; {write_one(path)}") from None
    except IsADirectoryError:
        raise MatrixError(path, "cannot read: not a regular file") from None
    except OSError as exc:
        raise MatrixError(path, f"cannot read: {exc.strerror}") from None
    if len(raw) > MAX_BYTES:
        raise MatrixError(path, f"file is larger than {MAX_BYTES} bytes; is it a matrix file?")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MatrixError(path, f"not UTF-8 text (byte {exc.start})") from None
    return parse(text, path)


def parse(text: str, path: Path) -> YamlDocument:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else None
        raise MatrixError(path, f"malformed YAML: {exc.problem}", line) from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        what = f"character {exc.character!r}" if isinstance(exc.character, str) else "byte"
        raise MatrixError(path, f"malformed YAML: {what} is not allowed in YAML", line) from None
    except yaml.YAMLError as exc:
        raise MatrixError(path, f"malformed YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise MatrixError(path, "malformed YAML: nested too deeply") from None
    if root is None:
        return YamlDocument(path, None, None)
    try:
        _check_tree(root, path)
    except RecursionError:
        raise MatrixError(path, "malformed YAML: nested too deeply") from None
    loader = yaml.SafeLoader("")
    try:
        data = loader.construct_document(root)
    except RecursionError:
        raise MatrixError(path, "malformed YAML: nested too deeply") from None
    except yaml.constructor.ConstructorError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else None
        tag = getattr(exc, "problem", "") or str(exc)
        raise MatrixError(
            path, f"unsupported YAML tag ({tag}); a matrix holds plain data only", line
        ) from None
    finally:
        loader.dispose()
    return YamlDocument(path, data, root)


def _check_tree(root: yaml.Node, path: Path) -> None:
    """Refuse duplicate keys and documents whose aliases expand past MAX_EXPANDED_NODES."""
    sizes: dict[int, int] = {}
    on_stack: set[int] = set()
    aliased = False  # a node reached twice: the document uses aliases

    def size(node: yaml.Node) -> int:
        nonlocal aliased
        key = id(node)
        if key in sizes:
            aliased = True
            return sizes[key]
        if key in on_stack:
            raise MatrixError(path, "recursive YAML alias", node.start_mark.line + 1)
        on_stack.add(key)
        total = 1
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode):
                    if k.value in seen and k.value != "<<":
                        raise MatrixError(path, f"duplicate key {k.value!r}", k.start_mark.line + 1)
                    seen.add(k.value)
                total += size(k) + size(v)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                total += size(item)
        on_stack.discard(key)
        if total > MAX_EXPANDED_NODES:
            why = (f"YAML aliases expand to more than {MAX_EXPANDED_NODES} values "
                   "(a 'billion laughs' document?); write the values out") if aliased else (
                   f"more than {MAX_EXPANDED_NODES} values; a matrix needs far fewer "
                   "(split the cells into several matrices)")  # fmt: skip
            raise MatrixError(path, why, node.start_mark.line + 1)
        sizes[key] = total
        return total

    size(root)
