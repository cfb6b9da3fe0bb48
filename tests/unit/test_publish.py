"""gpuenv.publish.push without an engine: push streams, retries, targets, aliases, refusals, pulls.

The push streams under tests/unit/recorded/push-*.jsonl are what Docker Engine 20.10 sent to
the Docker SDK (`api.push(..., stream=True)`, one JSON document a line, verbatim) when
pushing to a loopback docker-registry, to a closed port, and to registries answering 500
and 401 (recorded/README.md).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpuenv.building import pull
from gpuenv.catalog import compat
from gpuenv.engine.client import EngineError, ImageInfo
from gpuenv.matrix import schema as matrices
from gpuenv.matrix.errors import GpuenvError, MatrixError
from gpuenv.publish import push as publish
from gpuenv.registry import names as registries
from gpuenv.store.cache import read_record

RECORDED = Path(__file__).parent / "recorded"


def recorded(name: str) -> list[dict[str, Any]]:
    lines = (RECORDED / name).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


# --------------------------------------------------------------------------- push streams


def test_a_successful_push_stream_gives_the_manifest_digest():
    stream = recorded("push-ok.jsonl")
    digest, error = publish.read_push_stream(iter(stream))
    assert error is None
    # The engine also says it in words, in the status line before the aux message.
    said = [c["status"] for c in stream if "digest: sha256:" in c.get("status", "")]
    assert len(said) == 1
    assert digest is not None and re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
    assert f"digest: {digest} " in said[0]


@pytest.mark.parametrize(
    ("name", "needle", "transient"),
    [
        ("push-connection-refused.jsonl", "connection refused", True),
        ("push-500.jsonl", "500 Internal Server Error", True),
        ("push-401.jsonl", "no basic auth credentials", False),
    ],
)
def test_an_error_inside_the_stream_is_found(name, needle, transient):
    stream = recorded(name)
    assert any("errorDetail" in c for c in stream)  # the SDK raised nothing for it
    digest, error = publish.read_push_stream(iter(stream))
    assert digest is None
    assert error is not None and needle in error
    assert "\n" not in error
    assert publish.is_transient(error) is transient


def test_a_stream_without_digest_or_error_is_a_failure():
    stream = [c for c in recorded("push-ok.jsonl") if "aux" not in c]
    assert publish.read_push_stream(iter(stream)) == (
        None,
        "the engine ended the push without a digest",
    )
    assert publish.read_push_stream(iter(["not a dict", b"bytes"])) == (
        None,
        "the engine ended the push without a digest",
    )


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        ("received unexpected HTTP status: 503 Service Unavailable", True),
        ("received unexpected HTTP status: 502 Bad Gateway", True),
        ("net/http: TLS handshake timeout", True),
        ("read tcp 10.0.0.2:443: read: connection reset by peer", True),
        ("Put https://ghcr.io/v2/...: EOF", True),
        ("unauthorized: authentication required", False),
        ("denied: requested access to the resource is denied", False),
        ("name unknown: repository name not known to registry", False),
    ],
)
def test_is_transient(error, transient):
    assert publish.is_transient(error) is transient


# --------------------------------------------------------------------------- retries


class FakePush:
    """push(repo, tag) -> a stream, per attempt, from a script of outcomes."""

    def __init__(self, *outcomes: Any) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[tuple[str, str]] = []

    def __call__(self, repo: str, tag: str) -> Any:
        self.calls.append((repo, tag))
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return iter(outcome)


OK = recorded("push-ok.jsonl")
REFUSED = recorded("push-connection-refused.jsonl")
E500 = recorded("push-500.jsonl")
E401 = recorded("push-401.jsonl")
REF = "127.0.0.1:5000/team/tensorflow:tf2.21-py3.11-cpu"


def test_push_ref_splits_the_reference_and_succeeds_at_once():
    push, sleeps = FakePush(OK), []
    result = publish.push_ref(push, REF, sleep=sleeps.append)
    assert push.calls == [("127.0.0.1:5000/team/tensorflow", "tf2.21-py3.11-cpu")]
    assert (result.status, result.attempts, result.error) == ("pushed", 1, None)
    assert result.digest == publish.read_push_stream(iter(OK))[0]
    assert sleeps == []


def test_transient_failures_are_retried_with_backoff():
    push, sleeps = FakePush(E500, REFUSED, OK), []
    result = publish.push_ref(push, REF, sleep=sleeps.append)
    assert (result.status, result.attempts, result.error) == ("pushed", 3, None)
    assert sleeps == [1, 2]


def test_retries_stop_after_three_and_the_last_error_is_reported():
    push, sleeps = FakePush(E500, E500, E500, REFUSED, OK), []
    result = publish.push_ref(push, REF, sleep=sleeps.append)
    assert result.status == "failed"
    assert result.attempts == publish.RETRIES + 1 == 4
    assert sleeps == [1, 2, 4]
    assert "connection refused" in result.error
    assert len(push.outcomes) == 1  # never tried a fifth time


def test_a_permanent_failure_is_not_retried():
    push, sleeps = FakePush(E401, OK), []
    result = publish.push_ref(push, REF, sleep=sleeps.append)
    assert (result.status, result.attempts) == ("failed", 1)
    assert "no basic auth credentials" in result.error
    assert sleeps == []


def test_an_exception_from_the_sdk_is_a_failure_too():
    boom = ConnectionError("('Connection aborted.', ConnectionResetError(104, 'Connection reset"
                           " by peer'))\nsecond line")  # fmt: skip
    push, sleeps = FakePush(boom, RuntimeError("something else entirely"), OK), []
    result = publish.push_ref(push, REF, sleep=sleeps.append)
    assert (result.status, result.attempts) == ("failed", 2)  # reset: retried; other: not
    assert result.error == "something else entirely"
    assert sleeps == [1]
    assert result.to_json() == {
        "cell": "", "ref": REF, "status": "failed", "digest": None,
        "error": "something else entirely", "attempts": 2,
    }  # fmt: skip


# --------------------------------------------------------------------------- targets, aliases


@pytest.mark.parametrize(
    ("name", "registry", "expected"),
    [
        ("gpuenv/tensorflow", None, "gpuenv/tensorflow"),
        ("gpuenv/tensorflow", "", "gpuenv/tensorflow"),
        ("gpuenv/tensorflow", "ghcr.io/acme", "ghcr.io/acme/tensorflow"),
        ("gpuenv/tensorflow", "ghcr.io/acme/", "ghcr.io/acme/tensorflow"),
        ("registry.example.com:5000/team/envs", "127.0.0.1:5000", "127.0.0.1:5000/envs"),
        ("envs", "127.0.0.1:5000/a/b", "127.0.0.1:5000/a/b/envs"),
    ],
)
def test_target_repository(name, registry, expected):
    assert registries.target_repository(name, registry) == expected


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("ghcr.io", True),
        ("ghcr.io/acme", True),
        ("127.0.0.1:5000/team/sub", True),
        ("localhost:5000", True),
        ("ghcr.io/Acme", False),  # repository paths are lowercase
        ("ghcr.io/acme tools", False),
        ("https://ghcr.io/acme", False),
        ("", False),
    ],
)
def test_registry_problem(value, ok):
    assert (registries.registry_problem(value) is None) is ok


def test_registry_from_env(monkeypatch):
    monkeypatch.delenv(registries.REGISTRY_ENV, raising=False)
    assert registries.registry_from_env() is None
    monkeypatch.setenv(registries.REGISTRY_ENV, "  ")
    assert registries.registry_from_env() is None
    monkeypatch.setenv(registries.REGISTRY_ENV, "127.0.0.1:5000/x")
    assert registries.registry_from_env() == "127.0.0.1:5000/x"
    monkeypatch.setenv(registries.REGISTRY_ENV, "ghcr.io/Acme")
    with pytest.raises(GpuenvError, match=r"\$GPUENV_REGISTRY='ghcr.io/Acme': expected HOST"):
        registries.registry_from_env()


def _loaded(write_matrix, text: str) -> tuple[Any, Any]:
    m = matrices.load(write_matrix(text))
    return m, compat.resolve(m)


def test_aliases_by_cell(write_matrix, minimal_matrix):
    m, res = _loaded(
        write_matrix,
        minimal_matrix + "aliases:\n  latest: '*-cpu'\n  latest-gpu: '*-gpu'\n  tf2.21: '*-cpu'\n",
    )
    assert publish.aliases_by_cell(m, res.cells) == {
        "tf2.21-py3.11-cpu": ["latest", "tf2.21"],
        "tf2.21-py3.11-cuda12.5-gpu": ["latest-gpu"],
    }


@pytest.mark.parametrize(("pattern", "count"), [("'tf2.21-*'", 2), ("tf2.17-py3.11-cpu", 0)])
def test_an_alias_must_match_exactly_one_cell(write_matrix, minimal_matrix, line_of, pattern,
                                              count):  # fmt: skip
    text = minimal_matrix + f"aliases:\n  ok: '*-cpu'\n  latest: {pattern}\n"
    m, res = _loaded(write_matrix, text)
    with pytest.raises(MatrixError) as info:
        publish.aliases_by_cell(m, res.cells)
    assert f"matches {count} cells; it must match one" in info.value.message
    assert "alias 'latest'" in info.value.message
    assert info.value.line == line_of(text, "latest:")


# --------------------------------------------------------------------------- refusals


def test_check_pushable(write_matrix, minimal_matrix, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    _, res = _loaded(write_matrix, minimal_matrix)
    cell = res.cells[0]
    info = ImageInfo(id="sha256:aaa", labels={"io.gpuenv.spec-hash": "h1"})
    assert "is not built; gpuenv build" in publish.check_pushable(cell, None, "h1")
    assert "is stale" in publish.check_pushable(cell, info, "h2")
    assert publish.check_pushable(cell, info, "h1") is None  # never validated: allowed
    publish.record_validation({"sha256:aaa": True})
    assert publish.check_pushable(cell, info, "h1") is None
    publish.record_validation({"sha256:aaa": False, "sha256:bbb": True})
    assert "failed validation" in publish.check_pushable(cell, info, "h1")
    assert publish.validation_of("sha256:bbb") is True
    (tmp_path / "gpuenv" / "validated.json").write_text("{not json")
    assert publish.check_pushable(cell, info, "h1") is None
    publish.record_validation({"sha256:ccc": False})  # a corrupt file is replaced
    assert publish.validation_of("sha256:ccc") is False


# --------------------------------------------------------------------------- pull before build


PULLED = "127.0.0.1:5000/x/tensorflow:tf2.21-py3.11-cpu"
PINNED = "127.0.0.1:5000/x/tensorflow@sha256:" + "d" * 64  # the digest that verified
CELL_IMAGE = "gpuenv/tensorflow:tf2.21-py3.11-cpu"


@pytest.fixture
def unreadable_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry's labels cannot be read here: pull_matching goes on to vet and pull (the
    path these tests exercise; the registry read itself: test_registry.py)."""
    monkeypatch.setattr(pull, "peek_spec_hash", lambda engine, ref: ("?", "test"))


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def vetted(image_id: str = "sha256:pulled"):
    """A vet (gpuenv/publish/attest/verify.py: vetting_from_env) whose verified provenance
    records `image_id` at PINNED; the real one: tests/unit/test_attest_binding.py."""
    return lambda ref, spec: (PINNED, image_id)


