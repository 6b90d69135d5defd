"""etcd + kube-apiserver + kube-controller-manager, and either a real node (containerd,
kubelet, kube-scheduler, kube-proxy: node/) or the pod runner.

`Cluster(state_dir)` owns one state dir: PKI, etcd data, logs, ports and the admin kubeconfig.
Data and PKI survive stop/start; ports are reused when still free, so a kubeconfig stays valid.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from . import build, certs, procs
from . import kubeconfig as kcfg
from .node.runtime import NODE_NAME, Node

SERVICE_CIDR = "10.96.0.0/16"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
PODRUNNER_MODULE = "genpool_devcluster.podrunner"
PORT_NAMES = ("etcd_client", "etcd_peer", "apiserver", "controller_manager")
RUNTIMES = ("node", "podrunner", "none")
NODE_PORT_NAMES = ("kubelet", "kubelet_healthz", "scheduler", "proxy_healthz", "proxy_metrics")


def _death_signal(name: str) -> int:
    """The pod runner gets SIGTERM so it can still stop its pods' processes."""
    return signal.SIGTERM if name == "podrunner" else signal.SIGKILL


class ClusterError(RuntimeError):
    """The control plane could not start or died."""


def _podrunner_available() -> bool:
    """`python -m` needs the package's __main__; another helper may not have landed it yet."""
    try:
        return importlib.util.find_spec(PODRUNNER_MODULE + ".__main__") is not None
    except ImportError:
        return False


