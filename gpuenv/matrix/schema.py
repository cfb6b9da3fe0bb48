"""The matrix.yaml schema and its expansion into raw combinations.

The schema is strict: unknown keys, wrong types, versions YAML read as numbers and values
that could smuggle Dockerfile or shell syntax are refused here, with the line they are on.
Expansion follows GitHub Actions: the product of the axes, minus ``exclude``, then
``include`` extends matching combinations or adds new ones. Each framework axis
(``tensorflow``, ``torch``, ``jax``) makes its own product with the shared ``python`` and
``variant`` axes; a combination is of exactly one framework. What the catalog makes of each
combination is catalog/compat.py's business.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictStr,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from gpuenv.matrix import yamlfile
from gpuenv.matrix.errors import MatrixError
from gpuenv.matrix.index_url import check_index_url
from gpuenv.matrix.requirements import pip_requirement

if TYPE_CHECKING:
    from gpuenv.matrix.requirements import RequirementsFile

FRAMEWORK_KEYS = ("tensorflow", "torch", "jax")
AXES = (*FRAMEWORK_KEYS, "python", "variant", "arch")

# Everything below ends up in a Dockerfile or on a command line, so each pattern admits
# only what the value needs, never quotes, whitespace, `;`, `&`, `$`, backslashes or newlines.
# [0-9], never \d: \d matches any Unicode digit (fullwidth, Arabic-Indic), as int() does.
_VERSION = r"[0-9]+\.[0-9]+(\.[0-9]+)?"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_CELL_PATTERN = r"[A-Za-z0-9_.*?\[\]-]{1,128}"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9-]+)*(?::[0-9]+)?/)"
_REPOSITORY = re.compile(rf"{_DOMAIN}?{_COMPONENT}(?:/{_COMPONENT})*")
_IMAGE_REF = re.compile(
    rf"{_DOMAIN}?{_COMPONENT}(?:/{_COMPONENT})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
    r"(?:@sha256:[a-f0-9]{64})?"
)
_SUITE = r"[a-z][a-z0-9-]{1,30}"
_APT = r"[a-z0-9][a-z0-9+.-]+(?:=[A-Za-z0-9.+~:-]+)?"


def _matching(pattern: str, what: str) -> AfterValidator:
    """A value the whole of `pattern` matches, else "<value> is not <what>"."""
    regex = re.compile(pattern)

    def check(value: str) -> str:
        if not regex.fullmatch(value):
            raise ValueError(f"{value!r} is not {what}")
        return value

    return AfterValidator(check)


def _requirements_path(value: str) -> str:
    from gpuenv.matrix.requirements import check_written_path

    return check_written_path(value)


def _image(value: str) -> str:
    if not _IMAGE_REF.fullmatch(value) or len(value) > 255:
        raise ValueError(
            f"{value!r} is not an image reference like python:3.11-slim-bookworm@sha256:<digest>"
        )
    return value


def _repository(value: str) -> str:
    first, _, rest = value.partition("/")
    # As Docker reads it: the first component is a registry host only when it has a '.'
    # or ':' or is localhost; anything else must be lowercase.
    host_like = rest and ("." in first or ":" in first or first == "localhost")
    if not host_like and first != first.lower():
        raise ValueError(f"{value!r}: image repositories are lowercase (e.g. acme/gpuenv)")
    if not _REPOSITORY.fullmatch(value) or len(value) > 200:
        raise ValueError(
            f"{value!r} is not an image repository (lowercase letters, digits, '.', '_', '-' "
            "and '/' separated components, e.g. acme/gpuenv)"
        )
    return value


Version = Annotated[StrictStr, _matching(_VERSION, 'a version like "3.11" or "2.21"')]
ImageTag = Annotated[StrictStr, _matching(_TAG, "an image tag (letters, digits, '_', '.', '-')")]
CellPattern = Annotated[StrictStr, _matching(_CELL_PATTERN, "a cell name or glob")]
PipRequirement = Annotated[StrictStr, AfterValidator(pip_requirement)]
RequirementsPath = Annotated[StrictStr, AfterValidator(_requirements_path)]
AptPackage = Annotated[
    StrictStr, _matching(_APT, "a Debian package name (optionally name=version)")
]
ImageRef = Annotated[StrictStr, AfterValidator(_image)]
Repository = Annotated[StrictStr, AfterValidator(_repository)]
Suite = Annotated[StrictStr, _matching(_SUITE, "a Debian suite name like bookworm")]
IndexUrl = Annotated[StrictStr, AfterValidator(check_index_url)]
Variant = Literal["cpu", "gpu"]
# Architectures as Docker and Kubernetes name them (linux/amd64, kubernetes.io/arch=arm64).
Arch = Literal["amd64", "arm64"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _one_framework(entry: BaseModel, what: str) -> None:
    named = [k for k in FRAMEWORK_KEYS if getattr(entry, k) is not None]
    if len(named) > 1:
        raise ValueError(
            f"{what} names {' and '.join(named)}; a cell is of one framework, so name one "
            "(use one entry per framework)"
        )


class _Keys(_Strict):
    """The keys of a combination, each optional: what exclude and include entries match."""

    tensorflow: Version | None = None
    torch: Version | None = None
    jax: Version | None = None
    python: Version | None = None
    variant: Variant | None = None
    arch: Arch | None = None


class Exclude(_Keys):
    """A partial combination; every combination that matches all its keys is removed."""

    @model_validator(mode="after")
    def _not_empty(self) -> Exclude:
        if not self.model_dump(exclude_none=True):
            raise ValueError(
                "an exclude entry needs at least one of tensorflow, torch, jax, python, "
                "variant, arch"
            )
        _one_framework(self, "an exclude entry")
        return self


class Include(_Keys):
    """Extends the combinations it matches, or adds one (GitHub Actions semantics)."""

    cuda: Version | None = Field(None, description="CUDA major.minor for a GPU cell, e.g. 12.8")
    cudnn: Version | None = Field(None, description="cuDNN major.minor for a GPU cell, e.g. 9.3")
    pip: list[PipRequirement] = Field(default_factory=list, description="extra pip packages")
    apt: list[AptPackage] = Field(default_factory=list, description="extra Debian packages")
    requirements: list[RequirementsPath] = Field(
        default_factory=list, description="requirements files (relative to this file)"
    )

    @model_validator(mode="after")
    def _framework(self) -> Include:
        _one_framework(self, "an include entry")
        return self


class Axes(_Strict):
    tensorflow: list[Version] | None = Field(
        None, min_length=1, description="TensorFlow major.minor versions"
    )
    torch: list[Version] | None = Field(
        None, min_length=1, description="PyTorch major.minor versions"
    )
    jax: list[Version] | None = Field(None, min_length=1, description="JAX major.minor versions")
    python: list[Version] = Field(min_length=1, description="Python major.minor versions")
    variant: list[Variant] = Field(default_factory=lambda: ["cpu"], min_length=1)
    arch: list[Arch] = Field(
        default_factory=lambda: ["amd64"],
        min_length=1,
        description="CPU architectures: amd64, arm64 (arm64 cells are named <cell>-arm64)",
    )
    exclude: list[Exclude] = Field(default_factory=list)
    include: list[Include] = Field(default_factory=list)

    @field_validator("tensorflow", "torch", "jax", "python", "variant", "arch")
    @classmethod
    def _unique(cls, values: list[str] | None) -> list[str] | None:
        if values is not None and len(set(values)) != len(values):
            raise ValueError(f"values repeat: {values}")
        return values

    @model_validator(mode="after")
    def _a_framework(self) -> Axes:
        if not any(getattr(self, k) for k in FRAMEWORK_KEYS) and not self.include:
            raise ValueError(
                "the matrix has no framework axis; add one of tensorflow, torch, jax "
                '(e.g. torch: ["2.11"])'
            )
        return self


class Default(_Strict):
    """The cells `gpuenv run` picks without a cell name: one framework release and Python."""

    tensorflow: Version | None = None
    torch: Version | None = None
    jax: Version | None = None
    python: Version

    @model_validator(mode="after")
    def _exactly_one(self) -> Default:
        named = [k for k in FRAMEWORK_KEYS if getattr(self, k) is not None]
        if len(named) != 1:
            raise ValueError(
                "default names exactly one framework (tensorflow, torch or jax) and a python, "
                'e.g. {torch: "2.11", python: "3.12"}'
            )
        return self

    def framework(self) -> tuple[str, str]:
        """(framework, version) the default names."""
        key = next(k for k in FRAMEWORK_KEYS if getattr(self, k) is not None)
        return key, str(getattr(self, key))


class DebianBase(_Strict):
    debian: Suite = Field(description="Debian suite bootstrapped locally with mmdebstrap")


class ImageBase(_Strict):
    image: ImageRef = Field(description="a Debian-family image providing the Python version")
    # Docker's classic image store (Engine 20.10 and later without the containerd store)
    # holds one architecture per tag, so arm64 cells name their own image.
    arm64: ImageRef | None = Field(
        None, description="the arm64 cells' base, where it is another tag (default: image)"
    )


def _base_kind(value: Any) -> str | None:
    """Which kind of base a mapping is, so errors come from that kind only (an invalid image
    reference must not be reported as a missing ``debian`` key)."""
    if isinstance(value, (DebianBase, ImageBase)):
        return type(value).__name__
    if isinstance(value, dict):
        kinds = [k for k in ("debian", "image") if k in value]
        if len(kinds) == 1:
            return "DebianBase" if kinds == ["debian"] else "ImageBase"
    return None


BaseSpec = Annotated[
    Annotated[DebianBase, Tag("DebianBase")] | Annotated[ImageBase, Tag("ImageBase")],
    Discriminator(
        _base_kind,
        custom_error_type="base_kind",
        custom_error_message="a base is exactly one of debian: <suite> or image: <reference>",
    ),
]


def _group_name(value: str) -> str:
    # PEP 685 extra names and PEP 735 group names: letters, digits, '.', '_', '-'.
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,98}[A-Za-z0-9])?", value):
        raise ValueError(f"{value[:80]!r} is not an extra or dependency group name")
    return value


GroupName = Annotated[StrictStr, AfterValidator(_group_name)]


class Pyproject(_Strict):
    file: RequirementsPath = Field(
        "pyproject.toml", description="the project's pyproject.toml (relative to this file)"
    )
    extras: list[GroupName] = Field(
        default_factory=list, description="[project.optional-dependencies] to add"
    )
    groups: list[GroupName] = Field(
        default_factory=list, description="PEP 735 [dependency-groups] to add"
    )
    install_project: bool = Field(
        False,
        description="also build the project itself (the pyproject.toml's directory) into a "
        "wheel and install it into the image (non-editable)",
    )


class Packages(_Strict):
    pyproject: Pyproject | None = Field(
        None,
        description="take the cells' packages from a pyproject.toml: [project] dependencies, "
        "and the extras and dependency groups named",
    )
    lock: RequirementsPath | None = Field(
        None,
        description="uv.lock or a PEP 751 pylock.toml whose versions and hashes constrain "
        "every cell's resolution (relative to this file, inside its directory)",
    )
    pip: list[PipRequirement] = Field(default_factory=list)
    apt: list[AptPackage] = Field(default_factory=list)
    requirements: list[RequirementsPath] = Field(
        default_factory=list,
        description="requirements files (relative to this file, inside its directory), "
        "read as pip reads them: markers per cell, -r/-c inside the directory, index "
        "options joining build.*; no direct references, local paths or credentials",
    )


class BuildOptions(_Strict):
    ca_bundle: str | None = Field(
        None,
        description="PEM bundle pip/uv trust during the build (relative to this file); "
        "never stored in the image. Default: $GPUENV_CA_BUNDLE, then $PIP_CERT",
    )
    index_url: IndexUrl | None = Field(None, description="package index replacing PyPI")
    extra_index_urls: list[IndexUrl] = Field(default_factory=list)
    torch_cpu_index: IndexUrl | None = Field(
        None,
        description="index holding PyTorch's +cpu wheels, for torch CPU cells; default: "
        "PyTorch's own, https://download.pytorch.org/whl/cpu (a mirror of it goes here)",
    )


class Matrix(_Strict):
    """A gpuenv build matrix (matrix.yaml)."""

    name: Repository = Field(description="image repository; tags are <name>:<cell>")
    matrix: Axes
    default: Default | None = None
    bases: dict[Version, BaseSpec] = Field(
        description="per Python version: {debian: suite} or {image: ref}"
    )
    packages: Packages = Field(default_factory=Packages)
    build: BuildOptions = Field(default_factory=BuildOptions)
    aliases: dict[ImageTag, CellPattern] = Field(
        default_factory=dict,
        description="moving tags pushed beside the cells' own, e.g. latest-gpu: "
        "tf2.21-py3.11-cuda12.5-gpu (a cell name, or a glob matching exactly one)",
    )


class LoadedMatrix:
    """A validated Matrix plus where it came from, for paths and error messages."""

    def __init__(self, model: Matrix, doc: yamlfile.YamlDocument) -> None:
        self.model = model
        self.doc = doc
        self.path = doc.path
        self.dir = doc.path.parent
        self.requirements: dict[str, RequirementsFile] = {}  # as written -> read and checked

    def read_requirements(self) -> None:
        """Read every requirements file the matrix names; an unusable one is an error
        naming its line in the matrix, or the file's own line for a refused requirement."""
        from gpuenv.matrix.localtree import project_excludes
        from gpuenv.matrix.requirements import RequirementsProblem, read, read_pyproject

        places: list[tuple[str, tuple[str | int, ...]]] = [
            (p, ("packages", "requirements", i))
            for i, p in enumerate(self.model.packages.requirements)
        ]
        for n, inc in enumerate(self.model.matrix.include):
            places += [(p, ("matrix", "include", n, "requirements", i))
                       for i, p in enumerate(inc.requirements)]  # fmt: skip
        source = self.model.packages.pyproject
        if source is not None:
            try:
                self.requirements[source.file] = read_pyproject(
                    source.file, self.dir, tuple(source.extras), tuple(source.groups),
                    install_project=source.install_project,
                    exclude=project_excludes(self.path.name),
                )  # fmt: skip
            except RequirementsProblem as exc:
                if exc.line is None:
                    raise self.error(exc.message, ("packages", "pyproject")) from None
                raise MatrixError(exc.path, exc.message, exc.line) from None
        if self.model.packages.lock is not None:
            from gpuenv.matrix import userlock

            written = self.model.packages.lock
            try:
                self.requirements[written] = userlock.read(written, self.dir)
            except RequirementsProblem as exc:
                if exc.line is None:
                    raise self.error(exc.message, ("packages", "lock")) from None
                raise MatrixError(exc.path, exc.message, exc.line) from None
        for written, loc in places:
            if written in self.requirements:
                continue
            try:
                self.requirements[written] = read(written, self.dir)
            except RequirementsProblem as exc:
                if exc.line is None:
                    raise self.error(exc.message, loc) from None
                where = exc.path if isinstance(exc.path, Path) else self.dir / exc.path
                raise MatrixError(where, exc.message, exc.line) from None
        self._take_indexes()

    def _take_indexes(self) -> None:
        """Requirements files' --index-url/--extra-index-url join build.* (and so the same
        credential and CA rules); an --index-url other than the matrix's is an error."""
        build = self.model.build
        index_url, extra = build.index_url, list(build.extra_index_urls)
        for f in self.requirements.values():
            if f.index_url is not None:
                url, line = f.index_url
                if index_url is not None and index_url != url:
                    mine = (
                        f"the matrix's build.index_url {index_url}"
                        if build.index_url
                        else f"--index-url {index_url} of another requirements file"
                    )
                    raise MatrixError(
                        line.path,
                        f"--index-url {url} conflicts with {mine}; pip would take all "
                        "packages from one index: keep one (build.index_url, or this line)",
                        line.number,
                    )
                index_url = url
            extra += [url for url, _ in f.extra_index_urls if url not in extra]
        if (index_url, extra) != (build.index_url, list(build.extra_index_urls)):
            new_build = build.model_copy(update={"index_url": index_url, "extra_index_urls": extra})
            self.model = self.model.model_copy(update={"build": new_build})

    def requirement_files(self, paths: list[str] | tuple[str, ...]) -> list[RequirementsFile]:
        return [self.requirements[p] for p in paths]

    def error(self, message: str, loc: tuple[str | int, ...] = ()) -> MatrixError:
        return MatrixError(self.path, message, self.doc.line_of(loc) if loc else None)


