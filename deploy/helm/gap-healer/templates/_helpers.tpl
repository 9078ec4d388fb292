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

{{/* Labels of every object but the CronJob's (gap-healer.labelsFor, component heal-once). */}}
{{- define "gap-healer.labels" -}}
{{ include "gap-healer.labelsFor" (dict "ctx" . "component" "healer") }}
{{- end -}}

{{- define "gap-healer.labelsFor" -}}
helm.sh/chart: {{ include "gap-healer.chart" .ctx }}
{{ include "gap-healer.selectorLabels" .ctx }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
{{- end -}}

{{/*
The daemon's pods: the Service and the PodDisruptionBudget select these, so
that the pods of the CronJob (same name and instance, component heal-once)
are neither endpoints nor counted as available replicas. The Deployment's own
selector stays selectorLabels (a selector cannot change on upgrade); the
NetworkPolicy selects both kinds of pod.
*/}}
{{- define "gap-healer.daemonLabels" -}}
{{ include "gap-healer.selectorLabels" . }}
app.kubernetes.io/component: healer
{{- end -}}

{{/* The CronJob's name: 52 characters at most, as a CronJob's name may be (its Jobs get a suffix). */}}
{{- define "gap-healer.cronJobName" -}}
{{- printf "%s-heal" (include "gap-healer.fullname" . | trunc 47 | trimSuffix "-") -}}
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

{{/*
The image. Its repository is required: no registry serves a gap-healer image
yet, and a default naming one would leave the pods in ImagePullBackOff.
*/}}
{{- define "gap-healer.image" -}}
{{- $repository := required "image.repository is required: no registry serves a gap-healer image yet. Build one from the repository's Dockerfile (README, \"Container image\"), push it to a registry your cluster pulls from, and set image.repository (e.g. --set image.repository=registry.example.com/gap-healer), with image.tag or image.digest" .Values.image.repository -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}


{{/*
gap-healer.toml, from .Values.config, in TOML written by the helpers below
rather than by Helm's toToml: Helm 4's toToml (the SDK CI runs) writes a
whole number read from YAML as a float (lookback = 1e+06), and what it
writes has changed between Helm versions. These write the same under any
Helm: plain keys first, then each map as a [table], then each list of maps
as an array of tables ([[stores]], [[store_sets]]), each level recursively.
*/}}
{{- define "gap-healer.configToml" -}}
{{- include "gap-healer.validateConfig" . -}}
# gap-healer.toml, rendered by the gap-healer Helm chart.
{{- if eq (include "gap-healer.connectionFromEnv" .) "true" }}
# connection_string is not here: it comes from GAP_HEALER_CONNECTION_STRING (a Secret).
{{- else }}
# The connection strings are read from the connection_string_file paths below
# (Secrets mounted with extraVolumes / extraVolumeMounts).
{{- end }}
metrics_addr = {{ printf "0.0.0.0:%d" (int .Values.service.port) | quote }}
{{- include "gap-healer.tomlTable" (dict "table" .Values.config "path" "") }}
{{- end -}}

{{/*
The body of one TOML table. Argument: a dict, "table" the map, "path" its
dotted name ("" at the top level). Nulls and empty lists are left out (a
`stores: []` is the same as no [[stores]]).
*/}}
{{- define "gap-healer.tomlTable" -}}
{{- $path := .path -}}
{{- $table := .table -}}
{{- /* An array entry's name first, where a reader looks for it. */}}
{{- if and $path (hasKey $table "name") }}
name = {{ include "gap-healer.tomlValue" (get $table "name") }}
{{- end }}
{{- range $key, $value := $table }}
{{- if and (not (and $path (eq $key "name"))) (eq (include "gap-healer.tomlKind" $value) "value") }}
{{ include "gap-healer.tomlKey" $key }} = {{ include "gap-healer.tomlValue" $value }}
{{- end }}
{{- end }}
{{- range $key, $value := $table }}
{{- $sub := include "gap-healer.tomlKey" $key }}
{{- if $path }}{{ $sub = printf "%s.%s" $path $sub }}{{ end }}
{{- if eq (include "gap-healer.tomlKind" $value) "table" }}
{{- /* A table of sub-tables only needs no header of its own (an empty one does). */}}
{{- $plain := empty $value }}
{{- range $value }}{{ if eq (include "gap-healer.tomlKind" .) "value" }}{{ $plain = true }}{{ end }}{{ end }}
{{- if $plain }}

[{{ $sub }}]
{{- end }}
{{- include "gap-healer.tomlTable" (dict "table" $value "path" $sub) }}
{{- end }}
{{- end }}
{{- range $key, $value := $table }}
{{- $sub := include "gap-healer.tomlKey" $key }}
{{- if $path }}{{ $sub = printf "%s.%s" $path $sub }}{{ end }}
{{- if eq (include "gap-healer.tomlKind" $value) "array-of-tables" }}
{{- range $entry := $value }}

[[{{ $sub }}]]
{{- include "gap-healer.tomlTable" (dict "table" $entry "path" $sub) }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* How a value is written in a table: skip (null, empty list), table (a map), array-of-tables (a list of maps only), value. */}}
{{- define "gap-healer.tomlKind" -}}
{{- if or (kindIs "invalid" .) (and (kindIs "slice" .) (empty .)) -}}
skip
{{- else if kindIs "map" . -}}
table
{{- else if kindIs "slice" . -}}
{{- $maps := true -}}
{{- range . }}{{ if not (kindIs "map" .) }}{{ $maps = false }}{{ end }}{{ end -}}
{{- ternary "array-of-tables" "value" $maps -}}
{{- else -}}
value
{{- end -}}
{{- end -}}

{{/* A key: bare when TOML allows it, else a quoted (JSON = TOML basic) string. */}}
{{- define "gap-healer.tomlKey" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . -}}
{{- . -}}
{{- else -}}
{{- toJson . -}}
{{- end -}}
{{- end -}}

{{/*
A value on one line. Strings and non-whole numbers through toJson (a JSON
string is a TOML basic string); a whole number as an integer (YAML's numbers
reach templates as float64, and printing one plainly gives 1e+06); a list
as an array and a map as an inline table, recursively.
*/}}
{{- define "gap-healer.tomlValue" -}}
{{- $v := . -}}
{{- if kindIs "string" $v -}}
{{- toJson $v -}}
{{- else if kindIs "bool" $v -}}
{{- ternary "true" "false" $v -}}
{{- else if kindIs "float64" $v -}}
{{- if and (eq $v (floor $v)) (lt $v 9007199254740992.0) (gt $v -9007199254740992.0) -}}
{{- int64 $v -}}
{{- else -}}
{{- toJson $v -}}
{{- end -}}
{{- else if or (kindIs "int" $v) (kindIs "int64" $v) (kindIs "float32" $v) (kindIs "int32" $v) (kindIs "uint64" $v) -}}
{{- toJson $v -}}
{{- else if kindIs "slice" $v -}}
[{{ range $i, $e := $v }}{{ if $i }}, {{ end }}{{ include "gap-healer.tomlValue" $e }}{{ end }}]
{{- else if kindIs "map" $v -}}
{{- if empty $v -}}
{}
{{- else -}}
{ {{- range $i, $k := keys $v | sortAlpha }}{{ if $i }},{{ end }} {{ include "gap-healer.tomlKey" $k }} = {{ include "gap-healer.tomlValue" (get $v $k) }}{{ end }} }
{{- end -}}
{{- else -}}
{{- fail (printf "config: %v (a %s) cannot be written as TOML (a null inside a list?)" $v (kindOf $v)) -}}
{{- end -}}
{{- end -}}

{{/*
"true" when the chart passes the connection string as
GAP_HEALER_CONNECTION_STRING from database.*: unless the config names files
itself. With config.connection_string_file the variable would outrank the
file; with [[stores]] or [[store_sets]] gap-healer refuses the variable
(each store names its own database): there every connection string is a
file, on a Secret mounted with extraVolumes / extraVolumeMounts.
*/}}
{{- define "gap-healer.connectionFromEnv" -}}
{{- $c := .Values.config -}}
{{- if or (get $c "connection_string_file") (get $c "stores") (get $c "store_sets") -}}
false
{{- else -}}
true
{{- end -}}
{{- end -}}

{{/* Every connection_string_file the config names (top level and entries), one a line. */}}
{{- define "gap-healer.connectionFiles" -}}
{{- $c := .Values.config -}}
{{- with get $c "connection_string_file" }}{{ . }}{{ "\n" }}{{ end -}}
{{- range $list := list "stores" "store_sets" }}
{{- range (get $c $list | default list) }}
{{- if kindIs "map" . }}{{ with get . "connection_string_file" }}{{ . }}{{ "\n" }}{{ end }}{{ end }}
{{- end }}
{{- end -}}
{{- end -}}

{{/*
Refuses, at install, what gap-healer would refuse at start (a crash loop) or
what would leak the connection string into the ConfigMap.
*/}}
{{- define "gap-healer.validateConfig" -}}
{{- $c := .Values.config -}}
{{- $engine := required "config.engine is required: postgres or mssql, the engine of the store's database (e.g. --set config.engine=postgres)" (get $c "engine") -}}
{{- if not (has $engine (list "postgres" "mssql")) -}}
{{- fail (printf "config.engine is %q: it must be postgres or mssql" $engine) -}}
{{- end -}}
{{- if hasKey $c "connection_string" -}}
{{- fail "config.connection_string must not be set: the connection string comes from the Secret (database.*) or from a connection_string_file" -}}
{{- end -}}
{{- if hasKey $c "metrics_addr" -}}
{{- fail "config.metrics_addr must not be set: it is derived from service.port" -}}
{{- end -}}
{{- $fromEnv := eq (include "gap-healer.connectionFromEnv" .) "true" -}}
{{- if and (not $fromEnv) (or .Values.database.createSecret .Values.database.existingSecret) -}}
{{- fail "database.existingSecret / database.createSecret: the config names its connection strings in connection_string_file (or lists [[stores]] / [[store_sets]], where gap-healer refuses GAP_HEALER_CONNECTION_STRING), so nothing would read that Secret: mount it with extraVolumes / extraVolumeMounts and name the file in config" -}}
{{- end -}}
{{- $topFile := get $c "connection_string_file" -}}
{{- range $list := list "stores" "store_sets" }}
{{- $entries := get $c $list | default list }}
{{- if not (kindIs "slice" $entries) }}
{{- fail (printf "config.%s must be a list of maps (one per [[%s]] entry)" $list $list) }}
{{- end }}
{{- range $i, $e := $entries }}
{{- $at := printf "config.%s[%d]" $list $i }}
{{- if not (kindIs "map" $e) }}
{{- fail (printf "%s must be a map of store keys" $at) }}
{{- end }}
{{- if not (get $e "name") }}
{{- fail (printf "%s has no name: every [[%s]] entry needs one (the metrics' store label)" $at $list) }}
{{- end }}
{{- $at = printf "%s (%s)" $at (get $e "name") }}
{{- if hasKey $e "connection_string" }}
{{- fail (printf "%s.connection_string must not be set: it would be in the ConfigMap; put it in a Secret and name the mounted file in connection_string_file" $at) }}
{{- end }}
{{- if not (or (get $e "connection_string_file") $topFile) }}
{{- fail (printf "%s has no connection_string_file (and config has none for every store)" $at) }}
{{- end }}
{{- range $k := list "metrics_addr" "discover_interval" "log_format" "log_level" }}
{{- if hasKey $e $k }}
{{- fail (printf "%s.%s: a daemon-wide key; set it in config, not per store" $at $k) }}
{{- end }}
{{- end }}
{{- if and (eq $list "store_sets") (not (get $e "databases")) }}
{{- fail (printf "%s has no databases (a LIKE pattern over the server's database names, e.g. tenant_%%)" $at) }}
{{- end }}
{{- end }}
{{- end }}
{{- /* Each file must be on a mount, or the pod fails to start. */}}
{{- range $file := splitList "\n" (include "gap-healer.connectionFiles" .) }}
{{- if $file }}
{{- $mounted := false }}
{{- range $.Values.extraVolumeMounts }}
{{- if hasPrefix (printf "%s/" (trimSuffix "/" .mountPath)) $file }}{{ $mounted = true }}{{ end }}
{{- end }}
{{- if not $mounted }}
{{- fail (printf "connection_string_file %s is on none of extraVolumeMounts: mount the Secret that holds it there" $file) }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The container's env: the connection string from database.* (unless the config names files), then extraEnv. */}}
{{- define "gap-healer.env" -}}
{{- if eq (include "gap-healer.connectionFromEnv" .) "true" }}
- name: GAP_HEALER_CONNECTION_STRING
  valueFrom:
    secretKeyRef:
      name: {{ include "gap-healer.secretName" . }}
      key: {{ .Values.database.secretKey }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "gap-healer.volumeMounts" -}}
- name: config
  mountPath: /etc/gap-healer
  readOnly: true
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "gap-healer.volumes" -}}
- name: config
  configMap:
    name: {{ include "gap-healer.fullname" . }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}
