"""`gpuenv diff A B`: what differs between two environments (images or cells).

Each side is inventoried from a container of its image: pip packages, Debian packages,
environment, labels, size, and every file outside the volatile places (path, mode, owner,
size, sha256). Two builds of one cell from the same lock and base should come out
"identical".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuenv.matrix import contract
from gpuenv.matrix.errors import GpuenvError

if TYPE_CHECKING:
    from gpuenv.engine.client import Engine

# Places whose contents change on every start or build, or are Docker's own mounts.
VOLATILE = ("/proc", "/sys", "/dev", "/tmp", "/run", "/var/cache", "/var/log", "/var/tmp")
DOCKER_FILES = ("/etc/hostname", "/etc/hosts", "/etc/resolv.conf", "/.dockerenv")
# Labels that name the build itself rather than its contents.
IDENTITY_LABELS = (contract.SPEC_HASH, contract.INPUTS)

INVENTORY = r"""
import hashlib, json, os, stat, subprocess, sys
volatile, docker = json.loads(sys.argv[1]), json.loads(sys.argv[2])
files = {}
for root, dirs, names in os.walk('/'):
    dirs[:] = sorted(d for d in dirs if os.path.join(root, d) not in volatile)
    # os.walk lists links to directories (merged-usr's /bin, a venv's lib64) as directories
    # and does not follow them: record them as the links they are.
    links = [d for d in dirs if os.path.islink(os.path.join(root, d))]
    dirs[:] = [d for d in dirs if d not in links]
    for name in names + links:
        path = os.path.join(root, name)
        if path in docker:
            continue
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            digest = 'link:' + os.readlink(path)
        elif stat.S_ISREG(st.st_mode):
            h = hashlib.sha256()
            with open(path, 'rb') as fh:
                for block in iter(lambda: fh.read(1 << 20), b''):
                    h.update(block)
            digest = h.hexdigest()
        else:
            digest = 'special'
        files[path] = '%o %d:%d %d %s' % (st.st_mode, st.st_uid, st.st_gid, st.st_size, digest)
pip = {}
try:
    import importlib.metadata as md
    for dist in md.distributions():
        pip[dist.metadata['Name'].lower()] = dist.version
except Exception:
    pass
try:
    out = subprocess.run(['dpkg-query', '-W', '-f', '${Package} ${Version}\n'],
                         capture_output=True, text=True).stdout
    apt = dict(line.split(' ', 1) for line in out.splitlines() if ' ' in line)
except OSError:
    apt = {}
print(json.dumps({'files': files, 'pip': pip, 'apt': apt}))
"""


SIZE_NOISE = 100_000  # bytes: less than the 0.1 MB the report shows


@dataclass
class Inventory:
    ref: str
    image_id: str
    size: int
    env: dict[str, str]
    labels: dict[str, str]
    pip: dict[str, str] = field(default_factory=dict)
    apt: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)


def inventory(engine: Engine, ref: str) -> Inventory:
    from gpuenv.engine.client import ContainerSpec

    info = engine.image(ref)
    if info is None:
        raise GpuenvError(f"image {ref} not found; build it or give another image")
    env = info.env_map
    spec = ContainerSpec(ref, ["sleep", "infinity"], network="none", init=True,
                         labels=contract.container_labels("diff"))  # fmt: skip
    cid = engine.create(spec)
    try:
        engine.start(cid)
        # The venv's python, if any, sees the environment's packages; as root to read all.
        python = env.get("VIRTUAL_ENV", "") + "/bin/python" if "VIRTUAL_ENV" in env else "python3"
        code, out = engine.exec(
            cid,
            [python, "-c", INVENTORY, json.dumps(list(VOLATILE)), json.dumps(list(DOCKER_FILES))],
            user="0",
        )
        if code != 0:
            raise GpuenvError(f"cannot inventory {ref}: python exited {code}")
        data = json.loads(out)
    finally:
        engine.remove_container(cid)
    return Inventory(
        ref=ref,
        image_id=info.id,
        size=info.size,
        env=env,
        labels=dict(info.labels),
        pip=data["pip"],
        apt=data["apt"],
        files=data["files"],
    )


def _compare(a: dict[str, str], b: dict[str, str]) -> dict[str, list[Any]]:
    return {
        "only_a": sorted(k for k in a if k not in b),
        "only_b": sorted(k for k in b if k not in a),
        "changed": [[k, a[k], b[k]] for k in sorted(a) if k in b and a[k] != b[k]],
    }


def compare(a: Inventory, b: Inventory) -> dict[str, Any]:
    """Sections with differences only; an empty dict means identical."""
    labels_a = {k: v for k, v in a.labels.items() if k not in IDENTITY_LABELS}
    labels_b = {k: v for k, v in b.labels.items() if k not in IDENTITY_LABELS}
    sections = {
        "pip": _compare(a.pip, b.pip),
        "apt": _compare(a.apt, b.apt),
        "env": _compare(a.env, b.env),
        "labels": _compare(labels_a, labels_b),
        "files": _compare(a.files, b.files),
    }
    out: dict[str, Any] = {k: v for k, v in sections.items() if any(v.values())}
    # The engine's size counts its layer archives' headers too, which BuildKit writes with
    # each build's timestamps: under SIZE_NOISE it is the same image content (the files are
    # compared one by one below), not a difference.
    if abs(a.size - b.size) >= SIZE_NOISE:
        out["size"] = [a.size, b.size]
    return out


def render_text(a: Inventory, b: Inventory, result: dict[str, Any], limit: int = 40) -> str:
    if not result:
        return f"identical: {a.ref} and {b.ref} hold the same environment"
    lines = [f"--- {a.ref} ({a.image_id[:19]})", f"+++ {b.ref} ({b.image_id[:19]})"]
    for section in ("pip", "apt", "env", "labels", "files"):
        diff = result.get(section)
        if not diff:
            continue
        count = sum(len(v) for v in diff.values())
        lines.append(f"{section}: {count} difference(s)")
        shown = 0
        for key in diff["only_a"]:
            if shown < limit:
                lines.append(f"  - {key}")
            shown += 1
        for key in diff["only_b"]:
            if shown < limit:
                lines.append(f"  + {key}")
            shown += 1
        for key, old, new in diff["changed"]:
            if shown < limit:
                lines.append(f"  ~ {key}: {old} -> {new}")
            shown += 1
        if shown > limit:
            lines.append(f"  ... and {shown - limit} more (--json lists all)")
    if "size" in result:
        sa, sb = result["size"]
        lines.append(f"size: {sa / 1e6:.1f} MB -> {sb / 1e6:.1f} MB ({(sb - sa) / 1e6:+.1f} MB)")
    return "\n".join(lines)


def diff_images(engine: Engine, a: str, b: str) -> tuple[Inventory, Inventory, dict[str, Any]]:
    """`gpuenv diff A B`: both inventories and their differences ({} when identical)."""
    left, right = inventory(engine, a), inventory(engine, b)
    return left, right, compare(left, right)