def load(path: Path) -> LoadedMatrix:
    doc = yamlfile.load(path)
    if not isinstance(doc.data, dict):
        message = "expected a mapping with name, matrix, bases (see docs/matrix.md)"
        raise MatrixError(path, message, 1)
    try:
        model = Matrix.model_validate(doc.data)
    except ValidationError as exc:
        raise _schema_error(exc, doc) from None
    loaded = LoadedMatrix(model, doc)
    loaded.read_requirements()
    return loaded


def _schema_error(exc: ValidationError, doc: yamlfile.YamlDocument) -> MatrixError:
    """The first schema error as one line, with the YAML line it points at. An unknown key
    comes before a missing one: `pyhton:` is the typo, `python` missing only its effect."""
    errors = exc.errors()
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = tuple(p for p in err["loc"] if isinstance(p, (str, int)))
    # Union members show up in the loc as their class names; drop them.
    loc = tuple(p for p in loc if p not in ("DebianBase", "ImageBase"))
    where = ".".join(str(p) for p in loc) or "top level"
    node = doc.node_at(loc)
    line = doc.line_of(loc)
    value = err.get("input")
    kind = err["type"]
    if kind == "extra_forbidden":
        message = f"unknown key {where!r}; check the spelling (docs/matrix.md lists every key)"
        if loc[:1] in (("matrix",), ("default",)):
            message += "; the framework keys are tensorflow, torch, jax"
    elif kind == "missing":
        message = f"missing required key {where!r}"
    elif kind == "string_type" and isinstance(value, (int, float)) and not isinstance(value, bool):
        written = node.value if isinstance(node, yaml.ScalarNode) else str(value)
        message = (
            f'{where}: YAML reads {written} as the number {value!r}; quote versions: "{written}"'
        )
    elif kind == "literal_error":
        # pydantic says "'cpu' or 'gpu'"; gpuenv's errors list the choices plainly.
        expected = str(err.get("ctx", {}).get("expected") or "cpu, gpu")
        expected = expected.replace("'", "").replace(" or ", ", ")
        message = f"{where}: {value!r} is not one of {expected}"
    else:
        text = err["msg"].removeprefix("Value error, ")
        message = f"{where}: {text}"
    return MatrixError(doc.path, message, line)


