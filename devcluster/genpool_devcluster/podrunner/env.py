"""A container's environment as the kubelet builds it: envFrom, env, the downward API, $(VAR).

Sources are fetched through `Lookup`, so the rules here stay testable without an apiserver.
A missing ConfigMap/Secret/key that is not `optional` raises `EnvError`; the caller reports it
as `CreateContainerConfigError` and retries, as the kubelet does.
"""

from __future__ import annotations

import base64
import math
import os
import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any, Protocol

Obj = dict[str, Any]
_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[numkMGTPE]i?|Ki|)?$")
_SUFFIX = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}


class EnvError(Exception):
    """The container cannot be configured yet (missing ConfigMap, Secret or key)."""


class Lookup(Protocol):
    def configmap(self, namespace: str, name: str) -> Obj | None: ...
    def secret(self, namespace: str, name: str) -> Obj | None: ...


def expand(text: str, lookup: Callable[[str], str | None]) -> str:
    """Kubernetes $(VAR) expansion: `$$` escapes, unknown or unclosed references stay verbatim."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch != "$" or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            close = text.find(")", i + 2)
            if close < 0:
                out.append("$(")
                i += 2
                continue
            name = text[i + 2 : close]
            value = lookup(name)
            out.append(f"$({name})" if value is None else value)
            i = close + 1
        else:
            out.append("$" + nxt)
            i += 2
    return "".join(out)


def parse_quantity(text: str) -> Fraction:
    m = _QUANTITY.match(str(text).strip())
    if not m:
        raise ValueError(f"bad quantity {text!r}")
    number, suffix = Fraction(m.group(1)), m.group(2) or ""
    if suffix[:1] in ("e", "E"):
        return number * Fraction(10) ** int(suffix[1:])
    return number * _SUFFIX[suffix]


def field_value(pod: Obj, path: str) -> str:
    """The downward API's env fields (status fields come from the runner's own view)."""
    meta, spec, status = pod["metadata"], pod.get("spec", {}), pod.get("status", {})
    m = _SUBSCRIPT.match(path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": status.get("hostIP"),
        "status.podIP": status.get("podIP"),
        "status.hostIPs": ",".join(i["ip"] for i in status.get("hostIPs") or []),
        "status.podIPs": ",".join(i["ip"] for i in status.get("podIPs") or []),
    }
    if path not in simple:
        raise EnvError(f"unsupported fieldRef {path!r}")
    return str(simple[path] or "")


def resource_value(pod: Obj, container: Obj, ref: Obj, node: Mapping[str, str]) -> str:
    """resourceFieldRef: limit (or request), else node allocatable; rounded up in `divisor`."""
    target = container
    if ref.get("containerName"):
        target = next(
            (c for c in pod["spec"]["containers"] if c["name"] == ref["containerName"]), container
        )
    kind, _, res = ref["resource"].partition(".")
    resources = target.get("resources") or {}
    raw = (resources.get(kind) or {}).get(res)
    if raw is None and kind == "requests":
        raw = (resources.get("limits") or {}).get(res)
    if raw is None:
        raw = "0" if kind == "requests" else node.get(res, "0")
    value = parse_quantity(raw) / parse_quantity(ref.get("divisor") or "1")
    return str(max(math.ceil(value), 1 if kind == "limits" else 0))


class EnvResolver:
    def __init__(self, pod: Obj, lookup: Lookup, node: Mapping[str, str]) -> None:
        self.pod = pod
        self.ns = pod["metadata"]["namespace"]
        self.lookup = lookup
        self.node = node
        self._cache: dict[tuple[str, str], Obj | None] = {}

    def _source(self, kind: str, name: str) -> Obj | None:
        key = (kind, name)
        if key not in self._cache:
            fetch = self.lookup.configmap if kind == "configmap" else self.lookup.secret
            self._cache[key] = fetch(self.ns, name)
        return self._cache[key]

    def _data(self, kind: str, name: str, optional: bool) -> dict[str, str] | None:
        obj = self._source(kind, name)
        if obj is None:
            if optional:
                return None
            raise EnvError(f'{kind} "{name}" not found')
        if kind == "secret":
            return {k: base64.b64decode(v).decode(errors="replace") for k, v in _items(obj, "data")}
        data = dict(_items(obj, "data"))
        data.update(
            (k, base64.b64decode(v).decode(errors="replace")) for k, v in _items(obj, "binaryData")
        )
        return data

    def _key_ref(self, kind: str, ref: Obj) -> str | None:
        optional = bool(ref.get("optional"))
        data = self._data(kind, ref.get("name", ""), optional)
        if data is None:
            return None
        if ref["key"] not in data:
            if optional:
                return None
            raise EnvError(f"couldn't find key {ref['key']} in {kind} {self.ns}/{ref.get('name')}")
        return data[ref["key"]]

    def resolve(self, container: Obj, base: Mapping[str, str]) -> dict[str, str]:
        """envFrom then env, each value expanded against what is defined so far (plus `base`)."""
        env: dict[str, str] = {}
        for src in container.get("envFrom") or []:
            kind, ref = (
                ("configmap", src.get("configMapRef"))
                if src.get("configMapRef")
                else ("secret", src.get("secretRef") or {})
            )
            data = self._data(kind, ref.get("name", ""), bool(ref.get("optional"))) or {}
            for key, value in data.items():
                if "=" not in key:
                    env[src.get("prefix", "") + key] = value
        for var in container.get("env") or []:
            resolved = self._value(container, var, lambda n: env.get(n, base.get(n)))
            if resolved is not None:
                env[var["name"]] = resolved
        return env

    def _value(self, container: Obj, var: Obj, known: Callable[[str], str | None]) -> str | None:
        if "valueFrom" not in var:
            return expand(var.get("value", ""), known)
        src = var["valueFrom"]
        if "fieldRef" in src:
            return field_value(self.pod, src["fieldRef"]["fieldPath"])
        if "configMapKeyRef" in src:
            return self._key_ref("configmap", src["configMapKeyRef"])
        if "secretKeyRef" in src:
            return self._key_ref("secret", src["secretKeyRef"])
        if "resourceFieldRef" in src:
            return resource_value(self.pod, container, src["resourceFieldRef"], self.node)
        raise EnvError(f"unsupported valueFrom for {var['name']}: {sorted(src)}")


def _items(obj: Obj, key: str) -> list[tuple[str, str]]:
    return list((obj.get(key) or {}).items())


def expand_argv(container: Obj, env: Mapping[str, str]) -> list[str]:
    """command + args with $(VAR) from the container's final environment."""
    return [
        expand(a, env.get) for a in (container.get("command") or []) + (container.get("args") or [])
    ]


def node_allocatable() -> dict[str, str]:
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return {"cpu": str(os.cpu_count() or 1), "memory": str(pages), "ephemeral-storage": "100Gi"}
