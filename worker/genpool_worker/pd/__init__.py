"""Prefill/decode disaggregation (docs/pd.md): the handle, the KV exports a prefill worker
holds, the pull a decode worker makes, and the prefill leg it can send itself."""
