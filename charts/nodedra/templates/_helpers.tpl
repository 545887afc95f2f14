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
The image: [registry/]repository, then @digest when one is given, else :tag (default: the
chart's appVersion).
*/}}
{{- define "nodedra.image" -}}
{{- $image := .Values.image -}}
{{- $name := toString $image.repository -}}
{{- if not $name -}}
{{- fail "image.repository: is empty (the image's repository, e.g. nodedra)" -}}
{{- end -}}
{{- with $image.registry -}}
{{- $name = printf "%s/%s" (trimSuffix "/" (toString .)) $name -}}
{{- end -}}
{{- if $image.digest -}}
{{- if not (regexMatch "^sha256:[0-9a-f]{64}$" (toString $image.digest)) -}}
{{- fail (printf "image.digest: %q is not sha256:<64 lowercase hex digits>" (toString $image.digest)) -}}
{{- end -}}
{{ $name }}@{{ $image.digest }}
{{- else -}}
{{ $name }}:{{ $image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/*
imagePullSecrets as LocalObjectReferences, from names or {name: ...} entries.
*/}}
{{- define "nodedra.imagePullSecrets" -}}
{{- $secrets := list -}}
{{- range $i, $secret := .Values.imagePullSecrets | default list -}}
{{- if and (kindIs "string" $secret) $secret -}}
{{- $secrets = append $secrets (dict "name" $secret) -}}
{{- else if and (kindIs "map" $secret) (kindIs "string" $secret.name) $secret.name (eq (len $secret) 1) -}}
{{- $secrets = append $secrets $secret -}}
{{- else -}}
{{- fail (printf "imagePullSecrets[%d]: %s is neither a Secret's name nor {name: <Secret's name>}" $i (toJson $secret)) -}}
{{- end -}}
{{- end -}}
{{- with $secrets -}}
{{ toYaml . }}
{{- end -}}
{{- end }}

{{/*
The checked kubeletDir, without a trailing slash.
*/}}
{{- define "nodedra.kubeletDir" -}}
{{- $dir := trimSuffix "/" (toString .Values.kubeletDir) -}}
{{- if not (regexMatch "^(/[^/\\s]+)+$" $dir) -}}
{{- fail (printf "kubeletDir: %q is not an absolute path (the kubelet's --root-dir, e.g. /var/lib/kubelet)" (toString .Values.kubeletDir)) -}}
{{- end -}}
{{ $dir }}
{{- end }}

