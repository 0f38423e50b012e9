{{/* Chart name, truncated to the DNS label limit. */}}
{{- define "quictun.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart unless the release name already contains the chart name. */}}
{{- define "quictun.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "quictun.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "quictun.labels" -}}
helm.sh/chart: {{ include "quictun.chart" . }}
app.kubernetes.io/name: {{ include "quictun.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of the server pods. */}}
{{- define "quictun.serverSelectorLabels" -}}
app.kubernetes.io/name: {{ include "quictun.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end }}

{{- define "quictun.serverName" -}}
{{- printf "%s-server" (include "quictun.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The headless Service whose name resolves to every ready server replica. */}}
{{- define "quictun.replicaServiceName" -}}
{{- printf "%s-replicas" (include "quictun.serverName" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "quictun.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "quictun.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "quictun.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "quictun.authSecretName" -}}
{{- default (printf "%s-auth" (include "quictun.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{- define "quictun.stateSecretName" -}}
{{- default (printf "%s-state" (include "quictun.fullname" .)) .Values.server.state.existingSecret }}
{{- end }}

{{- define "quictun.echoName" -}}
{{- printf "%s-echo" (include "quictun.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The demo echo destination as a token / allow rule. */}}
{{- define "quictun.echoToken" -}}
{{- printf "tcp:%s.%s.svc.cluster.local:%d" (include "quictun.echoName" .) .Release.Namespace (int .Values.demoEcho.port) }}
{{- end }}

{{/*
The state Secret's data: reused from the live Secret on upgrades (lookup), generated
on first install. Rendered once per template run and cached in .Values so that the
Secret and the NOTES fingerprint agree.
*/}}
{{- define "quictun.stateData" -}}
{{- if not (hasKey .Values "_stateData") }}
{{- $data := dict }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "quictun.stateSecretName" .) }}
{{- if and $existing $existing.data }}
{{- $data = $existing.data }}
{{- else }}
{{- $key := genPrivateKey "ecdsa" }}
{{- $cert := genSelfSignedCertWithKey "quictun-server" nil (list "quictun-server") 3650 $key }}
{{- $_ := set $data "cert.pem" ($cert.Cert | b64enc) }}
{{- $_ := set $data "key.pem" ($cert.Key | b64enc) }}
{{- range $f := list "stateless-reset.key" "session-ticket.key" "address-token.key" }}
{{- $_ := set $data $f (printf "%s\n" (sha256sum (randAlphaNum 64)) | b64enc) }}
{{- end }}
{{- end }}
{{- $_ := set .Values "_stateData" $data }}
{{- end }}
{{- toYaml .Values._stateData }}
{{- end }}

{{/* sha256:<hex> of the DER certificate in a base64-encoded PEM. */}}
{{- define "quictun.fingerprint" -}}
{{- $pem := b64dec . }}
{{- $body := regexReplaceAll "-----[A-Z ]+-----" $pem "" | nospace }}
{{- printf "sha256:%s" (sha256sum (b64dec $body)) }}
{{- end }}

{{/* The auth Secret's data: reused on upgrades, generated (or taken from values) on install. */}}
{{- define "quictun.authData" -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "quictun.authSecretName" .) }}
{{- if and $existing $existing.data }}
{{- toYaml $existing.data }}
{{- else }}
secret: {{ default (randAlphaNum 44) .Values.auth.secret | b64enc | quote }}
admin-token: {{ default (randAlphaNum 44) .Values.auth.adminToken | b64enc | quote }}
{{- end }}
{{- end }}

{{/* server.yaml: the chart's settings, then server.config. */}}
{{- define "quictun.serverConfig" -}}
{{- $allow := .Values.server.allow }}
{{- if .Values.demoEcho.enabled }}
{{- $allow = append $allow (printf "echo=%s" (include "quictun.echoToken" .)) }}
{{- end }}
{{- $cfg := dict
  "listen-on" (printf "0.0.0.0:%d" (int .Values.server.quicPort))
  "state-dir" "/var/lib/quictun-server"
  "secret-file" "/etc/quictun/auth/secret"
  "httpd-listen-on" (printf "0.0.0.0:%d" (int .Values.server.adminPort))
  "httpd-token-file" "/etc/quictun/auth/admin-token"
  "drain-timeout" .Values.server.drainTimeout
  "audit-log" .Values.server.auditLog
  "v" (toString .Values.server.logLevel) }}
{{- /* Without rules the binary's default applies: loopback, i.e. the pod itself. */}}
{{- if not .Values.server.tcpFallback }}
{{- $_ := set $cfg "tcp-listen-on" "off" }}
{{- end }}
{{- if $allow }}
{{- $_ := set $cfg "allow" $allow }}
{{- end }}
{{- if .Values.server.deny }}
{{- $_ := set $cfg "deny" .Values.server.deny }}
{{- end }}
{{- if .Values.server.allowFor }}
{{- $_ := set $cfg "allow-for" .Values.server.allowFor }}
{{- end }}
{{- if .Values.server.keys.existingSecret }}
{{- $_ := set $cfg "keys-file" "/etc/quictun/keys/keys" }}
{{- end }}
{{- toYaml (mergeOverwrite $cfg .Values.server.config) }}
{{- end }}
