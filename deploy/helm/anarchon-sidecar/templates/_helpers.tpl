{{/* The chart's name, or nameOverride. */}}
{{- define "anarchon-sidecar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's objects' name: fullnameOverride, else RELEASE-NAME (once if equal). */}}
{{- define "anarchon-sidecar.fullname" -}}
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

{{- define "anarchon-sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "anarchon-sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "anarchon-sidecar.labels" -}}
{{ include "anarchon-sidecar.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: anarchon
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The sidecar's ConfigMap: the user's own, or the chart's. */}}
{{- define "anarchon-sidecar.configMapName" -}}
{{- default (printf "%s-config" (include "anarchon-sidecar.fullname" .)) .Values.sidecar.existingConfigMap }}
{{- end }}

{{/* The sidecar config as YAML (the ConfigMap's sidecar.yaml). */}}
{{- define "anarchon-sidecar.config" -}}
{{- toYaml .Values.sidecar.config }}
{{- end }}
