{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "gap-healer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified app name: release-chart, unless the release already contains it. */}}
{{- define "gap-healer.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gap-healer.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gap-healer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gap-healer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gap-healer.labels" -}}
helm.sh/chart: {{ include "gap-healer.chart" . }}
{{ include "gap-healer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: healer
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "gap-healer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gap-healer.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Secret that holds the connection string. */}}
{{- define "gap-healer.secretName" -}}
{{- if .Values.database.existingSecret -}}
{{- .Values.database.existingSecret -}}
{{- else -}}
{{- printf "%s-db" (include "gap-healer.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "gap-healer.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
gap-healer.toml. Values are written with toJson, which yields valid TOML for
strings, booleans and integers (numbers go through toJson, never through
plain printing, which would turn 1000000 into 1e+06).
*/}}
{{- define "gap-healer.configToml" -}}
{{- if hasKey .Values.config "connection_string" -}}
{{- fail "config.connection_string must not be set: the connection string comes from the Secret (database.*)" -}}
{{- end -}}
{{- if hasKey .Values.config "metrics_addr" -}}
{{- fail "config.metrics_addr must not be set: it is derived from service.port" -}}
{{- end -}}
# gap-healer.toml, rendered by the gap-healer Helm chart.
# connection_string is not here: it comes from GAP_HEALER_CONNECTION_STRING (a Secret).
metrics_addr = {{ printf "0.0.0.0:%d" (int .Values.service.port) | quote }}
{{- range $key, $value := .Values.config }}
{{- if not (kindIs "map" $value) }}
{{ $key }} = {{ $value | toJson }}
{{- end }}
{{- end }}
{{- /* Tables (the custom profile's `columns`) after every plain key, as TOML wants. */}}
{{- range $key, $value := .Values.config }}
{{- if kindIs "map" $value }}

{{ toToml (dict $key $value) }}
{{- end }}
{{- end }}
{{- end -}}
