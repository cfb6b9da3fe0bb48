"""Which credential goes to which URL (gpuenv/store/credentials.py): each is bound to the one
origin, scheme://host:port, its source names, and only https URLs of exactly that origin get
it. The attack itself, against a recording index server, is
tests/integration/test_engine_index_credentials.py."""

from __future__ import annotations

import pytest

from gpuenv.matrix.errors import GpuenvError
from gpuenv.store import credentials
from gpuenv.store.fetch import refused


@pytest.fixture
def env(monkeypatch, tmp_path):
    """No netrc and no credential variables but those a test sets."""
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    for name in ("GPUENV_INDEX_USERNAME", "GPUENV_INDEX_PASSWORD", "GPUENV_INDEX_ORIGIN"):
        monkeypatch.delenv(name, raising=False)

    def set_(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)

    return set_


def netrc(monkeypatch, tmp_path, text: str) -> None:
    path = tmp_path / "netrc"
    path.write_text(text)
    path.chmod(0o600)
    monkeypatch.setenv("NETRC", str(path))


def user(creds: credentials.Credentials, url: str) -> str | None:
    found = creds.for_url(url)
    return None if found is None else found.username


def test_env_credentials_go_to_the_origin_named_and_no_index_a_matrix_lists(env):
    """H1: the pair went to every index of the matrix, the catalog's download.pytorch.org
    (a torch CPU cell) and any extra index a pull request adds included."""
    env(GPUENV_INDEX_USERNAME="u", GPUENV_INDEX_PASSWORD="p",
        GPUENV_INDEX_ORIGIN="https://private.example:8443")  # fmt: skip
    creds = credentials.load()
    assert user(creds, "https://private.example:8443/simple/x/") == "u"
    assert user(creds, "https://PRIVATE.example:8443/files/x.whl") == "u"
    for other in (
        "https://download.pytorch.org/whl/cpu/torch/",  # the catalog's torch CPU index
        "https://attacker.example/simple/x/",  # an extra index a matrix adds
        "https://pypi.org/simple/x/",
        "https://private.example/simple/x/",  # another port of the host
        "http://private.example:8443/simple/x/",  # plain http
        "https://private.example:8443@attacker.example/simple/",  # userinfo, not the host
        "https://attacker.example/?private.example:8443",
    ):
        assert user(creds, other) is None, other


PAIR = {"GPUENV_INDEX_USERNAME": "u", "GPUENV_INDEX_PASSWORD": "p"}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (PAIR, "without \\$GPUENV_INDEX_ORIGIN"),
        ({**PAIR, "GPUENV_INDEX_ORIGIN": "http://idx.example"}, "never sent over plain http"),
        ({**PAIR, "GPUENV_INDEX_ORIGIN": "https://idx.example/simple"}, "the origin alone"),
        ({**PAIR, "GPUENV_INDEX_ORIGIN": "idx.example"}, "the origin alone"),
        ({**PAIR, "GPUENV_INDEX_ORIGIN": "https://a@idx.example"}, "the origin alone"),
        ({**PAIR, "GPUENV_INDEX_ORIGIN": "https://idx.example:port"}, "the origin alone"),
        ({"GPUENV_INDEX_ORIGIN": "https://idx.example"}, "without GPUENV_INDEX_USERNAME"),
        ({"GPUENV_INDEX_PASSWORD": "p"}, "without its pair"),
    ],
)
def test_env_credentials_need_exactly_one_https_origin(env, values, message):
    env(**values)
    with pytest.raises(GpuenvError, match=message):
        credentials.load()


def test_a_netrc_host_is_https_on_its_default_port_and_host_port_names_another(
    env, monkeypatch, tmp_path
):
    """M7: netrc credentials for `idx` also went to http://idx:80 and to every port."""
    netrc(monkeypatch, tmp_path,
          "machine idx.example login alice password a\n"
          "machine other.example:8443 login bob password b\n"
          "machine [::1]:9443 login carol password c\n"
          "default login dave password d\n")  # fmt: skip
    creds = credentials.load()
    assert user(creds, "https://idx.example/simple/") == "alice"
    assert user(creds, "https://IDX.example:443/simple/") == "alice"
    assert user(creds, "https://other.example:8443/simple/") == "bob"
    assert user(creds, "https://[::1]:9443/simple/") == "carol"
    for url in (
        "http://idx.example/simple/",
        "http://idx.example:443/simple/",
        "https://idx.example:444/simple/",
        "https://other.example/simple/",
        "http://other.example:8443/simple/",
        "https://anything.example/simple/",  # netrc's `default`: every host, never used
        "ftp://idx.example/simple/",
    ):
        assert user(creds, url) is None, url


def test_env_credentials_come_before_netrc_for_their_origin(env, monkeypatch, tmp_path):
    netrc(monkeypatch, tmp_path, "machine idx.example login alice password a\n")
    env(GPUENV_INDEX_USERNAME="u", GPUENV_INDEX_PASSWORD="p",
        GPUENV_INDEX_ORIGIN="https://idx.example/")  # fmt: skip
    assert user(credentials.load(), "https://idx.example/simple/") == "u"


def test_an_index_that_got_none_is_told_why(env, monkeypatch, tmp_path):
    """A 401 from an index whose host has credentials bound elsewhere names the binding and
    the fix, not "put them in ~/.netrc" (they are there)."""
    netrc(monkeypatch, tmp_path, "machine idx.example login alice password a\n")
    creds = credentials.load()
    over_http = refused("http://idx.example/simple/", 401, creds)
    assert "never sent over plain http" in over_http and "https://idx.example:443" in over_http
    other_port = refused("https://idx.example:8443/simple/", 401, creds)
    assert "bound to https://idx.example:443" in other_port
    assert "machine idx.example:8443" in other_port
    assert "put them in ~/.netrc" in refused("https://new.example/simple/", 401, creds)
    assert "'alice'" in refused("https://idx.example/simple/", 403, creds)


@pytest.mark.parametrize("variable", ["GPUENV_DEBIAN_MIRROR", "GPUENV_DEBIAN_SECURITY_MIRROR"])
def test_a_debian_mirror_with_credentials_is_refused_without_showing_them(monkeypatch, variable):
    """M6: mmdebstrap got them on its command line (every local user reads /proc) and wrote
    them into /etc/apt/sources.list of the base, so of every image."""
    from gpuenv.building import base

    monkeypatch.setenv(variable, "https://alice:s3cret@mirror.example/debian")
    with pytest.raises(GpuenvError, match=f"\\${variable} holds credentials") as refused:
        base.mmdebstrap_command("bookworm")
    assert "s3cret" not in refused.value.message
    monkeypatch.setenv(variable, "https://mirror.example/debian")
    assert any(
        "https://mirror.example/debian" in arg for arg in base.mmdebstrap_command("bookworm")
    )


def test_a_plain_http_index_is_refused_except_on_loopback():
    """M7: any http index was accepted (pip refuses one without --trusted-host). On a
    loopback address it stays accepted, as pip's "secure origins" do; credentials never go
    to it (for_url above)."""
    from gpuenv.matrix.index_url import check_index_url as _url

    for refused_url in ("http://pypi.example/simple", "http://10.0.0.1:3141/root/pypi",
                        "http://127.0.0.1.example/simple"):  # fmt: skip
        with pytest.raises(ValueError, match="plain-http index"):
            _url(refused_url)
    for accepted in ("https://pypi.example/simple", "http://127.0.0.1:8080/simple",
                     "http://127.1.2.3/simple", "http://localhost:3141/root/pypi"):  # fmt: skip
        assert _url(accepted) == accepted
