{{/* Chart name, truncated to the 63-character label limit. */}}
{{- define "genpool.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name prefix of every object. A release already named after the chart is not
repeated ("genpool", not "genpool-genpool").
*/}}
{{- define "genpool.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Name of cluster-scoped objects (ClusterRoles, bindings). They carry the release
namespace too: two releases of the same name in different namespaces must not fight
over one ClusterRole.
*/}}
{{- define "genpool.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "genpool.fullname" .) }}
{{- end }}

{{- define "genpool.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object the chart renders. */}}
{{- define "genpool.labels" -}}
helm.sh/chart: {{ include "genpool.chart" . }}
{{ include "genpool.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: genpool
{{- end }}

{{/*
Selector of the operator pods. The component label keeps it apart from the worker
pods, which are labelled app.kubernetes.io/name: genpool-worker by the operator.
*/}}
{{- define "genpool.selectorLabels" -}}
app.kubernetes.io/name: {{ include "genpool.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "genpool.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "genpool.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "genpool.operatorImage" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "genpool.workerImage" -}}
{{- default (printf "genpool/worker:%s" .Chart.AppVersion) .Values.worker.image }}
{{- end }}

{{- define "genpool.adminSecretName" -}}
{{- default (printf "%s-admin-token" .Release.Name) .Values.adminToken.existingSecret }}
{{- end }}

{{- define "genpool.adminSecretKey" -}}
{{- if .Values.adminToken.existingSecret }}{{ .Values.adminToken.existingSecretKey }}{{ else }}token{{ end }}
{{- end }}

{{/* The namespaces the operator watches in namespaced scope, as a list. */}}
{{- define "genpool.watchNamespaces" -}}
{{- if .Values.rbac.watchNamespaces }}
{{- toJson (uniq .Values.rbac.watchNamespaces) }}
{{- else }}
{{- toJson (list .Release.Namespace) }}
{{- end }}
{{- end }}

{{/* kopf peering is on when more than one operator pod runs. */}}
{{- define "genpool.peering" -}}
{{- if gt (int .Values.operator.replicas) 1 }}true{{ end }}
{{- end }}

{{/* Name of the kopf peering object(s): the release name (the operator's --peering). */}}
{{- define "genpool.peeringName" -}}
{{- .Release.Name }}
{{- end }}

{{/*
The rules the operator needs on pool resources, wherever they live (ClusterRole in
cluster scope, a Role per watched namespace otherwise). Nothing else: no wildcards, and
Secrets are write-only because the operator only copies its own token (which it gets
from its env) into each pool's "<pool>-worker-admin" Secret and never reads one.
*/}}
{{- define "genpool.poolRules" -}}
- apiGroups: ["genpool.dev"]
  resources: ["genpools"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["genpool.dev"]
  resources: ["genpools/status"]
  verbs: ["get", "patch", "update"]
# kopf posts core Events; the operator's own tuning events may use events.k8s.io.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# The children of a GenPool (builders.py).
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
# The replica scaler (spec.autoscaling) sets a pool's StatefulSet through its scale subresource.
- apiGroups: ["apps"]
  resources: ["statefulsets/scale"]
  verbs: ["get", "patch"]
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
# spec.inferencePool: the Gateway API Inference Extension's InferencePool (a rule for a
# CRD that is not installed is harmless; the operator then reports CRDNotInstalled).
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create", "patch", "update", "delete"]
# Worker pods: find the ready ones and their IPs for the stat lines; pods/log for
# statsSource: Log.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
{{- end }}

{{/*
Where the worker pods live, for the monitors: every namespace in cluster scope, the
watched ones otherwise.
*/}}
{{- define "genpool.monitorNamespaceSelector" -}}
{{- if eq .Values.rbac.scope "cluster" }}
any: true
{{- else }}
matchNames:
  {{- range include "genpool.watchNamespaces" . | fromJsonArray }}
  - {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Relabelling shared by both monitors: the pool name (pod label genpool.dev/pool) becomes
the `pool` label the dashboard groups by.
*/}}
{{- define "genpool.poolRelabelings" -}}
- sourceLabels: [__meta_kubernetes_pod_label_genpool_dev_pool]
  targetLabel: pool
  action: replace
{{- end }}
