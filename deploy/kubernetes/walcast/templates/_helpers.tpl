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
{{- include "walcast.tlsConfig" (dict "root" .root "name" .name "cfg" $cfg) -}}
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


{{/*
TLS: where the chart mounts the CA certificates (a directory each, outside the config
volume) and what it sets in a service's settings (docs/deploy.md, "Security").
*/}}
{{- define "walcast.kafkaCAPath" -}}
{{- printf "/etc/walcast-tls/kafka/%s" .Values.common.kafkaTLS.ca.key -}}
{{- end -}}

{{- define "walcast.postgresCAPath" -}}
{{- printf "/etc/walcast-tls/postgres/%s" .Values.pg2kafka.postgresTLS.ca.key -}}
{{- end -}}

{{- define "walcast.targetCAPath" -}}
{{- printf "/etc/walcast-tls/target-postgres/%s" .Values.kafka2postgres.targetTLS.ca.key -}}
{{- end -}}

{{/*
Sets into .cfg (a service's merged config, changed in place):
* with common.kafkaTLS.ca, kafka.ssl_ca_location = the mounted CA, unless config names one;
* pg2kafka: postgres.sslmode verify-full unless config sets it; a verifying mode
  (verify-ca, verify-full) gets postgres.sslrootcert = the mounted postgresTLS.ca unless
  config names its own; a mode that does not check the server's certificate (disable,
  allow, prefer, require) is refused unless pg2kafka.postgresTLS.insecure acknowledges it
  (NOTES.txt then warns at every install and upgrade);
* kafka2postgres: the same for target.postgres, with kafka2postgres.targetTLS.
*/}}
{{- define "walcast.tlsConfig" -}}
{{- $kca := .root.Values.common.kafkaTLS.ca -}}
{{- if and $kca.secretName $kca.configMapName -}}
{{- fail "common.kafkaTLS.ca: give secretName or configMapName, not both" -}}
{{- end -}}
{{- if or $kca.secretName $kca.configMapName -}}
{{- $k := get .cfg "kafka" | default dict -}}
{{- if not (get $k "ssl_ca_location") -}}
{{- $_ := set $k "ssl_ca_location" (include "walcast.kafkaCAPath" .root) -}}
{{- end -}}
{{- $_ := set .cfg "kafka" $k -}}
{{- end -}}
{{- if eq .name "pg2kafka" -}}
{{- $t := .root.Values.pg2kafka.postgresTLS -}}
{{- if and $t.ca.secretName $t.ca.configMapName -}}
{{- fail "pg2kafka.postgresTLS.ca: give secretName or configMapName, not both" -}}
{{- end -}}
{{- $pg := get .cfg "postgres" | default dict -}}
{{- $mode := get $pg "sslmode" | default "verify-full" -}}
{{- if has $mode (list "disable" "allow" "prefer" "require") -}}
{{- if not $t.insecure -}}
{{- fail (printf "pg2kafka.config.postgres.sslmode is %s: pg2kafka would not verify PostgreSQL's certificate, so whoever sits on the path reads every change and can impersonate the database. Give the server's CA (pg2kafka.postgresTLS.ca; sslmode then defaults to verify-full) or, knowingly, acknowledge with pg2kafka.postgresTLS.insecure: true" $mode) -}}
{{- end -}}
{{- else if not (get $pg "sslrootcert") -}}
{{- $_ := set $pg "sslrootcert" (include "walcast.postgresCAPath" .root) -}}
{{- end -}}
{{- $_ := set $pg "sslmode" $mode -}}
{{- $_ := set .cfg "postgres" $pg -}}
{{- end -}}
{{- if eq .name "kafka2postgres" -}}
{{- $t := .root.Values.kafka2postgres.targetTLS -}}
{{- if and $t.ca.secretName $t.ca.configMapName -}}
{{- fail "kafka2postgres.targetTLS.ca: give secretName or configMapName, not both" -}}
{{- end -}}
{{- $target := get .cfg "target" | default dict -}}
{{- $pg := get $target "postgres" | default dict -}}
{{- $mode := get $pg "sslmode" | default "verify-full" -}}
{{- if has $mode (list "disable" "allow" "prefer" "require") -}}
{{- if not $t.insecure -}}
{{- fail (printf "kafka2postgres.config.target.postgres.sslmode is %s: kafka2postgres would not verify the target PostgreSQL's certificate, so whoever sits on the path reads every row written and can impersonate the database. Give the server's CA (kafka2postgres.targetTLS.ca; sslmode then defaults to verify-full) or, knowingly, acknowledge with kafka2postgres.targetTLS.insecure: true" $mode) -}}
{{- end -}}
{{- else if not (get $pg "sslrootcert") -}}
{{- $_ := set $pg "sslrootcert" (include "walcast.targetCAPath" .root) -}}
{{- end -}}
{{- $_ := set $pg "sslmode" $mode -}}
{{- $_ := set $target "postgres" $pg -}}
{{- $_ := set .cfg "target" $target -}}
{{- end -}}
{{- end -}}