# ---------------------------------------------------------------------------- expansion

Combination = dict[str, Any]


def expand(m: LoadedMatrix) -> list[Combination]:
    """Product minus exclude, then include.

    Each framework axis makes its own product with python and variant, in the order
    tensorflow, torch, jax, each framework version's arch values side by side (so a cell and
    its -arm64 sibling are neighbours). Each combination carries ``_include`` (the index of
    the include entry that created or extended it, or None) so errors about an impossible
    include can point at it.
    """
    axes = m.model.matrix
    product = [
        {framework: version, "python": python, "variant": variant, "arch": arch}
        for framework in FRAMEWORK_KEYS
        for version, python, variant, arch in itertools.product(
            getattr(axes, framework) or [], axes.python, axes.variant, axes.arch
        )
    ]
    excluded: list[Combination] = []
    for i, ex in enumerate(axes.exclude):
        keys = ex.model_dump(exclude_none=True)
        if not any(_matches(c, keys) for c in product):
            raise m.error(
                f"exclude entry {i + 1} ({_describe(keys)}) matches no combination; remove it",
                ("matrix", "exclude", i),
            )
        excluded.extend(c for c in product if _matches(c, keys))
    combos: list[Combination] = [{**c, "_include": None} for c in product if c not in excluded]
    if not combos and not axes.include:
        raise m.error(
            "exclude removes every combination; the matrix would build nothing",
            ("matrix", "exclude"),
        )
    # As in GitHub Actions, an include extends only combinations of the product; one that
    # an earlier include added is never extended by a later one (the later one adds its own).
    # An include naming a framework extends only that framework's combinations; one naming
    # none (python: "3.11", apt: [...]) extends matching combinations of every framework.
    product_combos = list(combos)
    for i, inc in enumerate(axes.include):
        values = inc.model_dump(exclude_none=True, exclude_defaults=True)
        values.update(
            {k: getattr(inc, k) for k in ("pip", "apt", "requirements") if getattr(inc, k)}
        )
        framework = next((k for k in FRAMEWORK_KEYS if k in values), None)
        extended = False
        for combo in product_combos:
            if framework is not None and framework not in combo:
                continue
            original = {k: combo[k] for k in AXES if k in combo}
            # Add to a combination only when no original axis value would be overwritten.
            if all(values[k] == v for k, v in original.items() if k in values):
                combo.update(values)
                combo["_include"] = i
                extended = True
        if not extended:
            missing = []
            if framework is None:
                missing.append("a framework (tensorflow, torch or jax)")
            if "python" not in values:
                missing.append("python")
            if missing:
                raise m.error(
                    f"include entry {i + 1} matches no combination and lacks "
                    f"{', '.join(missing)} to stand alone as a new cell",
                    ("matrix", "include", i),
                )
            combos.append({"variant": "cpu", "arch": "amd64", **values, "_include": i})
    return combos


def _matches(combo: Combination, keys: dict[str, Any]) -> bool:
    return all(combo.get(k) == v for k, v in keys.items())


def _describe(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in values.items())


def json_schema() -> dict[str, Any]:
    schema = Matrix.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "gpuenv matrix.yaml"
    return schema


if __name__ == "__main__":  # python -m gpuenv.matrix.schema > gpuenv/data/matrix.schema.json
    import json

    print(json.dumps(json_schema(), indent=2, sort_keys=True))
