"""`gpuenv push` and pull-before-build against a real registry on loopback.

The registry is Debian's docker-registry, started by the session with its own config
(push_fixtures.py). The JAX CPU cell (the smallest framework cell) is pushed once and
reused; later pushes of the same layers only check or mount them. Broken registries are a tiny
http.server; a registry that is down is a closed port. Every 127.0.0.1:* reference the
session creates in the engine is removed at the end.
"""

from __future__ import annotations

import json
import time
import urllib.error

import pytest
from support.cells import test_repository

pytest.register_assert_rewrite("push_fixtures")

from push_fixtures import (  # noqa: E402
    CELL,
    EXTRA_PIP,
    IMAGE,
    PUSHPULL,
    cell_matrix,
    docker_cmd,
    free_port,
    inspect,
    results_by_ref,
)

# The fixtures (registry, pushed, cli, fake_registry, alias_matrix, ...) live in
# push_fixtures.py, beside conftest.py.
pytest_plugins = ["push_fixtures"]

pytestmark = [pytest.mark.engine]

PEEK = test_repository("peek")  # a repository of its own for the candidate that is not pulled


def no_traceback(proc) -> None:
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr


# --------------------------------------------------------------------------- pushing


def test_push_lists_pulls_back_and_the_digests_agree(pushed, registry):
    cell_ref, alias_ref = pushed.ref(CELL), pushed.ref("latest")
    assert set(pushed.results) == {cell_ref, alias_ref}
    for result in pushed.results.values():
        assert result["status"] == "pushed", result
        assert result["cell"] == CELL
        assert result["digest"].startswith("sha256:")
        assert result["attempts"] == 1
    digest = pushed.results[cell_ref]["digest"]
    assert pushed.results[alias_ref]["digest"] == digest  # one image, two tags
    print(f"first push of {IMAGE}: {pushed.seconds:.1f} s")

    # The registry's view: both tags, and the manifest digest the push reported.
    assert sorted(registry.tags(pushed.repository)) == sorted([CELL, "latest"])
    for tag in (CELL, "latest"):
        assert registry.manifest_digest(pushed.repository, tag) == digest

    # Pull it back (the local tag removed first, so the pull really resolves the tag).
    docker_cmd("rmi", cell_ref)  # untags only: IMAGE holds the image
    docker_cmd("pull", cell_ref)
    back = inspect(cell_ref)
    assert back is not None
    assert back["Id"] == pushed.image["Id"]
    repo = cell_ref.rsplit(":", 1)[0]
    assert f"{repo}@{digest}" in back["RepoDigests"]


