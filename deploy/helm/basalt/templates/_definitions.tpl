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
{{- include "basalt.affinity" (dict "root" .root "group" false) }}
{{- end }}

{{/*
With regions, only their nodes; with "group" true (the pods of a replica
over several nodes), each in the zone of a pod of its own group
(matchLabelKeys adds the pod's group key to the selector), so the group's
first pod goes where its resources are and the others follow it. Called with
dict "root" $ "group" BOOL.
*/}}
{{- define "basalt.affinity" -}}
{{- $root := .root -}}
{{- if or $root.Values.regions .group }}
affinity:
  {{- with $root.Values.regions }}
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
  {{- if .group }}
  podAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      - labelSelector:
          matchLabels:
            {{- include "basalt.labels" (dict "root" $root "component" "engine") | nindent 12 }}
        matchLabelKeys:
          - leaderworkerset.sigs.k8s.io/group-key
        topologyKey: topology.kubernetes.io/zone
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
{{- $nodes := int .Values.resources.nodes -}}
{{- if gt $nodes 1 -}}
{{- $gpus := int ((.Values.resources.gpu | default dict).count | default 0) -}}
{{- $tp := include "basalt.tensorParallelSize" . -}}
{{- if ne $tp (toString (mul $gpus $nodes)) -}}
{{- fail (printf "engine.args: a replica over %d nodes of %d GPUs runs its %d GPUs as ranks: give --tp %d (%s)" $nodes $gpus (mul $gpus $nodes) (mul $gpus $nodes) (ternary "no --tp given" (printf "--tp is %s" $tp) (eq $tp "0"))) -}}
{{- end -}}
{{- if has "--dp-attention" (.Values.engine.args | default list) -}}
{{- fail "engine.args: --dp-attention runs over the GPUs of one node; a replica over several nodes runs --tp alone" -}}
{{- end -}}
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

{{/*
An engine pod template (metadata and spec), called with (dict "root" $ "role"
R): R is "alone" (a replica on one node), "leader" (node 0 of a replica
over several nodes: the server) or "worker" (the others: no HTTP port,
probes, preStop or metrics; they join the leader at the address
LeaderWorkerSet gives every pod of the group).
*/}}
{{- define "basalt.enginePodTemplate" -}}
{{- $root := .root -}}
{{- $role := .role -}}
{{- $values := $root.Values -}}
{{- $engine := dict "root" $root "component" "engine" -}}
{{- $gpu := $values.resources.gpu | default dict -}}
{{- $gpuCount := int ($gpu.count | default 0) -}}
{{- $pvc := ($values.model.volume | default dict).pvc -}}
{{- $port := int $values.engine.port -}}
metadata:
  labels:
    {{- include "basalt.labels" $engine | nindent 4 }}
  {{- if ne $role "worker" }}
  annotations:
    prometheus.io/scrape: "true"
    prometheus.io/port: {{ $port | toString | quote }}
    prometheus.io/path: /metrics
  {{- end }}