def refused(ref: str, spec: str) -> tuple[str, str]:
    raise GpuenvError("no attestations")


def _image(spec: str, image_id: str = "sha256:pulled") -> ImageInfo:
    return ImageInfo(id=image_id, labels={"io.gpuenv.spec-hash": spec})


def test_a_vetted_image_with_the_spec_hash_becomes_the_cells(fake_engine, unreadable_registry):
    eng = fake_engine(remote={PINNED: _image("h1")})
    got = pull.pull_matching(eng, PULLED, "h1", keep_as=CELL_IMAGE, vet=vetted())
    assert got == ("sha256:pulled", "")
    assert eng.pulled == [PINNED]  # by the digest that verified, never the tag again
    assert eng.local[CELL_IMAGE] == _image("h1")
    assert read_record(pull.PULLED_RECORD) == {"sha256:pulled": PINNED}


def test_an_image_that_does_not_vet_is_not_pulled(fake_engine, unreadable_registry):
    """Issue 35, M1: a self-declared spec-hash label is not enough."""
    eng = fake_engine(remote={PINNED: _image("h1")})
    image_id, why = pull.pull_matching(eng, PULLED, "h1", keep_as=CELL_IMAGE, vet=refused)
    assert image_id is None and "not adopted: no attestations" in why
    assert eng.pulled == [] and eng.local == {}