def test_a_registry_that_is_down_fails_each_tag_clearly(cli, cell_built, alias_matrix):
    host = f"127.0.0.1:{free_port()}"  # nothing listens there
    proc = cli(
        "push", CELL, "-f", str(alias_matrix), "--registry", f"{host}/team", check=False
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    no_traceback(proc)
    lines = proc.stdout.splitlines()
    for tag in (CELL, "latest"):
        (line,) = [ln for ln in lines if ln.startswith(f"{host}/team/push:{tag} ")]
        assert "failed:" in line and "connection refused" in line, line
    assert "error: 2 of 2 tag(s) not pushed" in proc.stderr


def test_a_registry_answering_5xx_is_retried_then_fails(cli, pushed, fake_registry, tmp_path):
    fake = fake_registry("5xx")
    matrix = cell_matrix(tmp_path)  # no alias: one tag
    start = time.monotonic()
    proc = cli("push", CELL, "-f", str(matrix), "--registry", f"{fake.host}/team", "--json",
               check=False)  # fmt: skip
    took = time.monotonic() - start
    assert proc.returncode == 1, proc.stderr
    no_traceback(proc)
    (result,) = results_by_ref(proc).values()
    assert result["status"] == "failed"
    assert "500" in result["error"], result
    assert result["attempts"] == 4, result  # 1 + 3 retries, after 1, 2 and 4 s
    assert took >= 7
    assert any(r.startswith("PUT /v2/team/push/manifests/") for r in fake.seen)


def test_a_registry_refusing_credentials_is_not_retried(cli, pushed, fake_registry, tmp_path):
    fake = fake_registry("401")
    matrix = ("-f", str(cell_matrix(tmp_path)))  # no alias: one tag
    proc = cli("push", CELL, *matrix, "--registry", f"{fake.host}/team", "--json", check=False)
    assert proc.returncode == 1, proc.stderr
    no_traceback(proc)
    (result,) = results_by_ref(proc).values()
    assert result["status"] == "failed"
    assert result["attempts"] == 1, result
    assert "auth" in result["error"].lower(), result
    # The same failure for a person: one line for the tag, one error line.
    human = cli("push", CELL, *matrix, "--registry", f"{fake.host}/team", check=False)
    assert human.returncode == 1
    no_traceback(human)
    (line,) = human.stdout.splitlines()
    assert line.startswith(f"{fake.host}/team/push:{CELL}  -  failed: "), line
    assert human.stderr.rstrip().endswith("error: 1 of 1 tag(s) not pushed")


# --------------------------------------------------------------------------- refusals


def test_a_stale_image_is_refused_with_the_reason(cli, cell_built, registry, tmp_path):
    # One more pip pin: the spec hash is not the image's.
    stale = cell_matrix(tmp_path, extra=f'packages:\n  pip: ["{EXTRA_PIP}"]\n')
    proc = cli("push", CELL, "-f", str(stale), "--registry", f"{registry.host}/stale",
               "--json", check=False)  # fmt: skip
    assert proc.returncode == 1
    no_traceback(proc)
    (result,) = results_by_ref(proc).values()
    assert result["status"] == "refused"
    assert "stale" in result["error"] and f"gpuenv build {CELL}" in result["error"]
    assert inspect(f"{registry.host}/stale/push:{CELL}") is None  # not even tagged
    with pytest.raises(urllib.error.HTTPError):
        registry.tags("stale/push")


def test_an_image_that_failed_validation_is_refused(cli, cell_built, alias_matrix, registry,
                                                    tmp_path, monkeypatch):  # fmt: skip
    from gpuenv.publish import push as publish

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    publish.record_validation({cell_built["Id"]: False})
    assert json.loads((tmp_path / "gpuenv" / "validated.json").read_text()) == {
        cell_built["Id"]: False
    }
    proc = cli("push", CELL, "-f", str(alias_matrix), "--registry", f"{registry.host}/failed",
               check=False, env={"XDG_CACHE_HOME": str(tmp_path)})  # fmt: skip
    assert proc.returncode == 1
    no_traceback(proc)
    assert f"refused: {IMAGE} failed validation" in proc.stdout
    assert inspect(f"{registry.host}/failed/push:{CELL}") is None


# --------------------------------------------------------------------------- pull before build


def test_build_adopts_no_unsigned_image_with_the_same_spec_hash(cli, pushed, registry, tmp_path):
    """Issue 35, M1: an image at the cell's tag labelled with the cell's spec hash (which
    anyone with the public matrix and base can compute) is the attack; without a
    provenance that verifies with $GPUENV_VERIFY_KEY it is not adopted, and without a key
    nothing is pulled. A signed image is pulled: tests/integration/test_engine_attest.py."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    public = tmp_path / "trusted.pub"
    public.write_bytes(ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    matrix = cell_matrix(tmp_path, name=PUSHPULL)
    image = f"{PUSHPULL}:{CELL}"
    published = f"{registry.host}/x/pushpull:{CELL}"
    try:
        # Its own repository: the same layers as the pushed cell (cached), other labels.
        cli("build", CELL, "-f", str(matrix))
        original = inspect(image)
        assert original is not None
        spec = original["Config"]["Labels"]["io.gpuenv.spec-hash"]
        push = cli("push", CELL, "-f", str(matrix), "--registry", f"{registry.host}/x",
                   "--json")  # fmt: skip
        assert results_by_ref(push)[published]["status"] == "pushed"
        docker_cmd("rmi", image, published)
        assert inspect(original["Id"]) is None

        # The registry is down: the pull fails, gpuenv says so and builds (from the cache).
        key = {"GPUENV_VERIFY_KEY": str(public)}
        down = {"GPUENV_REGISTRY": f"127.0.0.1:{free_port()}/x", **key}
        proc = cli("build", CELL, "-f", str(matrix), "--json", env=down)
        assert json.loads(proc.stdout)["results"][0]["status"] == "built"
        assert "not pulled" in proc.stderr
        docker_cmd("rmi", image)

        # Published with the same spec hash, unsigned: not adopted; built.
        env = {"GPUENV_REGISTRY": f"{registry.host}/x", **key}
        proc = cli("build", CELL, "-f", str(matrix), "--json", env=env)
        (result,) = json.loads(proc.stdout)["results"]
        assert result["status"] == "built", proc.stderr
        assert "not adopted" in proc.stderr and "no attestations" in proc.stderr, proc.stderr
        got = inspect(image)
        assert got is not None and got["Config"]["Labels"]["io.gpuenv.spec-hash"] == spec
        assert inspect(published) is None  # nothing of the registry's left tagged
        docker_cmd("rmi", image)
        # No key: nothing is pulled at all, and gpuenv says why.
        proc = cli("build", CELL, "-f", str(matrix), "--json",
                   env={"GPUENV_REGISTRY": f"{registry.host}/x"})  # fmt: skip
        assert json.loads(proc.stdout)["results"][0]["status"] == "built"
        assert "set $GPUENV_VERIFY_KEY" in proc.stderr
    finally:
        docker_cmd("rmi", image, check=False)
        docker_cmd("rmi", published, check=False)


def test_a_published_image_with_another_spec_hash_is_not_pulled(cli, pushed, registry, tmp_path):
    """The candidate's spec hash is read from the registry (manifest + config blob, a few
    KB): another hash means no pull at all. Proof from the engine itself: its event log has
    no pull of the reference, and the candidate's image never reaches it."""
    matrix = cell_matrix(tmp_path, name=PEEK)
    image = f"{PEEK}:{CELL}"
    candidate = f"{registry.host}/x/peek:{CELL}"
    context = tmp_path / "candidate"
    context.mkdir()
    (context / "Dockerfile").write_text(
        f"FROM {IMAGE}\nLABEL io.gpuenv.spec-hash={'0' * 64} io.gpuenv.cell={CELL}\n"
    )
    try:
        docker_cmd("build", "--network", "none", "-q", "-t", candidate, str(context))
        candidate_id = inspect(candidate)["Id"]
        docker_cmd("push", candidate)
        docker_cmd("rmi", candidate)
        assert inspect(candidate_id) is None  # only the registry has it now
        since = str(int(time.time()) - 1)
        # A publisher's key, so that pull before build looks at all (issue 35, M1: without
        # one it pulls nothing); the spec hash read from the registry stops it first.
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        public = tmp_path / "publisher.pub"
        key = ec.generate_private_key(ec.SECP256R1()).public_key()
        pem = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        public.write_bytes(key.public_bytes(*pem))
        env = {"GPUENV_REGISTRY": f"{registry.host}/x", "GPUENV_VERIFY_KEY": str(public)}
        proc = cli("build", CELL, "-f", str(matrix), "--json", env=env)
        (result,) = json.loads(proc.stdout)["results"]
        assert result["status"] == "built", proc.stderr
        events = docker_cmd(
            "events", "--since", since, "--until", str(int(time.time()) + 1),
            "--filter", "type=image", "--filter", "event=pull", "--format", "{{.Actor.ID}}",
        ).stdout  # fmt: skip
        assert "peek" not in events, f"the engine pulled it: {events}"
        assert inspect(candidate_id) is None and inspect(candidate) is None
        assert "another spec hash (read from the registry; not pulled)" in proc.stderr
    finally:
        docker_cmd("rmi", image, check=False)
        docker_cmd("rmi", candidate, check=False)


def test_registry_value_is_checked(cli, tmp_path):
    proc = cli("push", CELL, "--registry", "bad registry", check=False)
    assert proc.returncode == 2
    assert "expected HOST[:PORT][/NAMESPACE]" in proc.stderr
    matrix = cell_matrix(tmp_path, name=PUSHPULL)
    proc = cli("build", CELL, "-f", str(matrix), env={"GPUENV_REGISTRY": "Bad/UPPER"},
               check=False)  # fmt: skip
    assert proc.returncode == 1
    no_traceback(proc)
    assert "error: $GPUENV_REGISTRY='Bad/UPPER': expected HOST[:PORT][/NAMESPACE]" in proc.stderr
    assert inspect(f"{PUSHPULL}:{CELL}") is None  # checked before anything was built
