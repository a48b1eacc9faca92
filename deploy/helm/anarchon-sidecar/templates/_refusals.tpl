{{/*
What the chart refuses to render unless a value under `unsafe` says so
(docs/DEPLOY.md, "Helm"), as the Ansible role refuses the same: a credential
in the ConfigMap (a ConfigMap is readable by whoever may read the namespace's
ConfigMaps, and is shown by `kubectl describe`), a secret as a plain
environment value, a privileged or root sidecar or app, a sidecar without
memory bounds. Each refusal names the value and the flag that lifts it.
*/}}

{{/* Header names that carry credentials: what the sidecar also keeps out of its
repr and bucket jobs may not set (Authorization, Cookie, X-Api-Key, ...). */}}
{{- define "anarchon-sidecar.credentialHeader" -}}
{{- if regexMatch "(?i)(auth|token|secret|passw|cookie|api[-_]?key|credential|session|signature)" . }}yes{{ end }}
{{- end }}

{{- define "anarchon-sidecar.refusals" -}}
{{- $unsafe := .Values.unsafe | default dict }}
{{- $lift := "set unsafe.%s: true to render it anyway" }}
{{- /* Credentials in the ConfigMap. */}}
{{- if and (not .Values.sidecar.existingConfigMap) (not $unsafe.credentialsInConfig) }}
{{- $config := .Values.sidecar.config | default dict }}
{{- $why := printf "is a credential in the ConfigMap: put it in a Secret (docs/DEPLOY.md, \"Helm\"), or %s" (printf $lift "credentialsInConfig") }}
{{- $target := $config.target | default dict }}
{{- range $name, $_ := ($target.headers | default dict) }}
{{- if include "anarchon-sidecar.credentialHeader" $name }}
{{- fail (printf "sidecar.config.target.headers.%s %s" $name $why) }}
{{- end }}
{{- end }}
{{- range $i, $job := ($config.jobs | default list) }}
{{- $request := (kindIs "map" $job) | ternary ($job.request | default dict) dict }}
{{- range $name, $_ := ($request.headers | default dict) }}
{{- if include "anarchon-sidecar.credentialHeader" $name }}
{{- fail (printf "sidecar.config.jobs[%d].request.headers.%s %s" $i $name $why) }}
{{- end }}
{{- end }}
{{- if and (kindIs "map" $job) $job.ping }}
{{- fail (printf "sidecar.config.jobs[%d].ping (a ping URL carries the check's key) %s" $i $why) }}
{{- end }}
{{- end }}
{{- $defaults := $config.defaults | default dict }}
{{- if $defaults.ping }}
{{- fail (printf "sidecar.config.defaults.ping (a ping URL carries the check's key) %s" $why) }}
{{- end }}
{{- if $config.notify }}
{{- fail (printf "sidecar.config.notify (a webhook URL carries the channel's key) %s" $why) }}
{{- end }}
{{- $nats := $config.nats | default dict }}
{{- if $nats.token }}
{{- fail (printf "sidecar.config.nats.token %s" $why) }}
{{- end }}
{{- end }}
{{- /* Secrets as plain environment values. */}}
{{- if not $unsafe.secretEnv }}
{{- range $i, $env := (.Values.sidecar.env | default list) }}
{{- if and (has $env.name (list "ANARCHON_NATS_PASSWORD" "ANARCHON_NATS_TOKEN" "ANARCHON_SIGNING_SECRET" "ANARCHON_SIGNING_SECRET_NEXT")) (hasKey $env "value") }}
{{- fail (printf "sidecar.env[%d] %s is a secret as a plain value (in the Deployment, for whoever may read it): mount it from a Secret as a file (secrets.*), use valueFrom.secretKeyRef, or %s" $i $env.name (printf $lift "secretEnv")) }}
{{- end }}
{{- end }}
{{- end }}
{{- /* Privileged or root containers in the pod. */}}
{{- if not $unsafe.privileged }}
{{- $contexts := list (list "sidecar.securityContext" .Values.sidecar.securityContext) (list "app.podSecurityContext" .Values.app.podSecurityContext) }}
{{- range $i, $c := (.Values.app.containers | default list) }}
{{- $contexts = append $contexts (list (printf "app.containers[%d].securityContext" $i) $c.securityContext) }}
{{- end }}
{{- range $i, $c := (.Values.app.initContainers | default list) }}
{{- $contexts = append $contexts (list (printf "app.initContainers[%d].securityContext" $i) $c.securityContext) }}
{{- end }}
{{- range $pair := $contexts }}
{{- $where := index $pair 0 }}
{{- $sc := index $pair 1 | default dict }}
{{- $how := "" }}
{{- if $sc.privileged }}{{ $how = "privileged: true" }}
{{- else if and (hasKey $sc "runAsUser") (eq (toString $sc.runAsUser) "0") }}{{ $how = "runAsUser: 0 (root)" }}
{{- else if and (hasKey $sc "runAsNonRoot") (not $sc.runAsNonRoot) }}{{ $how = "runAsNonRoot: false" }}
{{- else if $sc.allowPrivilegeEscalation }}{{ $how = "allowPrivilegeEscalation: true" }}
{{- end }}
{{- if $how }}
{{- fail (printf "%s has %s: the chart renders a restricted pod; %s" $where $how (printf $lift "privileged")) }}
{{- end }}
{{- end }}
{{- if not .Values.sidecar.securityContext }}
{{- fail (printf "sidecar.securityContext is empty: the sidecar would run as its image says, not restricted; %s" (printf $lift "privileged")) }}
{{- end }}
{{- end }}
{{- /* The sidecar's memory bounded. */}}
{{- if not $unsafe.noResources }}
{{- $res := .Values.sidecar.resources | default dict }}
{{- if not (and ($res.requests | default dict).memory ($res.limits | default dict).memory) }}
{{- fail (printf "sidecar.resources needs requests.memory and limits.memory (docs/DEPLOY.md, \"Resources\"): without them one sidecar can starve its node; %s" (printf $lift "noResources")) }}
{{- end }}
{{- end }}
{{- end }}
