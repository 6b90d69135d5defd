"""The epp's P/D scheduling configuration, with or without Kubernetes."""

from __future__ import annotations

import json
from pathlib import Path

# The epp's P/D scheduling: decode profile (always) then prefill (always-disagg decider;
# llm-d's sample deploy/config/pd-epp-config.yaml uses prefix-based-pd-decider, which
# skips P/D for prompts under nonCachedTokens and needs the approx-prefix-cache producer).
EPP_PD_CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefill-filter
- type: decode-filter
- type: queue-scorer
- type: max-score-picker
- type: always-disagg-pd-decider
- type: disagg-profile-handler
  parameters:
    deciders:
      prefill: always-disagg-pd-decider
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
"""


def epp_file_discovery_config(endpoints: Path) -> str:
    """EPP_PD_CONFIG with llm-d's file-discovery data layer: no Kubernetes, the endpoints
    (address, port, labels) from a file, metrics scraped from each endpoint's /metrics."""
    return EPP_PD_CONFIG.replace(
        "plugins:\n",
        "plugins:\n"
        "- type: file-discovery\n"
        "  name: file-discovery\n"
        f"  parameters: {{path: {json.dumps(str(endpoints))}, watchFile: false}}\n"
        "- type: metrics-data-source\n"
        "  name: metrics-source\n"
        "- type: core-metrics-extractor\n"
        "  name: metrics-extractor\n",
        1,
    ) + (
        "dataLayer:\n"
        "  injectDefaults: false\n"
        "  discovery:\n"
        "    pluginRef: file-discovery\n"
        "  sources:\n"
        "  - pluginRef: metrics-source\n"
        "    extractors:\n"
        "    - pluginRef: metrics-extractor\n"
    )
