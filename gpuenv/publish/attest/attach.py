"""`gpuenv push --attest --key KEY.pem`: after the push, each pushed manifest gets two signed
attestations (an SBOM statement and a SLSA provenance statement), stored beside it in the
registry (gpuenv/publish/attest/oci.py). Tags of one image (a cell and its aliases) share one
manifest digest, which is attested once."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpuenv import __version__
from gpuenv.matrix import contract
from gpuenv.matrix.errors import GpuenvError

if TYPE_CHECKING:
    from gpuenv.engine.client import Engine, ImageInfo
    from gpuenv.project.project import Project


@dataclass
class Attested:
    ref: str
    digest: str  # the image manifest's
    artifacts: list[tuple[str, str]]  # (predicate type, artifact manifest digest)
    not_attested: str = ""  # why nothing was signed (an image pulled, not built here)

    def to_json(self) -> dict[str, Any]:
        return {
            "ref": self.ref,
            "digest": self.digest,
            "artifacts": [{"predicate_type": t, "digest": d} for t, d in self.artifacts],
            **({"not_attested": self.not_attested} if self.not_attested else {}),
        }


def file_digest(path: Path) -> str:
    """sha256 hex of the matrix's or the lock's bytes ("" when it does not exist), read by
    the one bounded reader of user-named files, as loading them did."""
    from gpuenv.matrix.files import read_regular
    from gpuenv.store.cache import MAX_INPUT_BYTES

    try:
        data = read_regular(path, MAX_INPUT_BYTES)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise GpuenvError(f"{path}: cannot read ({exc.strerror})") from None
    if len(data) > MAX_INPUT_BYTES:
        raise GpuenvError(f"{path}: larger than {MAX_INPUT_BYTES >> 20} MiB")
    return hashlib.sha256(data).hexdigest()


def is_canonical(project: Project, info: ImageInfo) -> bool:
    """Whether the image is in --reproducible's canonical form: the same test the build
    makes (its `created` is the epoch the lock's date gives)."""
    from gpuenv.building.base import SOURCE_DATE_EPOCH
    from gpuenv.building.reproducible import epoch_for, is_normalized

    exclude_newer = project.lock.exclude_newer if project.lock else None
    return is_normalized(info, epoch_for(exclude_newer, int(SOURCE_DATE_EPOCH)))


def base_of(info: ImageInfo) -> tuple[str, str]:
    """(base image name, base image ID) from the image's labels."""
    try:
        inputs = json.loads(info.labels.get(contract.INPUTS, "") or "{}")
    except ValueError:
        inputs = {}
    return info.labels.get(f"{contract.OCI}.base.name", ""), str(inputs.get("base", ""))


def lock_texts(project: Project, cell: str) -> list[str]:
    entry = project.lock.cells.get(cell) if project.lock else None
    return [entry.python_env, entry.cuda] if entry else []


def statements(
    project: Project, info: ImageInfo, contents: Any, name: str, digest: str, fmt: str
) -> list[tuple[str, bytes]]:
    """[(predicate type, statement bytes)]: the SBOM's and the provenance's."""
    from gpuenv.publish.attest import provenance, sbom

    cell = info.labels.get(contract.CELL, "")
    texts = lock_texts(project, cell)
    base_name, base_id = base_of(info)
    subject = sbom.Subject(name, info.id, info.created, dict(info.labels), base_name, base_id)
    document = json.loads(sbom.sbom(subject, contents, sbom.lock_hashes(texts), fmt))
    try:
        inputs = json.loads(info.labels.get(contract.INPUTS, "") or "{}")
    except ValueError:
        inputs = {}
    facts = provenance.BuildFacts(
        cell=cell, spec_hash=info.labels.get(contract.SPEC_HASH, ""), image_id=info.id,
        matrix_path=project.path.name, matrix_digest=file_digest(project.path),
        lock_digest=file_digest(project.lock_path) if texts else "",
        base_name=base_name, base_id=base_id, gpuenv_version=__version__,
        builder_id=provenance.builder_id(), reproducible=is_canonical(project, info),
        inputs={str(k): str(v) for k, v in inputs.items()},
        locked=provenance.locked_entries(texts), recipe=info.labels.get(contract.RECIPE, ""),
    )  # fmt: skip
    sbom_type = sbom.PREDICATE_TYPES[fmt]
    return [
        (sbom_type, provenance.statement(name, digest, sbom_type, document)),
        (provenance.SLSA_PROVENANCE, provenance.statement(
            name, digest, provenance.SLSA_PROVENANCE, provenance.slsa_predicate(facts))),
    ]  # fmt: skip


class Pushed(Protocol):
    """What a push reports per tag (gpuenv/publish/push.py: TagResult), as attesting reads it."""

    ref: str
    status: str
    digest: str | None
    platforms: list[str]


def pushed_image_id(registry: Any, digest: str) -> str | None:
    """The image ID (config digest) of the image manifest `digest`, as the registry holds it."""
    found = registry.manifest(digest)
    try:
        config = json.loads(found[0]).get("config") if found else None
    except (ValueError, AttributeError):
        return None
    value = config.get("digest") if isinstance(config, dict) else None
    return value if isinstance(value, str) and value.startswith("sha256:") else None


def attest_pushed(
    engine: Engine, project: Project, results: Sequence[Pushed], signer: Any,
    fmt: str = "cyclonedx",
) -> list[Attested]:  # fmt: skip
    """Attach the signed statements to every pushed manifest (once per digest)."""
    from gpuenv.publish.attest import dsse, oci
    from gpuenv.publish.attest.contents import read_contents
    from gpuenv.store.cache import read_record

    pulled = read_record("pulled")  # gpuenv/building/pull.py's PULLED_RECORD

    done: dict[tuple[str, str], Attested] = {}
    out = []
    for r in results:
        if r.status != "pushed" or not r.digest or r.platforms:
            continue  # a multi-platform index: the images it names are attested
        repo = r.ref.rsplit(":", 1)[0]
        if (repo, r.digest) in done:
            continue
        registry = oci.Repository(f"{repo}@{r.digest}")
        subject = registry.subject()
        # What was pushed, by content: the manifest's config digest is the image ID. The tag
        # may name another image by now (a concurrent build of the cell), and its SBOM
        # would be signed for this digest (issue 35, M4).
        image_id = pushed_image_id(registry, r.digest)
        if image_id is None:
            raise GpuenvError(f"--attest: {r.ref}@{r.digest[:19]}: the registry has no image "
                              "manifest there to attest")  # fmt: skip
        if isinstance(pulled.get(image_id), str):
            # Its provenance is its publisher's (verified when it was pulled); signing one
            # here would say this machine built it (issue 35, M1).
            done[(repo, r.digest)] = Attested(r.ref, r.digest, [], not_attested=(
                f"pulled from {pulled[image_id]}, not built here: its publisher's "
                "attestations are there"))  # fmt: skip
            out.append(done[(repo, r.digest)])
            continue
        if engine.image(image_id) is None:
            raise GpuenvError(f"--attest: {r.ref} was pushed as image {image_id[:19]}, which "
                              "the engine no longer has (built again?); push again")  # fmt: skip
        info, contents = read_contents(engine, image_id)
        attested = Attested(r.ref, r.digest, [])
        for predicate_type, body in statements(project, info, contents, repo, r.digest, fmt):
            envelope = dsse.sign(body, signer)
            artifact = registry.attach(subject, envelope,
                                       {oci.PREDICATE_ANNOTATION: predicate_type})  # fmt: skip
            attested.artifacts.append((predicate_type, artifact))
        done[(repo, r.digest)] = attested
        out.append(attested)
    if not out and any(r.status == "pushed" for r in results):
        raise GpuenvError("--attest: the push reported no manifest digest to attest")
    return out


def sbom_for(engine: Engine, target: str, file: Path | None, fmt: str) -> bytes:
    """`gpuenv sbom CELL|IMAGE`: the document of a cell's image (with its lock's hashes) or
    of any image the engine has."""
    from gpuenv.project.project import looks_like_image, open_project
    from gpuenv.publish.attest import sbom
    from gpuenv.publish.attest.contents import read_contents

    if fmt not in sbom.FORMATS:
        raise GpuenvError(f"--format {fmt!r}: expected one of {', '.join(sbom.FORMATS)}",
                          exit_code=2)  # fmt: skip
    texts: list[str] = []
    if looks_like_image(target):
        ref = target
    else:
        project = open_project(file)
        cell = project.one_cell(target, "CELL")
        ref, texts = cell.image, lock_texts(project, cell.name)
    info, contents = read_contents(engine, ref)
    base_name, base_id = base_of(info)
    subject = sbom.Subject(ref, info.id, info.created, dict(info.labels), base_name, base_id)
    return sbom.sbom(subject, contents, sbom.lock_hashes(texts), fmt)
