"""llm-d interop: llm-d's unmodified ``pd-sidecar`` and ``epp`` in front of GenPool workers.

Run by devcluster/interop_llm_d.sh (which builds both binaries) as ``python -m
genpool_devcluster.interop``; docs/llm-d-interop-notes.md has the protocol this checks and
its results. Four subcommands:

``capture``  no cluster. The sidecar between recording fakes: a fake prefiller and a fake
             decoder log the exact requests it sends (method, path, headers, body) for a
             few client requests (completions, streamed chat, a prefill answer without
             ``kv_transfer_params``, a 503-ing prefiller, an unreachable one, two prefillers
             in the header); then the same with a real ``genpool-worker`` as the decoder.
             Writes the whole exchange as JSON (``--out``).
``local``    no cluster. A ``--role prefill`` and a ``--role decode`` worker on loopback, the
             sidecar in front of the decode worker, the epp over both (its file-discovery
             data layer, ``llm-d.ai/role`` labels). Per prompt: the epp's pick over ext_proc,
             the OpenAI SDK to the sidecar with the epp's ``x-prefiller-host-port``; the text
             must equal the decode worker's own greedy text and its
             ``genpool_kv_transfers_total{side="import",outcome="ok"}`` must grow by one.
``run``      the same on the local control plane: the operator (Helm chart), a P/D GenPool
             (examples/genpool-pd.yaml, synthetic model by default) with an InferencePool, a
             colocated reference pool (the reference text), the epp for the InferencePool.
             The epp is driven as Envoy would drive it, the way
             tests/integration/epp_gateway.py drives GIE's picker.
``precise-prefix``  the local control plane: a GenPool of two workers with
             ``engine.kvEvents.enabled`` and an InferencePool (the operator, Helm chart),
             the epp with Kubernetes discovery and the precise prefix-cache scorer over
             them, a multi-turn load picked by the epp over ext_proc; then the same with
             KV events off (control). Writes bench/results/kv_events_interop_cluster.json
             (docs/operator.md, "Precise prefix-cache routing with llm-d"; only the epp
             binary is needed).

``--host-override`` (local, run) also sends ``Host: <prefiller>``: a diagnostic only (the
sidecar passes the client's Host header on to the prefill leg; the worker names its pull
address from the connection's local address, never from Host).
The sidecar reaches its decoder only at ``localhost:<--model-server-port>`` (llm-d runs it
in the decode pod's network namespace); a devcluster pod listens on its own 127.0.x.y, so
``run`` puts a TCP forwarder on 127.0.0.1 in front of the decode pod.

Modules: ``cli`` (the subcommands' flags), ``common`` (constants, waiting, the worker's P/D
counters), ``children`` (the sidecar, epp and worker processes), ``epp_config``,
``fakes`` and ``capture``, ``epp_client`` (Envoy's part towards the epp), ``local``,
``forwarder`` and ``cluster_run``; for ``precise-prefix`` ``conversations`` (the load, pure),
``prefix_epp`` (the epp's configuration and sync, the conversation loop; shared with
bench/kv_events_interop.py, the same check outside Kubernetes) and ``precise_prefix``.
"""
