{{/* Names and labels. */}}
{{- define "walcast.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* dict "root" $ "name" "pg2kafka" */}}
{{- define "walcast.component" -}}
{{- printf "%s-%s" (include "walcast.fullname" .root) .name -}}
{{- end -}}

{{- define "walcast.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .name }}
{{- end -}}

{{- define "walcast.labels" -}}
{{ include "walcast.selectorLabels" . }}
app.kubernetes.io/part-of: walcast
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "walcast.image" -}}
{{- $tag := .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- printf "%s/%s:%s" .root.Values.image.registry (index .root.Values .name).image $tag -}}
{{- end -}}

{{/* The environment prefix of a service's settings (shared/settings.py). */}}
{{- define "walcast.envPrefix" -}}
{{- upper .name -}}_
{{- end -}}

{{/*
A memory quantity ("512Mi", "2Gi", "1G", "300000000") in bytes. Fractions are refused:
they would round silently.
*/}}
{{- define "walcast.bytes" -}}
{{- $q := toString . -}}
{{- if not (regexMatch "^[0-9]+(Ki|Mi|Gi|Ti|k|K|M|G|T)?$" $q) -}}
{{- fail (printf "memory quantity %q: use a whole number with Ki, Mi, Gi, K, M or G" $q) -}}
{{- end -}}
{{- $n := regexFind "^[0-9]+" $q | int64 -}}
{{- $unit := trimPrefix (regexFind "^[0-9]+" $q) $q -}}
{{- $mult := dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "K" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 -}}
{{- mul $n (index $mult $unit) -}}
{{- end -}}

{{/*
A service's settings file: common.config under the service's config, then what the
chart decides (the ops endpoint listens on the pod's address). Refuses a credential in
it: those belong in secretEnv.
*/}}
{{- define "walcast.config" -}}
{{- $svc := index .root.Values .name -}}
{{- $cfg := mergeOverwrite (deepCopy (.root.Values.common.config | default dict)) (deepCopy ($svc.config | default dict)) -}}
{{- $_ := set $cfg "http" (mergeOverwrite (deepCopy (get $cfg "http" | default dict)) (dict "enabled" true "host" "0.0.0.0" "port" $svc.service.port)) -}}
{{- range $k, $v := (.extra | default dict) -}}
{{- $_ := set $cfg $k (mergeOverwrite (deepCopy (get $cfg $k | default dict)) $v) -}}
{{- end -}}
{{- $text := toYaml $cfg -}}
{{- $name := .name -}}
{{- if regexMatch "[a-zA-Z][a-zA-Z0-9+.-]*://[^\\s/@:]*:[^\\s/@]+@" $text -}}
{{- fail (printf "%s.config holds a URL with a password: move the credential to %s.secretEnv (a Secret), never a ConfigMap" $name $name) -}}
{{- end -}}
{{- range $line := splitList "\n" $text -}}
{{- if regexMatch "^\\s*(- )?[^\\s:]+:\\s*\\S" $line -}}
{{- $key := regexReplaceAll "^\\s*(- )?([^\\s:]+):.*$" $line "${2}" | trimAll "\"'" -}}
{{- $val := regexReplaceAll "^\\s*(- )?[^\\s:]+:\\s*(.*)$" $line "${2}" -}}
{{- /* shared/secrets.py is_secret_key: a key naming a secret, not a switch or a place */ -}}
{{- if and (regexMatch "(?i)secret|passw(or)?d|pwd|token|credential|jaas|oauthbearer[._-]?config|(api|access|account|private|encryption)[._-]?key([^a-z]|$)|key[._-]?pem" $key) (not (regexMatch "(?i)[._-](enabled|provider|mechanism|url|location|type|method|class|file|path)$" $key)) (not (has $val (list "true" "false" "null" "''" "\"\"" "{}" "[]"))) -}}
{{- fail (printf "%s.config holds a credential (%s): move it to %s.secretEnv (a Secret), never a ConfigMap" $name $key $name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $text -}}
{{- end -}}

{{/* The secretEnv of a service as env entries named with its prefix. */}}
{{- define "walcast.secretEnv" -}}
{{- $svc := index .root.Values .name -}}
{{- $prefix := include "walcast.envPrefix" . -}}
{{- range $name, $key := ($svc.secretEnv | default dict) }}
- name: {{ printf "%s%s" $prefix $name }}
  valueFrom:
    secretKeyRef:
      name: {{ $svc.secretName | default $.root.Values.secrets.name }}
      key: {{ $key }}
{{- end }}
{{- end -}}

{{- define "walcast.podSecurityContext" -}}
{{ toYaml .Values.common.podSecurityContext }}
{{- end -}}

{{- define "walcast.containerSecurityContext" -}}
{{ toYaml .Values.common.containerSecurityContext }}
{{- end -}}

{{/* The probes on the ops endpoint (shared/http.py): /health for liveness, /ready. */}}
{{- define "walcast.probes" -}}
startupProbe:
  httpGet: {path: /health, port: ops}
  periodSeconds: 5
  failureThreshold: 60
livenessProbe:
  httpGet: {path: /health, port: ops}
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 6
readinessProbe:
  httpGet: {path: /ready, port: ops}
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 3
{{- end -}}

{{/* Scheduling settings shared by every pod. */}}
{{- define "walcast.scheduling" -}}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
{{ toYaml . }}
{{- end }}
{{- with .Values.common.nodeSelector }}
nodeSelector:
{{ toYaml . | indent 2 }}
{{- end }}
{{- with .Values.common.tolerations }}
tolerations:
{{ toYaml . }}
{{- end }}
{{- with .Values.common.affinity }}
affinity:
{{ toYaml . | indent 2 }}
{{- end }}
{{- end -}}
