"""``qmf serve-metrics --web-config``: TLS and basic authentication as Prometheus's exporters
configure them, over real sockets with a real certificate (openssl); a bad file is
refused at start, naming the key."""

from __future__ import annotations

import base64
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import bcrypt
import pytest

from pipeline.cli import main as qmf
from pipeline.commands.metrics import MetricsState, make_server
from pipeline.views.webconfig import WebConfig, WebConfigError

PASSWORD = "correct horse"


def certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key."""
    cert, key = folder / "server.crt", folder / "server.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def web_file(folder: Path, text: str) -> Path:
    path = folder / "web.yml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def tls_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("web")
    certificate(folder)
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
    htpasswd = "$2y$" + hashed[4:]  # as htpasswd -nBC 10 writes it
    web_file(folder, "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                     f"basic_auth_users:\n  prometheus: '{htpasswd}'\n")  # fmt: skip
    return folder


@contextmanager
def served(data: Path, web: WebConfig) -> Iterator[int]:
    server = make_server(MetricsState(data), "127.0.0.1", 0, web)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def get(url: str, ctx: ssl.SSLContext | None, user: str | None = None,
        password: str = PASSWORD) -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    headers = {"Accept": "application/openmetrics-text; version=1.0.0"}
    if user is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30,
                                    context=ctx) as resp:  # fmt: skip
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_tls_with_basic_authentication(tls_folder: Path, tmp_path: Path) -> None:
    web = WebConfig.load(tls_folder / "web.yml")
    assert web.tls and list(web.users) == ["prometheus"]
    ctx = ssl.create_default_context(cafile=str(tls_folder / "server.crt"))
    with served(tmp_path / "data", web) as port:
        base = f"https://127.0.0.1:{port}"
        status, headers, body = get(f"{base}/metrics", ctx, "prometheus")
        assert status == 200 and body.endswith(b"# EOF\n"), body[-200:]
        assert headers["Content-Type"].startswith("application/openmetrics-text")
        for user, password in (("prometheus", "wrong"), ("nobody", PASSWORD), (None, PASSWORD)):
            status, headers, body = get(f"{base}/metrics", ctx, user, password)
            assert (status, body) == (401, b"unauthorized\n"), (user, password)
            assert headers["WWW-Authenticate"] == 'Basic realm="qmf serve-metrics"'
        assert get(f"{base}/healthz", ctx)[0] == 401  # every path
        assert get(f"{base}/healthz", ctx, "prometheus")[0] == 200
        # A client that does not trust the certificate, or speaks plain HTTP, gets nothing.
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            get(f"{base}/metrics", ssl.create_default_context(), "prometheus")
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            get(f"http://127.0.0.1:{port}/metrics", None, "prometheus")
        # The server still answers after both.
        assert get(f"{base}/metrics", ctx, "prometheus")[0] == 200


def test_basic_authentication_without_tls(tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()
    web = WebConfig.load(web_file(tmp_path, f"basic_auth_users:\n  a: '{hashed}'\n"))
    assert not web.tls
    with served(tmp_path / "data", web) as port:
        assert get(f"http://127.0.0.1:{port}/metrics", None, "a", "pw")[0] == 200
        assert get(f"http://127.0.0.1:{port}/metrics", None, "a", "pW")[0] == 401


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tls_server_config:\n  cert_file: server.crt\n", r"tls_server_config\.key_file: required"),
        ("tls_server_config:\n  cert_file: nope.crt\n  key_file: server.key\n",
         r"tls_server_config\.cert_file: .*nope\.crt is not a file"),
        ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
         "  cipher_suites: [x]\n", r"unsupported keys \['cipher_suites'\]"),
        ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
         "  client_auth_type: VerifyClientCertIfGiven\n", r"client_auth_type: .*use NoClientCert"),
        ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
         "  client_auth_type: RequireAndVerifyClientCert\n", r"client_ca_file: required"),
        ("tls_server_config:\n  cert_file: server.key\n  key_file: server.crt\n",
         r"the certificate and key do not load"),
        ("basic_auth_users:\n  alice: secret\n", r"basic_auth_users\.alice: not a bcrypt hash"),
        ("http_server_config:\n  http2: false\n", r"unsupported keys \['http_server_config'\]"),
        ("- a\n", r"expected a mapping"),
    ],
)
def test_a_bad_web_configuration_is_refused_at_start(
    tls_folder: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = tls_folder / "bad.yml"
    path.write_text(text)
    with pytest.raises(WebConfigError, match=message):
        WebConfig.load(path)
    assert qmf(["serve-metrics", "--web-config", str(path), "--port", "0"]) == 2
    assert capsys.readouterr().err.startswith(f"qmf serve-metrics: {path}")
