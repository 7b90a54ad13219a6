{{/*
The labels every object of the chart carries: what manifests/kustomization.yaml adds with
`labels:` (on the objects, not on selectors or pod templates).
*/}}
{{- define "aliaslb.labels" -}}
app.kubernetes.io/part-of: aliaslb
{{- end }}

{{/*
The image of both binaries (and of the aliaslb CLI): image.repository:image.tag, the tag
defaulting to the chart's appVersion (the kustomization's `images:` newTag).
*/}}
{{- define "aliaslb.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
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
