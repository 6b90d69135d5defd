"""PKI for the local control plane, made once per state dir with the openssl CLI.

The `cryptography` package is not a project dependency, and openssl is on every machine here.
Everything is generated in a temp dir and renamed into place, so a crash mid-way leaves no
half-made PKI that a later start would trust.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

# Names a client may use for the apiserver: loopback, and the in-cluster Service names.
SERVING_SANS = ",".join(
    [
        "IP:127.0.0.1",
        "IP:10.96.0.1",
        "DNS:localhost",
        "DNS:kubernetes",
        "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc",
        "DNS:kubernetes.default.svc.cluster.local",
    ]
)
DAYS = "3650"
FRONT_PROXY_NAME = "front-proxy-client"
FILES = (
    "ca.crt", "ca.key", "apiserver.crt", "apiserver.key", "apiserver-kubelet-client.crt",
    "apiserver-kubelet-client.key", "front-proxy-client.crt", "front-proxy-client.key", "sa.key",
    "tokens.csv", "admin.token",
)  # fmt: skip


@dataclass(frozen=True)
class Pki:
    dir: Path

    @property
    def ca_crt(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def serving_crt(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def kubelet_client_crt(self) -> Path:
        return self.dir / "apiserver-kubelet-client.crt"

    @property
    def kubelet_client_key(self) -> Path:
        return self.dir / "apiserver-kubelet-client.key"

    @property
    def kubelet_crt(self) -> Path:
        """The real node's kubelet: `system:node:<name>` in `system:nodes`."""
        return self.dir / "kubelet.crt"

    @property
    def kubelet_key(self) -> Path:
        return self.dir / "kubelet.key"

    @property
    def front_proxy_crt(self) -> Path:
        return self.dir / "front-proxy-client.crt"

    @property
    def front_proxy_key(self) -> Path:
        return self.dir / "front-proxy-client.key"

    @property
    def sa_key(self) -> Path:
        """RSA key that signs ServiceAccount tokens (the apiserver derives the public half)."""
        return self.dir / "sa.key"

    @property
    def token_file(self) -> Path:
        return self.dir / "tokens.csv"

    @property
    def admin_token(self) -> str:
        return (self.dir / "admin.token").read_text().strip()


def _openssl(*args: str, cwd: Path) -> None:
    res = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed:\n{res.stderr[-2000:]}")


def _make_ca(d: Path) -> None:
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
        "-days", DAYS, "-subj", "/CN=genpool-devcluster-ca",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        cwd=d,
    )  # fmt: skip


def _make_leaf(d: Path, name: str, subject: str, extensions: list[str]) -> None:
    """A key and a cert signed by the CA; `extensions` are openssl config lines."""
    (d / f"{name}.ext").write_text("\n".join(extensions) + "\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", subject, cwd=d)  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", f"{name}.crt", "-days", DAYS, "-extfile", f"{name}.ext",
        cwd=d,
    )  # fmt: skip
    (d / f"{name}.csr").unlink()
    (d / f"{name}.ext").unlink()


def _generate(d: Path) -> None:
    _make_ca(d)
    _make_leaf(d, "apiserver", "/CN=kube-apiserver", _serving_extensions(SERVING_SANS))
    # What the apiserver presents to the pod runner's kubelet endpoint (logs, exec).
    _make_leaf(
        d,
        "apiserver-kubelet-client",
        "/O=system:masters/CN=kube-apiserver-kubelet-client",
        ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
         "extendedKeyUsage=clientAuth"],
    )  # fmt: skip
    # The apiserver's identity towards aggregated API servers (requestheader authentication);
    # without it every client of extension-apiserver-authentication logs errors.
    _make_leaf(
        d,
        "front-proxy-client",
        f"/CN={FRONT_PROXY_NAME}",
        ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
         "extendedKeyUsage=clientAuth"],
    )  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    token = secrets.token_hex(32)
    (d / "admin.token").write_text(token + "\n")
    # Static token file format: token,user,uid,"group1,group2".
    (d / "tokens.csv").write_text(f'{token},admin,admin-uid,"system:masters"\n')


def _serving_extensions(sans: str) -> list[str]:
    return [
        "basicConstraints=CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        "extendedKeyUsage=serverAuth",
        f"subjectAltName={sans}",
    ]


def ensure_node_certs(pki: Pki, node_name: str, node_ip: str) -> tuple[Path, Path]:
    """For the real node: an apiserver serving cert that also names the node IP (pods reach
    the API there), and the kubelet's client cert as `system:node:<name>` in `system:nodes`
    (the Node authorizer). Made once per IP; returns the serving cert's (crt, key)."""
    serving = f"apiserver-{node_ip}"
    if not (pki.dir / f"{serving}.crt").exists():
        sans = f"{SERVING_SANS},IP:{node_ip}"
        _make_leaf(pki.dir, serving, "/CN=kube-apiserver", _serving_extensions(sans))
    if not pki.kubelet_crt.exists():
        _make_leaf(
            pki.dir,
            "kubelet",
            f"/O=system:nodes/CN=system:node:{node_name}",
            ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
             "extendedKeyUsage=clientAuth"],
        )  # fmt: skip
    return pki.dir / f"{serving}.crt", pki.dir / f"{serving}.key"


def ensure_pki(pki_dir: Path) -> Pki:
    """Create the CA, serving/client certs, SA key and admin token once; reuse afterwards."""
    pki = Pki(pki_dir)
    if all((pki_dir / f).exists() for f in FILES):
        return pki
    pki_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".pki-", dir=pki_dir.parent))
    try:
        _generate(tmp)
        if pki_dir.exists():  # partial, or an older layout: replace it whole
            shutil.rmtree(pki_dir)
        os.replace(tmp, pki_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    pki_dir.chmod(0o700)
    return pki
