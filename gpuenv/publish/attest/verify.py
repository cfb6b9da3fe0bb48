"""`gpuenv verify REF --key PUB.pem [--rebuild]`: find the image's attestations in its
registry, check every signature with the key, and say what they state.

It fails (one `error:` line, exit 1) when the image has no attestation, when none verifies
with the key, or when any one does not: an envelope whose signature fails, whose blob no
longer matches its digest, or whose statement names another image; and when either of the
two `push --attest` attaches (the SBOM, the provenance) is missing: whoever may write the
registry could otherwise remove one and verify would still pass. `--rebuild` then builds
the recorded cell again from the current project, whose matrix and lock must have the
digests the provenance records, with --reproducible and without the cache, and compares
the image ID with the pushed image's config digest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuenv.matrix.errors import GpuenvError

if TYPE_CHECKING:
    from gpuenv.building.pull import Vet
    from gpuenv.building.results import CellResult
    from gpuenv.engine.client import Engine
    from gpuenv.project.project import Project
    from gpuenv.publish.attest.provenance import Statement


@dataclass
class Verified:
    artifact: str  # the attestation manifest's digest
    statement: Statement


@dataclass
class Report:
    ref: str
    digest: str  # the image manifest's
    config: str  # its config digest: the image ID
    found_in: str
    verified: list[Verified] = field(default_factory=list)

    def provenance(self) -> Statement | None:
        from gpuenv.publish.attest.provenance import SLSA_PROVENANCE

        return next((v.statement for v in self.verified
                     if v.statement.predicate_type == SLSA_PROVENANCE), None)  # fmt: skip


def verify(ref: str, key_path: Path) -> Report:
    import json

    from gpuenv.publish.attest import dsse, oci, provenance

    key = dsse.load_public(key_path)
    repo = oci.Repository(ref)
    subject = repo.subject()
    manifest, _ = repo.manifest(subject.digest) or (b"{}", "")
    config = str((json.loads(manifest).get("config") or {}).get("digest", ""))
    descriptors, where = repo.referrers(subject.digest)
    ours = [d for d in descriptors if d.artifact_type == oci.ATTESTATION]
    if not ours:
        raise GpuenvError(f"{ref}: no attestations ({where}); push it with "
                          f"gpuenv push --attest --key KEY.pem")  # fmt: skip
    report = Report(ref, subject.digest, config, where)
    failures: list[str] = []
    for d in ours:
        short = d.digest[:19]
        envelope, why = repo.envelope(d)
        if envelope is None:
            failures.append(f"attestation {short}: {why}")
            continue
        try:
            payload_type, payload = dsse.verify(envelope, key)
            if payload_type != dsse.IN_TOTO:
                raise dsse.Unverified(f"payloadType {payload_type[:80]!r} is not in-toto")
            st = provenance.parse(payload)
        except (dsse.Unverified, provenance.NotAStatement) as exc:
            failures.append(f"attestation {short}: {exc}")
            continue
        if not st.names_digest(subject.digest):
            failures.append(f"attestation {short}: its statement names another image, "
                            f"not {subject.digest[:19]}")  # fmt: skip
            continue
        claimed = d.annotation(oci.PREDICATE_ANNOTATION)
        if claimed and claimed != st.predicate_type:
            failures.append(f"attestation {short}: annotated {claimed} but states "
                            f"{st.predicate_type}")  # fmt: skip
            continue
        report.verified.append(Verified(d.digest, st))
    prov = report.provenance()
    if prov is not None and config:
        recorded = _byproduct(prov.predicate, "image-config")
        if recorded and f"sha256:{recorded}" != config:
            failures.append(f"the provenance records image sha256:{recorded[:12]}, the "
                            f"registry serves {config[:19]}")  # fmt: skip
    from gpuenv.publish.attest.sbom import PREDICATE_TYPES

    kinds = {v.statement.predicate_type for v in report.verified}
    if report.verified and not kinds & set(PREDICATE_TYPES.values()):
        failures.append(
            "no SBOM attestation verifies (push --attest attaches one; was it removed?)"
        )
    if report.verified and provenance.SLSA_PROVENANCE not in kinds:
        failures.append("no provenance attestation verifies (push --attest attaches one; was "
                        "it removed?)")  # fmt: skip
    if failures and not report.verified:
        raise GpuenvError(f"{ref}: none of {len(ours)} attestation(s) verifies with "
                          f"{key_path} ({failures[0]})")  # fmt: skip
    if failures:
        raise GpuenvError(f"{ref}: {failures[0]}" + (f" (and {len(failures) - 1} more)"
                                                     if len(failures) > 1 else ""))  # fmt: skip
    return report


KEY_ENV = "GPUENV_VERIFY_KEY"  # the public key `verify` and pull before build check with


def pull_source(
    project: Project, offline: bool, say: Callable[[str], None]
) -> tuple[str | None, Vet | None]:
    """Where a build pulls published images from (REG/<last part of the matrix's name> for
    $GPUENV_REGISTRY=REG, gpuenv/building/pull.py) and the check each must pass (the key
    $GPUENV_VERIFY_KEY names); (None, None) offline, with no registry, or with no key to
    verify their provenance with (`say` says so). A malformed registry or an unreadable key
    is an error now, before the engine, not a build."""
    from gpuenv.registry.names import registry_from_env, target_repository

    registry = None if offline else registry_from_env()
    if not registry:
        return None, None
    repository = target_repository(project.settings.name, registry)
    vet = vetting_from_env()
    if vet is None:
        say(f"not pulling from {repository}: set ${KEY_ENV} to the publisher's public key, "
            "which a published image's provenance must verify with")  # fmt: skip
        return None, None
    return repository, vet


def vetting_from_env() -> Vet | None:
    """Pull before build's check of a published image (gpuenv/building/pull.py), with the key
    $GPUENV_VERIFY_KEY names; None when it is unset (then nothing is pulled). A key that
    cannot be read is an error now, not a reason to build every cell."""
    import os

    from gpuenv.publish.attest import dsse

    value = os.environ.get(KEY_ENV, "").strip()
    if not value:
        return None
    key_path = Path(value)
    dsse.load_public(key_path, f"${KEY_ENV}")

    def vet(ref: str, spec: str) -> tuple[str, str]:
        report = verify(ref, key_path)  # both attestations, each verified, for this digest
        prov = report.provenance()
        assert prov is not None, "verify requires a verified provenance"
        build = prov.predicate.get("buildDefinition") or {}
        recorded = str((build.get("internalParameters") or {}).get("specHash", ""))
        if recorded != spec:
            raise GpuenvError(f"its provenance records spec hash {recorded[:12] or 'none'}, "
                              f"not {spec[:12]}")  # fmt: skip
        image = _byproduct(prov.predicate, "image-config")
        if not image or f"sha256:{image}" != report.config:
            raise GpuenvError("its provenance records no image config, or another one")
        return f"{ref.rsplit(':', 1)[0]}@{report.digest}", report.config

    return vet


def _byproduct(predicate: dict[str, Any], name: str) -> str:
    for b in (predicate.get("runDetails") or {}).get("byproducts") or []:
        if isinstance(b, dict) and b.get("name") == name:
            return str((b.get("digest") or {}).get("sha256", ""))
    return ""


def lines(report: Report) -> list[str]:
    from gpuenv.publish.attest.provenance import describe

    out = [f"{report.ref}  {report.digest}  ({len(report.verified)} attestation(s), "
           f"{report.found_in})"]  # fmt: skip
    for v in report.verified:
        out.append(f"verified {v.statement.predicate_type}  {v.artifact[:19]}")
        out += [f"  {line}" for line in describe(v.statement)]
    return out


# ------------------------------------------------------------------------- --rebuild


def rebuild(
    engine: Engine, project: Project, report: Report,
    build_cells: Callable[..., list[CellResult]],
) -> str:  # fmt: skip
    """Build the recorded cell again (--reproducible, no cache) and compare; the image ID
    when it matches, an error naming what differs otherwise. `build_cells(cells, no_cache=,
    reproducible=)` is the builder's (gpuenv/building/builder.py: plan_and_build for this project),
    given by the verb: the builder sits above what it publishes and attests."""
    import json

    from gpuenv.matrix import contract
    from gpuenv.publish.attest.attach import file_digest

    prov = report.provenance()
    if prov is None:
        raise GpuenvError(f"{report.ref}: --rebuild needs a verified provenance attestation")
    build = prov.predicate.get("buildDefinition") or {}
    ext = build.get("externalParameters") or {}
    cell_name = str(ext.get("cell", ""))
    if not ext.get("reproducible"):
        raise GpuenvError(
            f"{report.ref}: the image was not built with --reproducible, so a rebuild "
            f"cannot give its digest; push a --reproducible build"
        )
    want = {"matrix": ((ext.get("matrix") or {}).get("digest") or {}).get("sha256", ""),
            "lock": ((ext.get("lock") or {}).get("digest") or {}).get("sha256", "")}  # fmt: skip
    have = {"matrix": file_digest(project.path), "lock": file_digest(project.lock_path)}
    for what, path in (("matrix", project.path), ("lock", project.lock_path)):
        if want[what] and want[what] != have[what]:
            raise GpuenvError(
                f"--rebuild: {path} is not the {what} that built {report.ref} (sha256:"
                f"{want[what][:12]} recorded, sha256:{(have[what] or 'missing')[:12]} here); "
                f"check out the commit that built it"
            )
    cell = project.one_cell(cell_name, "--rebuild")
    (result,) = build_cells([cell], no_cache=True, reproducible=True)
    if result.status == "failed" or not result.image_id:
        raise GpuenvError(f"--rebuild: building {cell_name} failed: {result.error}")
    expected = "sha256:" + _byproduct(prov.predicate, "image-config")
    if result.image_id == expected:
        return result.image_id
    recorded = (build.get("internalParameters") or {}).get("inputs") or {}
    info = engine.image(result.image_id)
    try:
        now = json.loads((info.labels if info else {}).get(contract.INPUTS, "") or "{}")
    except ValueError:
        now = {}
    differ = sorted(k for k in set(recorded) | set(now) if recorded.get(k) != now.get(k))
    what = (f"inputs that differ: {', '.join(differ)}" if differ else
            "the same inputs gave other files")  # fmt: skip
    # The image carries its recipe as a label, so under another recipe no rebuild gives its
    # ID: the way to reproduce it is the gpuenv that built it. Said after the rebuild all
    # the same, with the layer and files that differ, so the user sees what changed.
    why = _other_recipe(report.ref, prov.predicate)
    raise GpuenvError(f"--rebuild: not reproduced: {cell.image} is {result.image_id[:19]}, "
                      f"{report.ref} is {expected[:19]} ({what})"
                      + (f"; {why}" if why else ""),
                      details=_where(engine, report, result.image_id))  # fmt: skip


def _where(engine: Engine, report: Report, rebuilt: str) -> tuple[str, ...]:
    """The first layer where the rebuild parts from the published image, and its files.
    The published image is the engine's when it holds that very ID (an ID is a digest of
    the content: no tag is trusted), else pulled by its manifest digest for the comparison
    and removed after."""
    from gpuenv.building import layerfiles
    from gpuenv.building.pull import chunk_error

    published, pulled = report.config, False
    if engine.image(published) is None:
        name = report.ref.partition("@")[0]
        if ":" in name.rpartition("/")[2]:  # a tag (a registry's :port comes before a /)
            name = name.rpartition(":")[0]
        published, pulled = f"{name}@{report.digest}", True
        try:
            errors = [e for c in engine.pull(published) if (e := chunk_error(c))]
        except GpuenvError as exc:
            errors = [exc.message]
        info = engine.image(published)
        if errors or info is None or info.id != report.config:
            if info is not None:
                engine.remove_image(published)
            why = (errors or ["another image"])[0][:200]
            return (f"the published image could not be had to name the files that differ "
                    f"({why}): gpuenv diff names them",)  # fmt: skip
    try:
        return tuple(layerfiles.between(engine, published, rebuilt))
    finally:
        if pulled:
            engine.remove_image(published)


def _other_recipe(ref: str, predicate: dict[str, Any]) -> str | None:
    """Why this gpuenv cannot reproduce the image: the provenance records another recipe
    (gpuenv/building/recipe.py), or none (built before recipes were recorded: the gpuenv
    that attested it is the best guess at the one that built it). None when they agree."""
    from gpuenv.building.recipe import FIRST, current, from_label, reproduce_with

    now = current()
    internal = (predicate.get("buildDefinition") or {}).get("internalParameters") or {}
    then = from_label(str(internal.get("recipe") or ""))
    if then == now:
        return None
    if then is not None:
        return (f"{ref} was built by {then}; this is {now}: {reproduce_with(then, now)} "
                "and rebuild")  # fmt: skip
    builder = ((predicate.get("runDetails") or {}).get("builder") or {}).get("version") or {}
    attested = str(builder.get("gpuenv") or "") if isinstance(builder, dict) else ""
    how = f"pip install gpuenv=={attested} and rebuild" if attested else "rebuild with it"
    return (f"{ref} records no recipe: it was built by a gpuenv before {FIRST} (attested by "
            f"gpuenv {attested or '?'}); this is {now}: {how}")  # fmt: skip
