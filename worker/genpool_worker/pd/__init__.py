"""Prefill/decode disaggregation (docs/pd.md): the handle, the KV exports a prefill worker
holds, the pull a decode worker makes, and the prefill leg it can send itself; behind the
worker's KV connector (``connector``, ``edge``): only ``worker_cli``, which builds these
parts, imports this package, and ``worker_config``, which inherits its flags (``flags``)."""