{{/* A CA volume's source: .ca (secretName | configMapName, key); .secretName: the default Secret. */}}
{{- define "walcast.caSource" -}}
{{- if .ca.configMapName -}}
configMap:
  name: {{ .ca.configMapName }}
  items: [{key: {{ .ca.key | quote }}, path: {{ .ca.key | quote }}}]
{{- else -}}
secret:
  secretName: {{ .ca.secretName | default .secretName }}
  items: [{key: {{ .ca.key | quote }}, path: {{ .ca.key | quote }}}]
{{- end -}}
{{- end -}}

{{/* The CA volumes (and mounts) a service's parsed config (.cfg) refers to. */}}
{{- define "walcast.tlsVolumes" -}}
{{- if eq (toString ((.cfg.kafka).ssl_ca_location)) (include "walcast.kafkaCAPath" .root) }}
- name: kafka-ca
  {{- include "walcast.caSource" (dict "ca" .root.Values.common.kafkaTLS.ca "secretName" "") | nindent 2 }}
{{- end }}
{{- if eq (toString ((.cfg.postgres).sslrootcert)) (include "walcast.postgresCAPath" .root) }}
- name: postgres-ca
  {{- include "walcast.caSource" (dict "ca" .root.Values.pg2kafka.postgresTLS.ca "secretName" (.root.Values.pg2kafka.secretName | default .root.Values.secrets.name)) | nindent 2 }}
{{- end }}
{{- if eq (toString (((.cfg.target).postgres).sslrootcert)) (include "walcast.targetCAPath" .root) }}
- name: target-postgres-ca
  {{- include "walcast.caSource" (dict "ca" .root.Values.kafka2postgres.targetTLS.ca "secretName" (.root.Values.kafka2postgres.secretName | default .root.Values.secrets.name)) | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "walcast.tlsMounts" -}}
{{- if eq (toString ((.cfg.kafka).ssl_ca_location)) (include "walcast.kafkaCAPath" .root) }}
- {name: kafka-ca, mountPath: /etc/walcast-tls/kafka, readOnly: true}
{{- end }}
{{- if eq (toString ((.cfg.postgres).sslrootcert)) (include "walcast.postgresCAPath" .root) }}
- {name: postgres-ca, mountPath: /etc/walcast-tls/postgres, readOnly: true}
{{- end }}
{{- if eq (toString (((.cfg.target).postgres).sslrootcert)) (include "walcast.targetCAPath" .root) }}
- {name: target-postgres-ca, mountPath: /etc/walcast-tls/target-postgres, readOnly: true}
{{- end }}
{{- end -}}

{{/*
kafka2spark's namespace. With a k8s:// master its driver creates pods (and ConfigMaps,
Services) through a Role, and a pod can mount any Secret of its namespace: so the driver,
its executors, its volume and its Role live in a namespace of their own
(kafka2spark.namespace.name, default <release namespace>-spark), which holds only
kafka2spark's Secret. The release namespace is refused while another service runs there.
Local mode (no pods created, no Role): the release namespace.
*/}}
{{- define "walcast.sparkNamespace" -}}
{{- $v := .Values.kafka2spark -}}
{{- if hasPrefix "k8s://" $v.spark.master -}}
{{- $ns := $v.namespace.name | default (printf "%s-spark" .Release.Namespace | trunc 63 | trimSuffix "-") -}}
{{- if eq $ns .Release.Namespace -}}
{{- range $s := list "pg2kafka" "kafka2search" "kafka2webhook" "kafka2postgres" -}}
{{- if (index $.Values $s).enabled -}}
{{- fail (printf "kafka2spark.namespace.name is the release namespace (%s), where %s runs: kafka2spark's driver creates pods in its namespace, and a pod can mount any Secret there (%s's credentials too). Give kafka2spark a namespace of its own, or install it alone in a release of its own" $ns $s $s) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $ns -}}
{{- else -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end -}}
