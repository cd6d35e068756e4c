{{/* The labels every object and pod carries; called with (dict "root" $ "component" "engine"). */}}
{{- define "basalt.labels" -}}
app.kubernetes.io/name: basalt
app.kubernetes.io/instance: {{ .root.Values.name | quote }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "basalt.metadata" -}}
name: {{ printf "%s-%s" .root.Values.name .component }}
namespace: {{ .root.Release.Namespace }}
labels:
  {{- include "basalt.labels" . | nindent 2 }}
{{- end }}

{{/* A duration of basalt.yaml (30s, 5m, 1h) in whole seconds, rounded up. */}}
{{- define "basalt.seconds" -}}
{{- $text := toString . -}}
{{- $unit := substr (int (sub (len $text) 1)) (len $text) $text -}}
{{- $scale := dict "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- if not (hasKey $scale $unit) -}}
{{- fail (printf "%s is not a duration (a number with s, m or h)" $text) -}}
{{- end -}}
{{- mulf (float64 (trimSuffix $unit $text)) (get $scale $unit) | ceil | int -}}
{{- end }}

{{/* The engine's --drain-timeout from engine.args, else serve's default (30 s). */}}
{{- define "basalt.drainSeconds" -}}
{{- $drain := 30.0 -}}
{{- $args := .Values.engine.args -}}
{{- range $i, $arg := $args -}}
{{- if eq (toString $arg) "--drain-timeout" -}}
{{- if ge (add1 $i) (len $args) -}}{{- fail "engine.args: --drain-timeout without a value" -}}{{- end -}}
{{- $drain = float64 (index $args (add1 $i)) -}}
{{- else if hasPrefix "--drain-timeout=" (toString $arg) -}}
{{- $drain = float64 (trimPrefix "--drain-timeout=" (toString $arg)) -}}
{{- end -}}
{{- end -}}
{{- if or (le $drain 0.0) (gt $drain 86400.0) -}}
{{- fail (printf "engine.args: --drain-timeout %v is not seconds in (0, 86400]" $drain) -}}
{{- end -}}
{{- ceil $drain | int -}}
{{- end }}

{{/* Pods: non-root (the images' user basalt, 10001), no service account token. */}}
{{- define "basalt.podSecurity" -}}
automountServiceAccountToken: false
enableServiceLinks: false
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  fsGroup: 10001
  seccompProfile:
    type: RuntimeDefault
{{- end }}

{{- define "basalt.containerSecurity" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
{{- end }}

{{/* Zone spread (ScheduleAnyway) and, with regions, only their nodes. */}}
{{- define "basalt.placement" -}}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "basalt.labels" . | nindent 8 }}
{{- with .root.Values.regions }}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
        - matchExpressions:
            - key: topology.kubernetes.io/region
              operator: In
              values:
                {{- range . }}
                - {{ . | quote }}
                {{- end }}
{{- end }}
{{- end }}

{{- define "basalt.preStop" -}}
lifecycle:
  preStop:
    exec:
      command: ["sleep", "5"]
{{- end }}

{{/* replicas.max, which defaults to replicas.min (at least 1) as in basalt.yaml. */}}
{{- define "basalt.maxReplicas" -}}
{{- if hasKey .Values.replicas "max" }}{{ int .Values.replicas.max }}{{ else }}{{ max (int .Values.replicas.min) 1 }}{{ end -}}
{{- end }}

{{/* autoscaling.target: 8 requests per replica by default; seconds metrics need one. */}}
{{- define "basalt.target" -}}
{{- if hasKey .Values.autoscaling "target" }}{{ .Values.autoscaling.target }}
{{- else if eq .Values.autoscaling.metric "concurrency" }}8
{{- else }}{{ fail (printf "autoscaling.target: required with metric %s (seconds)" .Values.autoscaling.metric) }}
{{- end -}}
{{- end }}

{{- define "basalt.autoscaled" -}}
{{- if gt (include "basalt.maxReplicas" . | int) (int .Values.replicas.min) }}true{{ end -}}
{{- end }}

{{/* What the spec cannot be rendered to, as `basalt deploy render` refuses it. */}}
{{- define "basalt.check" -}}
{{- range $field := list "name" "image" -}}
{{- if not (get $.Values $field) }}{{ fail (printf "%s: required" $field) }}{{ end -}}
{{- end -}}
{{- if not .Values.model.path }}{{ fail "model.path: required" }}{{ end -}}
{{- if gt (int .Values.resources.nodes) 1 -}}
{{- fail (printf "resources.nodes: %v: a replica over several nodes is a LeaderWorkerSet, which this chart does not write yet" .Values.resources.nodes) -}}
{{- end -}}
{{- if lt (include "basalt.maxReplicas" . | int) (int .Values.replicas.min) -}}
{{- fail (printf "replicas.max: %v is below replicas.min (%v)" (include "basalt.maxReplicas" .) .Values.replicas.min) -}}
{{- end -}}
{{- if not (has .Values.autoscaler (list "keda" "hpa")) }}{{ fail "autoscaler: keda or hpa" }}{{ end -}}
{{- $target := include "basalt.target" . -}}
{{- $startup := int (include "basalt.seconds" .Values.engine.startup_timeout) -}}
{{- if or (le $startup 0) (gt $startup 86400) -}}
{{- fail (printf "engine.startup_timeout: '%v' must be above 0 and at most a day" .Values.engine.startup_timeout) -}}
{{- end -}}
{{- if not (has .Values.autoscaling.metric (list "concurrency" "queue_time" "ttft_p95")) -}}
{{- fail (printf "autoscaling.metric: '%s' is not concurrency, queue_time or ttft_p95" .Values.autoscaling.metric) -}}
{{- end -}}
{{- if and (include "basalt.autoscaled" .) (eq (int .Values.replicas.min) 0) -}}
{{- if eq .Values.autoscaler "hpa" }}{{ fail "replicas.min: 0 (scale to zero) needs autoscaler keda: the HPA keeps at least one replica" }}{{ end -}}
{{- end -}}
{{- end }}
