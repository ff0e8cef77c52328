{{/*
Chart name, overridable by nameOverride.
*/}}
{{- define "causeway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Prefix of every resource name: fullnameOverride, else the release name,
followed by the chart name unless the release name already contains it.
*/}}
{{- define "causeway.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Labels that select the operator pods. Never change these across releases:
a Deployment's selector is immutable.
*/}}
{{- define "causeway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "causeway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/*
Labels of every object the chart makes.
*/}}
{{- define "causeway.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "causeway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: causeway
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
commonAnnotations, as a whole `annotations:` block (nothing when empty), at
the indentation of metadata's fields. Objects with annotations of their own
merge them in.
*/}}
{{- define "causeway.annotations" -}}
{{- $all := merge (dict) (.extra | default dict) (.root.Values.commonAnnotations | default dict) -}}
{{- with $all }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
The operator's ServiceAccount.
*/}}
{{- define "causeway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "causeway.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
The operator image, and the data-plane image (the operator's unless set).
*/}}
{{- define "causeway.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) -}}
{{- end -}}

{{- define "causeway.dataPlaneImage" -}}
{{- .Values.dataPlane.image | default (include "causeway.image" .) -}}
{{- end -}}

{{/*
Name of the OpenShift SCC for the data-plane pods.
*/}}
{{- define "causeway.sccName" -}}
{{- .Values.openshift.scc.name | default (printf "%s-dataplane" (include "causeway.fullname" .)) -}}
{{- end -}}

{{/*
Refuses values that cannot work, with a message saying what to change.
*/}}
{{- define "causeway.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) -}}
{{- fail (printf "replicaCount is %d but leaderElection.enabled is false: several operators would reconcile the same Infra objects at once. Set leaderElection.enabled=true, or replicaCount=1." (int .Values.replicaCount)) -}}
{{- end -}}
{{- if not (and (ge (int .Values.healthProbe.port) 1) (le (int .Values.healthProbe.port) 65535)) -}}
{{- fail (printf "healthProbe.port is %v: it must be a port number (1-65535)" .Values.healthProbe.port) -}}
{{- end -}}
{{- if lt (int .Values.replicaCount) 0 -}}
{{- fail "replicaCount must not be negative" -}}
{{- end -}}
{{- if not (has .Values.dpf.csrApprover.hostedApiserver (list "service" "kubeconfig")) -}}
{{- fail (printf "dpf.csrApprover.hostedApiserver is %q: it must be service or kubeconfig" (toString .Values.dpf.csrApprover.hostedApiserver)) -}}
{{- end -}}
{{- if not (has .Values.webhook.certSource (list "service-ca" "cert-manager" "self-signed")) -}}
{{- fail (printf "webhook.certSource is %q: it must be service-ca, cert-manager or self-signed" (toString .Values.webhook.certSource)) -}}
{{- end -}}
{{- if not (has .Values.webhook.failurePolicy (list "Fail" "Ignore")) -}}
{{- fail (printf "webhook.failurePolicy is %q: it must be Fail or Ignore" (toString .Values.webhook.failurePolicy)) -}}
{{- end -}}
{{- if not (has .Values.placement.target (list "master" "worker" "custom")) -}}
{{- fail (printf "placement.target is %q: it must be master, worker or custom" (toString .Values.placement.target)) -}}
{{- end -}}
{{- if and .Values.openshift.scc.enabled (not .Values.openshift.scc.allNamespaces) (empty .Values.openshift.scc.namespaces) -}}
{{- fail "openshift.scc.enabled is true but no ServiceAccount would be granted it: list the namespaces holding Infra objects in openshift.scc.namespaces, or set openshift.scc.allNamespaces=true" -}}
{{- end -}}
{{- end -}}

{{/*
Node placement of the operator pods (nodeSelector, tolerations, affinity),
rendered at the indentation of a pod spec's fields.

master: a required node affinity with two terms, which Kubernetes ORs: a
node labelled node-role.kubernetes.io/control-plane (Kubernetes >= 1.24;
OpenShift sets it too) or node-role.kubernetes.io/master (older clusters,
OpenShift). A nodeSelector could only require one of the two. Plus
tolerations of both NoSchedule taints.
worker: one term requiring that neither label exists.
custom: the values as given.
*/}}
{{- define "causeway.placement" -}}
{{- $target := .Values.placement.target -}}
{{- if eq $target "custom" -}}
{{- with .Values.placement.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.placement.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.placement.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- else }}
{{- if eq $target "master" }}
tolerations:
  - key: node-role.kubernetes.io/control-plane
    operator: Exists
    effect: NoSchedule
  - key: node-role.kubernetes.io/master
    operator: Exists
    effect: NoSchedule
{{- end }}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
      {{- if eq $target "master" }}
        - matchExpressions:
            - key: node-role.kubernetes.io/control-plane
              operator: Exists
        - matchExpressions:
            - key: node-role.kubernetes.io/master
              operator: Exists
      {{- else }}
        - matchExpressions:
            - key: node-role.kubernetes.io/control-plane
              operator: DoesNotExist
            - key: node-role.kubernetes.io/master
              operator: DoesNotExist
      {{- end }}
  {{- if gt (int .Values.replicaCount) 1 }}
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "causeway.selectorLabels" . | nindent 14 }}
  {{- end }}
{{- end }}
{{- end -}}