class Cluster:
    def __init__(
        self,
        state_dir: Path | str,
        bin_dir: Path | None = None,
        runtime: str = "podrunner",
        images: Sequence[Path] = (),
    ) -> None:
        """`runtime`: what runs pods: "node" (containerd + kubelet), "podrunner" (pods as
        local processes) or "none" (the control plane only: pods stay Pending). `images`:
        image archives the node imports at start (images.ensure_image builds them)."""
        if runtime not in RUNTIMES:
            raise ValueError(f"runtime {runtime!r}: expected one of {', '.join(RUNTIMES)}")
        self.state_dir = Path(state_dir).expanduser().resolve()
        self.bin_dir = bin_dir or build.bin_dir()
        self.pki = certs.Pki(self.state_dir / "pki")
        is_node = runtime == "node"
        self.node = Node(self.state_dir, self.bin_dir, self.pki, NODE_NAME) if is_node else None
        self.podrunner = runtime == "podrunner" and _podrunner_available()
        self.images = list(images)
        self.log_dir = self.state_dir / "logs"
        self.ports: dict[str, int] = {}
        self.procs: list[procs.Proc] = []

    # ---- public ------------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def host(self) -> str:
        """The apiserver's address: the node's bridge address with a real node (pods reach
        it there through the `kubernetes` Service), else loopback."""
        return self.node.ip if self.node else "127.0.0.1"

    @property
    def server(self) -> str:
        return f"https://{self.host}:{self.ports['apiserver']}"

    def start(self, timeout: float = 180.0) -> Cluster:
        """Start every component and wait until the API serves and has a default SA."""
        if self.procs:
            raise ClusterError("already started")
        try:
            return self._start(timeout)
        except ClusterError as err:
            # Another cluster on this machine may have taken a port between our probe and the
            # bind: choose fresh ports once more.
            if "address already in use" not in str(err):
                raise
            (self.state_dir / "ports.json").unlink(missing_ok=True)
            return self._start(timeout)

    def _start(self, timeout: float) -> Cluster:
        self._prepare()
        deadline = time.monotonic() + timeout
        try:
            self._launch("etcd", self._etcd_argv())
            kcfg.wait_etcd(self.ports["etcd_client"], self._watchdog(deadline))
            self._launch("kube-apiserver", self._apiserver_argv())
            self._api().wait_ready(self._watchdog(deadline))
            self._launch("kube-controller-manager", self._kcm_argv())
            self._api().wait_default_sa(self._watchdog(deadline))
            if self.node:
                self._start_node(self.node, self._watchdog(deadline))
            if self.podrunner:
                self._launch("podrunner", self._podrunner_argv())
                # Usable means pods can run: wait for the runner to register its Node.
                self._api().wait_ok(f"/api/v1/nodes/{NODE_NAME}", self._watchdog(deadline))
        except BaseException:
            self.stop()
            raise
        return self

    def _start_node(self, node: Node, check: kcfg.Watchdog) -> None:
        kc = self.state_dir / "controller-manager.kubeconfig"
        self._launch("kube-scheduler", node.scheduler_argv(kc, self.ports["scheduler"]))
        self._launch("containerd", node.containerd_argv())
        node.wait_containerd(check)
        node.import_pause(build.cache_dir() / "node")
        for archive in self.images:
            node.import_image(archive)
        self._launch("kube-proxy", node.proxy_argv())
        self._launch("kubelet", node.kubelet_argv())
        self._api().wait_node_ready(NODE_NAME, check)

    def stop(self, grace: float = 10.0) -> None:
        """Reverse start order: the kubelet or pod runner first, etcd last; then the node's
        leftovers on the host (pods' processes, mounts, bridge, sysctls)."""
        while self.procs:
            procs.stop(self.procs.pop(), grace)
        (self.state_dir / "pids.json").unlink(missing_ok=True)
        if self.node:
            self.node.teardown()

    def restart(self, proc: procs.Proc) -> None:
        """Start an exited component again in the same slot (the supervisor does it for the
        pod runner, which is young code; control-plane deaths stop the cluster instead)."""
        argv = [str(a) for a in proc.popen.args]  # type: ignore[union-attr]
        new = procs.spawn(proc.name, argv, self.log_dir, _death_signal(proc.name))
        self.procs[self.procs.index(proc)] = new
        self._write_pids()

    def dead(self) -> procs.Proc | None:
        """The first component that has exited, if any (the supervisor watches this)."""
        return next((p for p in self.procs if not p.alive()), None)

    def healthy(self) -> bool:
        return not self.dead() and self._api().ready()

    def __enter__(self) -> Cluster:
        return self if self.procs else self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ---- set-up ------------------------------------------------------------------------

    def _prepare(self) -> None:
        need = build.CONTROL_PLANE + (build.NODE if self.node else ())
        missing = [n for n in need if not (self.bin_dir / n).exists()]
        if missing:
            hint = "run `genpool devcluster build`"
            raise ClusterError(f"missing {missing} in {self.bin_dir}: {hint}")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        certs.ensure_pki(self.pki.dir)
        self.ports = self._choose_ports()
        kcfg.write(self.kubeconfig, self.server, self.pki.ca_crt, self.pki.admin_token)
        if self.node:
            self.node.prepare(self.server, self.kubeconfig, self.ports)
        kcfg.write(
            self.state_dir / "controller-manager.kubeconfig",
            self.server,
            self.pki.ca_crt,
            self.pki.admin_token,
        )

    def _choose_ports(self) -> dict[str, int]:
        """Last run's ports when free (kubeconfigs already handed out stay valid), else new."""
        path = self.state_dir / "ports.json"
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError):
            old = {}
        ports: dict[str, int] = {}
        for name in PORT_NAMES + (NODE_PORT_NAMES if self.node else ()):
            port = old.get(name)
            ok = isinstance(port, int) and port not in ports.values() and procs.port_free(port)
            ports[name] = port if ok else procs.free_port()
        path.write_text(json.dumps(ports, indent=2) + "\n")
        return ports

    def _launch(self, name: str, argv: list[str]) -> None:
        self.procs.append(procs.spawn(name, argv, self.log_dir, _death_signal(name)))
        self._write_pids()

    def _write_pids(self) -> None:
        pids = {p.name: p.pid for p in self.procs}
        (self.state_dir / "pids.json").write_text(json.dumps(pids, indent=2) + "\n")

    def _watchdog(self, deadline: float) -> kcfg.Watchdog:
        def check() -> None:
            dead = self.dead()
            if dead:
                raise ClusterError(
                    f"{dead.name} exited with {dead.popen.returncode}; "
                    f"{dead.log_path}:\n{dead.log_tail()}"
                )
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {p.name}\n{p.log_tail(1500)}" for p in self.procs)
                raise ClusterError(f"control plane not ready in time\n{tails}")

        return check

    def _api(self) -> kcfg.Api:
        return kcfg.Api(self.server, self.pki.ca_crt, self.pki.admin_token)

    # ---- command lines -----------------------------------------------------------------

    def _etcd_argv(self) -> list[str]:
        client = f"http://127.0.0.1:{self.ports['etcd_client']}"
        peer = f"http://127.0.0.1:{self.ports['etcd_peer']}"
        return [
            str(self.bin_dir / "etcd"),
            "--name=genpool-dev",
            f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=genpool-dev={peer}",
            "--unsafe-no-fsync",  # a throw-away dev store: speed over durability
            "--log-level=warn",
        ]

    def _apiserver_argv(self) -> list[str]:
        pki = self.pki
        crt, key = self.node.serving_cert() if self.node else (pki.serving_crt, pki.serving_key)
        return [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd_client']}",
            f"--bind-address={self.host}",
            f"--advertise-address={self.host}",
            f"--secure-port={self.ports['apiserver']}",
            f"--cert-dir={self.state_dir / 'apiserver-certs'}",
            f"--tls-cert-file={crt}",
            f"--tls-private-key-file={key}",
            f"--client-ca-file={pki.ca_crt}",
            f"--token-auth-file={pki.token_file}",
            # Node: the kubelet's own rights (its pods, their secrets, its Node object).
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-account-key-file={pki.sa_key}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            # The pod runner's node reports only InternalIP 127.0.0.1 and its own kubelet port.
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={pki.kubelet_client_crt}",
            f"--kubelet-client-key={pki.kubelet_client_key}",
            # Requestheader auth for aggregated APIs (metrics-server and the like).
            f"--requestheader-client-ca-file={pki.ca_crt}",
            f"--requestheader-allowed-names={certs.FRONT_PROXY_NAME}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki.front_proxy_crt}",
            f"--proxy-client-key-file={pki.front_proxy_key}",
            "--profiling=false",
        ]

    def _kcm_argv(self) -> list[str]:
        kc = self.state_dir / "controller-manager.kubeconfig"
        return [
            str(self.bin_dir / "kube-controller-manager"),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.ports['controller_manager']}",
            f"--cert-dir={self.state_dir / 'controller-manager-certs'}",
            "--leader-elect=false",
            # The pod runner sends no heartbeats: node-lifecycle would taint its node and evict.
            "--controllers=*" if self.node else "--controllers=*,-node-lifecycle-controller",
            f"--service-account-private-key-file={self.pki.sa_key}",
            f"--root-ca-file={self.pki.ca_crt}",
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={self.pki.ca_crt}",
            f"--cluster-signing-key-file={self.pki.ca_key}",
            "--profiling=false",
        ]

    def _podrunner_argv(self) -> list[str]:
        return [
            sys.executable, "-m", PODRUNNER_MODULE,
            "--kubeconfig", str(self.kubeconfig),
            "--state-dir", str(self.state_dir / "podrunner"),
            "--node-name", NODE_NAME,
        ]  # fmt: skip
