{{/*
The labels of every object (the same as manifests/ has: the chart adds none of its own).
*/}}
{{- define "nodedra.labels" -}}
app.kubernetes.io/name: nodedra
{{- end }}

{{/*
The user name of nodedra's ServiceAccount in the release namespace, as the API server sees it.
*/}}
{{- define "nodedra.serviceAccountUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:nodedra
{{- end }}

{{/*
The image, its tag defaulting to the chart's appVersion.
*/}}
{{- define "nodedra.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
The checked policy.
*/}}
{{- define "nodedra.policy" -}}
{{- $policies := list "topology-aware" "static" -}}
{{- if not (has .Values.policy $policies) -}}
{{- fail (printf "policy: %q is not one of %s" (toString .Values.policy) (join ", " $policies)) -}}
{{- end -}}
{{ .Values.policy }}
{{- end }}

{{/*
The checked nodeAllocatable.
*/}}
{{- define "nodedra.nodeAllocatable" -}}
{{- if not (kindIs "bool" .Values.nodeAllocatable) -}}
{{- fail (printf "nodeAllocatable: %q is not true or false" (toString .Values.nodeAllocatable)) -}}
{{- end -}}
{{ .Values.nodeAllocatable }}
{{- end }}

{{/*
The checked fullPhysicalCores.
*/}}
{{- define "nodedra.fullPhysicalCores" -}}
{{- if not (kindIs "bool" .Values.fullPhysicalCores) -}}
{{- fail (printf "fullPhysicalCores: %q is not true or false" (toString .Values.fullPhysicalCores)) -}}
{{- end -}}
{{ .Values.fullPhysicalCores }}
{{- end }}

{{/*
The checked pinning mode.
*/}}
{{- define "nodedra.pinning" -}}
{{- $modes := list "required" "best-effort" "off" -}}
{{- if not (has .Values.pinning $modes) -}}
{{- fail (printf "pinning: %q is not one of %s" (toString .Values.pinning) (join ", " $modes)) -}}
{{- end -}}
{{ .Values.pinning }}
{{- end }}

{{/*
The checked log format.
*/}}
{{- define "nodedra.logFormat" -}}
{{- $formats := list "text" "json" -}}
{{- if not (has .Values.logFormat $formats) -}}
{{- fail (printf "logFormat: %q is not one of %s" (toString .Values.logFormat) (join ", " $formats)) -}}
{{- end -}}
{{ .Values.logFormat }}
{{- end }}

{{/*
The port of metrics.address (host:port), for the container port "metrics" and the readiness
probe (/readyz is served beside /metrics).
*/}}
{{- define "nodedra.metricsPort" -}}
{{- $address := toString .Values.metrics.address -}}
{{- $port := regexFind "[0-9]+$" $address -}}
{{- if or (not (regexMatch "^.*:[0-9]+$" $address)) (lt (atoi $port) 1) (gt (atoi $port) 65535) -}}
{{- fail (printf "metrics.address: %q is not host:port (the readiness probe needs /readyz, served there)" $address) -}}
{{- end -}}
{{ atoi $port }}
{{- end }}
