"""Invalid GenPool specs and the error each must draw.

Shared by the unit test of ``genpool_operator.spec`` and the integration test against a
real apiserver with the CRD installed. ``api_error`` is a substring of the apiserver's
answer, ``model_error`` one of ``GenPoolSpecError``'s; CEL rules give the same text to
both. Unknown fields are only rejected when the request asks for strict field validation
(``fieldValidation=Strict``, kubectl's default); otherwise the apiserver prunes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class InvalidGenPool:
    name: str
    spec: dict[str, Any]
    api_error: str
    model_error: str


def _same(name: str, spec: dict[str, Any], error: str) -> InvalidGenPool:
    return InvalidGenPool(name, spec, error, error)


def _tuning(**ranges: dict[str, int]) -> dict[str, Any]:
    return {"tuning": ranges}


CEL_CAP = "tuning.pausedCap.{} must not exceed tuning.residentHeadroom.max"

INVALID_GENPOOLS: list[InvalidGenPool] = [
    _same("replicas-too-many", {"replicas": 300}, "less than or equal to 256"),
    _same("replicas-negative", {"replicas": -1}, "greater than or equal to 0"),
    InvalidGenPool("replicas-string", {"replicas": "3"}, "must be of type integer",
                   "spec.replicas: Input should be a valid integer"),
    InvalidGenPool("model-empty", {"model": ""}, "should be at least 1 chars long",
                   "spec.model: String should have at least 1 character"),
    _same("tensor-parallel-too-large", {"tensorParallelSize": 16}, "less than or equal to 8"),
    InvalidGenPool("accelerator-unknown", {"accelerator": "amd"}, 'Unsupported value: "amd"',
                   "spec.accelerator: Input should be 'nvidia' or 'none'"),
    InvalidGenPool("mode-unknown", {"preemption": {"mode": "Fast"}},
                   'Unsupported value: "Fast"', "spec.preemption.mode: Input should be"),
    _same("tpot-budget-missing", {"preemption": {"mode": "TpotBudget"}},
          "preemption.tpotBudget is required when preemption.mode is TpotBudget"),
    _same("target-tps-missing", {"preemption": {"mode": "TargetOutputTps"}},
          "preemption.targetOutputTps is required when preemption.mode is TargetOutputTps"),
    _same("target-tps-in-tpot-mode",
          {"preemption": {"mode": "TpotBudget", "tpotBudget": 0.1, "targetOutputTps": 8}},
          "preemption.targetOutputTps is not allowed when preemption.mode is TpotBudget"),
    _same("tpot-budget-in-tps-mode",
          {"preemption": {"mode": "TargetOutputTps", "targetOutputTps": 8, "tpotBudget": 0.1}},
          "preemption.tpotBudget is not allowed when preemption.mode is TargetOutputTps"),
    _same("tpot-budget-zero", {"preemption": {"mode": "TpotBudget", "tpotBudget": 0}},
          "greater than 0"),
    _same("target-tps-too-high",
          {"preemption": {"mode": "TargetOutputTps", "targetOutputTps": 200000}},
          "less than or equal to 100000"),
    _same("slack-negative", {"preemption": {"slackSeconds": -0.1}}, "greater than or equal to 0"),
    _same("admission-target-min-above-max",
          {"preemption": {"admissionTargetSeconds": {"min": 5, "max": 1}}},
          "preemption.admissionTargetSeconds.min must not exceed "
          "preemption.admissionTargetSeconds.max"),
    _same("admission-target-zero", {"preemption": {"admissionTargetSeconds": {"min": 0}}},
          "greater than 0"),
    _same("batch-size-zero", {"engine": {"maxBatchSize": 0}}, "greater than or equal to 1"),
    _same("seq-len-too-short", {"engine": {"maxSeqLen": 8}}, "greater than or equal to 16"),
    _same("interval-too-short", {"tuning": {"intervalSeconds": 1}}, "greater than or equal to 2"),
    InvalidGenPool("stats-source-unknown", {"tuning": {"statsSource": "Prometheus"}},
                   'Unsupported value: "Prometheus"', "spec.tuning.statsSource: Input should be"),
    InvalidGenPool("tuning-enabled-string", {"tuning": {"enabled": "yes"}},
                   "must be of type boolean", "spec.tuning.enabled: Input should be a valid bool"),
    _same("headroom-min-above-max", _tuning(residentHeadroom={"min": 8, "max": 4}),
          "tuning.residentHeadroom.min must not exceed tuning.residentHeadroom.max"),
    _same("headroom-min-above-a", _tuning(residentHeadroom={"min": 20}),
          "tuning.residentHeadroom.min must not exceed tuning.residentHeadroom.max"),
    _same("cap-min-above-max", _tuning(pausedCap={"min": 5, "max": 2}),
          "tuning.pausedCap.min must not exceed tuning.pausedCap.max"),
    _same("cap-max-above-headroom-max",
          _tuning(residentHeadroom={"max": 4}, pausedCap={"max": 8}), CEL_CAP.format("max")),
    _same("cap-min-above-headroom-max",
          _tuning(residentHeadroom={"max": 2}, pausedCap={"min": 3}), CEL_CAP.format("min")),
    _same("cap-max-above-a", {"engine": {"maxNumActiveRequests": 8},
                              **_tuning(pausedCap={"max": 12})}, CEL_CAP.format("max")),
    _same("headroom-max-too-large", _tuning(residentHeadroom={"max": 5000}),
          "less than or equal to 4096"),
    _same("drain-too-long", {"drain": {"timeoutSeconds": 7200}}, "less than or equal to 3600"),
    InvalidGenPool("unknown-field", {"replica": 2}, 'unknown field "spec.replica"',
                   "spec.replica: Extra inputs are not permitted"),
    InvalidGenPool("unknown-nested-field", {"engine": {"batchSize": 8}},
                   'unknown field "spec.engine.batchSize"',
                   "spec.engine.batchSize: Extra inputs are not permitted"),
    InvalidGenPool("bad-quantity", {"resources": {"limits": {"cpu": "lots"}}},
                   "spec.resources.limits.cpu in body should match",
                   "cpu: 'lots' is not a resource quantity"),
    _same("env-reserved-name", {"podTemplate": {"env": [{"name": "POD_IP", "value": "1.2.3.4"}]}},
          "podTemplate.env must not set POD_IP"),
    _same("env-reserved-prefix",
          {"podTemplate": {"env": [{"name": "GENPOOL_ADMIN_TOKEN", "value": "x"}]}},
          "podTemplate.env must not set POD_IP"),
    _same("model-volume-no-source", {"modelVolume": {"subPath": "llama"}},
          "modelVolume must set exactly one of persistentVolumeClaim and hostPath"),
    _same("model-volume-two-sources",
          {"modelVolume": {"persistentVolumeClaim": {"claimName": "models"},
                           "hostPath": {"path": "/data/models"}}},
          "modelVolume must set exactly one of persistentVolumeClaim and hostPath"),
    _same("model-volume-relative-host-path",
          {"modelVolume": {"hostPath": {"path": "data/models"}}},
          "modelVolume.hostPath.path must be an absolute path"),
    _same("model-volume-sub-path-escapes",
          {"modelVolume": {"hostPath": {"path": "/data"}, "subPath": "models/../../etc"}},
          "modelVolume.subPath must be a relative path without '..'"),
    _same("model-volume-absolute-model",
          {"model": "/models/llama", "modelVolume": {"hostPath": {"path": "/data/models"}}},
          "model must be a relative path inside modelVolume"),
    _same("model-volume-synthetic-model",
          {"model": "synthetic:demo",
           "modelVolume": {"persistentVolumeClaim": {"claimName": "models"}}},
          "model must be a relative path inside modelVolume"),
    InvalidGenPool("model-volume-claim-name-missing",
                   {"modelVolume": {"persistentVolumeClaim": {}}},
                   "spec.modelVolume.persistentVolumeClaim.claimName: Required value",
                   "spec.modelVolume.persistentVolumeClaim.claimName: Field required"),
    InvalidGenPool("toleration-operator-unknown",
                   {"podTemplate": {"tolerations": [{"key": "gpu", "operator": "Maybe"}]}},
                   'Unsupported value: "Maybe"',
                   "spec.podTemplate.tolerations.0.operator: Input should be"),
    _same("inference-pool-picker-missing", {"inferencePool": {"enabled": True}},
          "inferencePool.endpointPickerRef is required when inferencePool.enabled is true"),
    _same("inference-pool-picker-port-zero",
          {"inferencePool": {"enabled": True, "endpointPickerRef": {"name": "epp", "port": 0}}},
          "greater than or equal to 1"),
    InvalidGenPool("inference-pool-failure-mode-unknown",
                   {"inferencePool": {"endpointPickerRef": {"name": "epp", "port": 9002,
                                                            "failureMode": "Retry"}}},
                   'Unsupported value: "Retry"',
                   "spec.inferencePool.endpointPickerRef.failureMode: Input should be"),
    _same("slo-ttft-zero", {"slo": {"ttftP90Seconds": 0}}, "greater than 0"),
    _same("slo-ttft-negative", {"slo": {"ttftP90Seconds": -1.5}}, "greater than 0"),
    InvalidGenPool("slo-ttft-missing", {"slo": {"attainment": 0.9}},
                   "spec.slo.ttftP90Seconds: Required value",
                   "spec.slo.ttftP90Seconds: Field required"),
    _same("slo-attainment-one", {"slo": {"ttftP90Seconds": 1, "attainment": 1}}, "less than 1"),
    _same("slo-attainment-zero", {"slo": {"ttftP90Seconds": 1, "attainment": 0}},
          "greater than 0"),
    _same("autoscaling-without-slo", {"autoscaling": {"enabled": True, "maxReplicas": 3}},
          "slo is required when autoscaling.enabled is true"),
    _same("autoscaling-without-max", {"slo": {"ttftP90Seconds": 1},
                                      "autoscaling": {"enabled": True}},
          "autoscaling.maxReplicas is required when autoscaling.enabled is true"),
    _same("autoscaling-min-above-max",
          {"autoscaling": {"minReplicas": 4, "maxReplicas": 2}},
          "autoscaling.minReplicas must not exceed autoscaling.maxReplicas"),
    _same("autoscaling-max-too-many", {"autoscaling": {"maxReplicas": 300}},
          "less than or equal to 256"),
    _same("autoscaling-min-zero", {"autoscaling": {"minReplicas": 0}},
          "greater than or equal to 1"),
    _same("autoscaling-step-zero", {"autoscaling": {"maxStep": 0}}, "greater than or equal to 1"),
    _same("autoscaling-down-window-negative",
          {"autoscaling": {"scaleDownStabilizationSeconds": -1}}, "greater than or equal to 0"),
    InvalidGenPool("advisory-string", {"advisory": "yes"}, "must be of type boolean",
                   "spec.advisory: Input should be a valid bool"),
    _same("autoscaling-utilization-zero", {"autoscaling": {"targetUtilization": 0}},
          "greater than 0"),
    _same("autoscaling-utilization-above-one", {"autoscaling": {"targetUtilization": 1.5}},
          "less than or equal to 1"),
    InvalidGenPool("stamp-arrival-string", {"engine": {"stampArrival": "yes"}},
                   "must be of type boolean",
                   "spec.engine.stampArrival: Input should be a valid bool"),
]  # fmt: skip
