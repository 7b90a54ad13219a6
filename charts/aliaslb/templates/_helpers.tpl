{{/*
The labels every object of the chart carries: what manifests/kustomization.yaml adds with
`labels:` (on the objects, not on selectors or pod templates).
*/}}
{{- define "aliaslb.labels" -}}
app.kubernetes.io/part-of: aliaslb
{{- end }}

{{/*
The image of a component (`dict "root" . "component" .Values.controller`): the component's
image.repository and image.tag where set (a staged upgrade), else image.repository and
image.tag, the tag defaulting to the chart's appVersion (the kustomization's `images:` newTag).
*/}}
{{- define "aliaslb.image" -}}
{{- $root := .root -}}
{{- $own := .component.image | default dict -}}
{{- $repository := $own.repository | default $root.Values.image.repository -}}
{{- $tag := $own.tag | default $root.Values.image.tag | default $root.Chart.AppVersion -}}
{{ $repository }}:{{ $tag }}
{{- end }}

{{/*
The namespace of the agents' Leases (agentLeases.namespace): never the release's own, where
agents must have no write right.
*/}}
{{- define "aliaslb.agentNamespace" -}}
{{- $ns := required "agentLeases.namespace must name a namespace" .Values.agentLeases.namespace -}}
{{- if eq $ns .Release.Namespace -}}
{{- fail (printf "agentLeases.namespace is %q, the release's own namespace: the agents may write Leases in their namespace, so it must be another one (the controller keeps its leader Lease, the pools and the assignments in %q)" $ns .Release.Namespace) -}}
{{- end -}}
{{- $ns -}}
{{- end }}

{{/*
What a pod template of a component adds from its values (`dict "root" . "component"
.Values.agent`): the pod's imagePullSecrets, nodeSelector, tolerations, priorityClassName,
each only when set; indented for the pod spec.
*/}}
{{- define "aliaslb.podPlacement" -}}
{{- with .root.Values.imagePullSecrets -}}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .component.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .component.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .component.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The RUST_LOG variable of a component's container when its logLevel is set (`dict "component"
.Values.agent`), indented for the container's env list.
*/}}
{{- define "aliaslb.logLevel" -}}
{{- with .component.logLevel }}
- name: RUST_LOG
  value: {{ . | quote }}
{{- end }}
{{- end }}

{{/*
The alert rules: files/aliaslb.rules.yaml (a copy of
manifests/optional/monitoring/aliaslb.rules.yaml) with monitoring.alerts applied: an alert
with `enabled: false` is left out, `for` and `severity` replace the rule's, and `threshold`
replaces the number the rule's expression compares with (its one `>`, `>=`, `<` or `<=`
followed by a number). With the default values the rules are the file's
(controller/tests/helm.rs checks both).
*/}}
{{- define "aliaslb.rules" -}}
{{- $alerts := .Values.monitoring.alerts | default dict -}}
{{- $groups := list -}}
{{- range $group := (.Files.Get "files/aliaslb.rules.yaml" | fromYaml).groups -}}
{{- $rules := list -}}
{{- range $rule := $group.rules -}}
{{- $cfg := get $alerts $rule.alert | default dict -}}
{{- if not (and (hasKey $cfg "enabled") (not $cfg.enabled)) -}}
{{- $r := deepCopy $rule -}}
{{- with $cfg.for }}{{ $_ := set $r "for" . }}{{ end -}}
{{- with $cfg.severity }}{{ $_ := set $r.labels "severity" . }}{{ end -}}
{{- if hasKey $cfg "threshold" -}}
{{- $_ := set $r "expr" (regexReplaceAll "([<>]=?) [0-9][0-9.e+]*" $r.expr (printf "${1} %v" $cfg.threshold)) -}}
{{- end -}}
{{- $rules = append $rules $r -}}
{{- end -}}
{{- end -}}
{{- if $rules -}}
{{- $groups = append $groups (dict "name" $group.name "rules" $rules) -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "groups" $groups) -}}
{{- end }}

{{/*
BIRD's configuration: birdSidecar.config, else the example of the kustomize component
(files/bird.conf, a copy of manifests/optional/bird-sidecar/bird.conf).
*/}}
{{- define "aliaslb.birdConf" -}}
{{- .Values.birdSidecar.config | default (.Files.Get "files/bird.conf") -}}
{{- end }}

{{/*
The name of BIRD's ConfigMap: `aliaslb-bird-` and the suffix kustomize's configMapGenerator
gives it (sigs.k8s.io/kustomize/api/hasher: the SHA-256 of {"data","kind","name"} as Go's
encoding/json writes them, its first ten hex digits with 0, 1, 3, a and e spelled g, h, k, m
and t). The name in the hash is empty: kustomize looks it up with `yaml.Lookup("metadata/name")`,
one field of that literal name, which no ConfigMap has. So the chart renders the component's
very name, and a changed bird.conf rolls the agents, as it does with kustomize.
*/}}
{{- define "aliaslb.birdConfigName" -}}
{{- $hashed := dict "data" (dict "bird.conf" (include "aliaslb.birdConf" .)) "kind" "ConfigMap" "name" "" -}}
{{- $hex := $hashed | toJson | sha256sum | trunc 10 -}}
aliaslb-bird-{{ $hex | replace "0" "g" | replace "1" "h" | replace "3" "k" | replace "a" "m" | replace "e" "t" }}
{{- end }}