{{/*
What the DaemonSets and ConfigMaps are rendered from: {"items": [instance, ...]} as JSON,
the nodes of no pool first, then one per node pool. An instance has
  suffix:      "" or "-<pool's name>" (of the DaemonSet's and the ConfigMap's names)
  where:       "" or "nodePools[<index>]." (before the names of values in error messages)
  pool:        "" or the pool's name
  values:      .Values with the pool's overrides
  selector:    the pool's one label, as a nodeSelector ({} for the nodes of no pool)
  exclusions:  node affinity matchExpressions keeping off the nodes of earlier pools (of
               every pool for the nodes of no pool): so no node runs two nodedra.
*/}}
{{- define "nodedra.instances" -}}
{{- $pools := .Values.nodePools | default list -}}
{{- if not (kindIs "slice" $pools) -}}
{{- fail "nodePools: is not a list of pools ({name, nodeSelector, policy, ...})" -}}
{{- end -}}
{{- $keys := list "name" "nodeSelector" "policy" "reservedCPUs" "nodeAllocatable" "fullPhysicalCores" "numaNodeAttribute" "quietCPUs" "options" -}}
{{- $overrides := list "policy" "reservedCPUs" "nodeAllocatable" "fullPhysicalCores" "numaNodeAttribute" "quietCPUs" "options" -}}
{{- $instances := list -}}
{{- $exclusions := list -}}
{{- $seen := dict -}}
{{- range $i, $pool := $pools -}}
{{- $where := printf "nodePools[%d]" $i -}}
{{- if not (kindIs "map" $pool) -}}
{{- fail (printf "%s: is not a pool ({name, nodeSelector, policy, ...})" $where) -}}
{{- end -}}
{{- range $key, $_ := $pool -}}
{{- if not (has $key $keys) -}}
{{- fail (printf "%s: %q is not a pool's key (%s)" $where $key (join ", " $keys)) -}}
{{- end -}}
{{- end -}}
{{- $name := toString $pool.name -}}
{{- if or (not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" $name)) (gt (len $name) 40) -}}
{{- fail (printf "%s: name %q is not a DNS label of at most 40 characters (it names DaemonSet nodedra-<name> and ConfigMap nodedra-config-<name>)" $where $name) -}}
{{- end -}}
{{- if hasKey $seen $name -}}
{{- fail (printf "%s: name %q is %s's already" $where $name (get $seen $name)) -}}
{{- end -}}
{{- $_ := set $seen $name $where -}}
{{- $selector := $pool.nodeSelector -}}
{{- if or (not (kindIs "map" $selector)) (ne (len $selector) 1) -}}
{{- fail (printf "%s: nodeSelector must be one label (key: value), not %s: with one label per pool, each DaemonSet can exclude the other pools' nodes, so that no node runs two nodedra" $where (toJson $selector)) -}}
{{- end -}}
{{- $label := first (keys $selector) -}}
{{- $value := toString (get $selector $label) -}}
{{- $labelWhere := printf "%s=%s" $label $value -}}
{{- if hasKey $seen $labelWhere -}}
{{- fail (printf "%s: nodeSelector %s is %s's already" $where $labelWhere (get $seen $labelWhere)) -}}
{{- end -}}
{{- $_ := set $seen $labelWhere $where -}}
{{- $values := deepCopy $.Values -}}
{{- range $overrides -}}
{{- if hasKey $pool . -}}
{{- $_ := set $values . (get $pool .) -}}
{{- end -}}
{{- end -}}
{{- $instances = append $instances (dict "suffix" (printf "-%s" $name) "where" (printf "%s." $where) "pool" $name "values" $values "selector" (dict $label $value) "exclusions" $exclusions) -}}
{{- $exclusions = append $exclusions (dict "key" $label "operator" "NotIn" "values" (list $value)) -}}
{{- end -}}
{{- $default := dict "suffix" "" "where" "" "pool" "" "values" .Values "selector" dict "exclusions" $exclusions -}}
{{- toJson (dict "items" (prepend $instances $default)) -}}
{{- end }}

{{/*
The checked policy.
*/}}
{{- define "nodedra.policy" -}}
{{- $policies := list "topology-aware" "static" -}}
{{- if not (has .Values.policy $policies) -}}
{{- fail (printf "%spolicy: %q is not one of %s" .Instance.where (toString .Values.policy) (join ", " $policies)) -}}
{{- end -}}
{{ .Values.policy }}
{{- end }}

{{/*
The checked nodeAllocatable.
*/}}
{{- define "nodedra.nodeAllocatable" -}}
{{- if not (kindIs "bool" .Values.nodeAllocatable) -}}
{{- fail (printf "%snodeAllocatable: %q is not true or false" .Instance.where (toString .Values.nodeAllocatable)) -}}
{{- end -}}
{{ .Values.nodeAllocatable }}
{{- end }}

{{/*
The checked fullPhysicalCores.
*/}}
{{- define "nodedra.fullPhysicalCores" -}}
{{- if not (kindIs "bool" .Values.fullPhysicalCores) -}}
{{- fail (printf "%sfullPhysicalCores: %q is not true or false" .Instance.where (toString .Values.fullPhysicalCores)) -}}
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

{{/*
The pods' labels: the selector's (nodedra's name, the node pool's) and podLabels, which may
not change those.
*/}}
{{- define "nodedra.podLabels" -}}
{{- $labels := dict "app.kubernetes.io/name" "nodedra" -}}
{{- with .Instance.pool -}}
{{- $_ := set $labels "nodedra.nri.io/node-pool" . -}}
{{- end -}}
{{- range $key, $value := .Values.podLabels | default dict -}}
{{- if or (eq $key "app.kubernetes.io/name") (eq $key "nodedra.nri.io/node-pool") -}}
{{- fail (printf "podLabels: %q is the DaemonSets' selector's label; the chart sets it" $key) -}}
{{- end -}}
{{- $_ := set $labels $key (toString $value) -}}
{{- end -}}
{{ toYaml $labels }}
{{- end }}

{{/*
The pods' annotations: tolerateMissingNRIPluginsAnnotation (set to "true") and podAnnotations.
*/}}
{{- define "nodedra.podAnnotations" -}}
{{- $annotations := dict -}}
{{- range $key, $value := .Values.podAnnotations | default dict -}}
{{- $_ := set $annotations $key (toString $value) -}}
{{- end -}}
{{- with .Values.tolerateMissingNRIPluginsAnnotation -}}
{{- $_ := set $annotations (toString .) "true" -}}
{{- end -}}
{{- with $annotations -}}
{{ toYaml . }}
{{- end -}}
{{- end }}

{{/*
The pods' affinity: the affinity value, with the instance's exclusions of other pools' nodes
added to every required node selector term (terms are ORed, so each needs them), or as the
one term when there is none.
*/}}
{{- define "nodedra.affinity" -}}
{{- $affinity := deepCopy (.Values.affinity | default dict) -}}
{{- with .Instance.exclusions -}}
{{- $exclusions := . -}}
{{- $nodeAffinity := $affinity.nodeAffinity | default dict -}}
{{- $required := $nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution | default dict -}}
{{- $terms := list -}}
{{- range $required.nodeSelectorTerms | default (list dict) -}}
{{- $terms = append $terms (set (deepCopy .) "matchExpressions" (concat (.matchExpressions | default list) $exclusions)) -}}
{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" $terms -}}
{{- $_ := set $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- $_ := set $affinity "nodeAffinity" $nodeAffinity -}}
{{- end -}}
{{- with $affinity -}}
{{ toYaml . }}
{{- end -}}
{{- end }}