spec:
  terminationGracePeriodSeconds: {{ add (include "basalt.drainSeconds" $root | int) 15 }}
  {{- include "basalt.podSecurity" $root | nindent 2 }}
  containers:
    - name: engine
      image: {{ $values.image | quote }}
      command: ["basalt"]
      args:
        - serve
        {{- if ne $role "worker" }}
        - --host
        - "0.0.0.0"
        - --port
        - {{ $port | toString | quote }}
        {{- end }}
        - --model
        - {{ $values.model.path | quote }}
        {{- range $values.engine.args }}
        - {{ . | toString | quote }}
        {{- end }}
        {{- if ne $role "alone" }}
        - --nnodes
        - {{ $values.resources.nodes | toString | quote }}
        - --node-rank
        - {{ if eq $role "leader" }}"0"{{ else }}"$(LWS_WORKER_INDEX)"{{ end }}
        - --dist-init-addr
        - {{ if eq $role "leader" }}"0.0.0.0:29500"{{ else }}"$(LWS_LEADER_ADDRESS):29500"{{ end }}
        {{- end }}
      {{- if ne $role "worker" }}
      ports:
        - name: http
          containerPort: {{ $port }}
          protocol: TCP
        {{- if eq $role "leader" }}
        - name: nodes
          containerPort: 29500
          protocol: TCP
        {{- end }}
      {{- end }}
      resources:
        requests:
          cpu: {{ $values.resources.cpu | toString | quote }}
          memory: {{ $values.resources.memory | toString | quote }}
          {{- if gt $gpuCount 0 }}
          nvidia.com/gpu: {{ $gpuCount | toString | quote }}
          {{- end }}
        limits:
          memory: {{ $values.resources.memory | toString | quote }}
          {{- if gt $gpuCount 0 }}
          nvidia.com/gpu: {{ $gpuCount | toString | quote }}
          {{- end }}
      {{- if ne $role "worker" }}
      startupProbe:
        httpGet: {path: /ready, port: http}
        periodSeconds: 1
        timeoutSeconds: 1
        failureThreshold: {{ include "basalt.seconds" $values.engine.startup_timeout }}
      readinessProbe:
        httpGet: {path: /ready, port: http}
        periodSeconds: 5
        timeoutSeconds: 2
        failureThreshold: 2
      livenessProbe:
        httpGet: {path: /health, port: http}
        periodSeconds: 10
        timeoutSeconds: 5
        failureThreshold: 3
      {{- include "basalt.preStop" $root | nindent 6 }}
      {{- end }}
      {{- include "basalt.containerSecurity" $root | nindent 6 }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
        {{- if $pvc }}
        - name: models
          mountPath: /models
          readOnly: true
        {{- end }}
  volumes:
    - name: tmp
      emptyDir: {}
    {{- if $pvc }}
    - name: models
      persistentVolumeClaim:
        claimName: {{ $pvc | quote }}
        readOnly: true
    {{- end }}
  {{- if ne $role "worker" }}
  topologySpreadConstraints:
    - maxSkew: 1
      topologyKey: topology.kubernetes.io/zone
      whenUnsatisfiable: ScheduleAnyway
      labelSelector:
        matchLabels:
          {{- include "basalt.labels" $engine | nindent 10 }}
          {{- if eq $role "leader" }}
          leaderworkerset.sigs.k8s.io/worker-index: "0"
          {{- end }}
  {{- end }}
  {{- include "basalt.affinity" (dict "root" $root "group" (ne $role "alone")) | nindent 2 }}
  {{- if gt $gpuCount 0 }}
  {{- with $gpu.product }}
  nodeSelector:
    nvidia.com/gpu.product: {{ . | quote }}
  {{- end }}
  tolerations:
    - key: nvidia.com/gpu
      operator: Exists
      effect: NoSchedule
  {{- end }}
{{- end }}

{{/* Over several nodes: --tp (or --tensor-parallel-size) in engine.args, or 0. */}}
{{- define "basalt.tensorParallelSize" -}}
{{- $tp := 0 -}}
{{- $args := .Values.engine.args | default list -}}
{{- range $i, $arg := $args -}}
{{- $text := toString $arg -}}
{{- if and (has $text (list "--tp" "--tensor-parallel-size")) (lt (add1 $i) (len $args)) -}}
{{- $tp = toString (index $args (add1 $i)) -}}
{{- else if hasPrefix "--tp=" $text -}}
{{- $tp = trimPrefix "--tp=" $text -}}
{{- else if hasPrefix "--tensor-parallel-size=" $text -}}
{{- $tp = trimPrefix "--tensor-parallel-size=" $text -}}
{{- end -}}
{{- end -}}
{{- $tp -}}
{{- end }}

{{/* What the autoscalers scale: the Deployment, or over several nodes the LeaderWorkerSet (its replicas are groups). */}}
{{- define "basalt.scaleTarget" -}}
{{- if gt (int .Values.resources.nodes) 1 -}}
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
name: {{ printf "%s-group" .Values.name }}
{{- else -}}
apiVersion: apps/v1
kind: Deployment
name: {{ printf "%s-engine" .Values.name }}
{{- end -}}
{{- end }}