def test_a_pulled_image_that_is_not_the_provenances_is_removed(fake_engine, unreadable_registry):
    eng = fake_engine(remote={PINNED: _image("h1", "sha256:other")})
    image_id, why = pull.pull_matching(eng, PULLED, "h1", keep_as=CELL_IMAGE, vet=vetted())
    assert image_id is None and "not the sha256:pulled" in why
    assert CELL_IMAGE not in eng.local and "sha256:other" not in eng.images
    # One the engine already had stays.
    mine = _image("h-mine", "sha256:other")
    eng = fake_engine(remote={PINNED: mine}, local={"mine:x": mine})
    assert pull.pull_matching(eng, PULLED, "h1", keep_as=CELL_IMAGE, vet=vetted())[0] is None
    assert "sha256:other" in eng.images and eng.local["mine:x"] == mine


@pytest.mark.parametrize(
    ("remote", "needle"),
    [
        (
            EngineError(
                "Docker Engine error: 404", "404 Client Error: Not Found (manifest unknown)\nx"
            ),
            "manifest",
        ),
        (
            [
                {"status": "Pulling"},
                {"errorDetail": {"message": "unauthorized: no"}, "error": "unauthorized: no"},
            ],
            "unauthorized",
        ),
    ],
    ids=["raised", "in-stream"],
)
def test_a_failed_pull_leaves_nothing_and_says_why(
    fake_engine, unreadable_registry, remote, needle
):
    eng = fake_engine(remote={PINNED: remote})
    image_id, why = pull.pull_matching(eng, PULLED, "h1", keep_as=CELL_IMAGE, vet=vetted())
    assert image_id is None
    assert why.startswith(f"pull {PINNED}: ") and needle in why and "\n" not in why
    assert eng.local == {}
