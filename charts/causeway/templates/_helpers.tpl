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
The labels of every object (causeway.labels) with more of the object's own,
which win on a clash: (dict "root" $ "extra" MAP), rendered as YAML.
*/}}
{{- define "causeway.labelsWith" -}}
{{- $base := include "causeway.labels" .root | fromYaml -}}
{{- toYaml (merge (deepCopy (.extra | default dict)) $base) -}}
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
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) -}}
{{- end -}}
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
{{- if regexMatch "(^|/)dpf-hcp-provisioner(-rhel[0-9]+)?-operator$" (toString .Values.image.repository) -}}
{{- fail (printf "image.repository is %q, the DPF-HCP provisioner operator's own image, not causeway's (the Go chart's values file sets it, with image.tag %q): drop image.* from that file, or set image.repository and image.tag to causeway's image." (toString .Values.image.repository) (toString .Values.image.tag)) -}}
{{- end -}}
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
{{- if and .Values.namespace (ne (toString .Values.namespace) .Release.Namespace) -}}
{{- fail (printf "namespace is %q but the release is installed in namespace %q: this chart puts the operator and all its namespaced objects in the release namespace. Install with --namespace %s --create-namespace, or drop the namespace value." (toString .Values.namespace) .Release.Namespace (toString .Values.namespace)) -}}
{{- end -}}
{{- $defaultContainer := get (.Values.podAnnotations | default dict) "kubectl.kubernetes.io/default-container" -}}
{{- if and $defaultContainer (ne (toString $defaultContainer) "manager") -}}
{{- fail (printf "podAnnotations names %q as kubectl.kubernetes.io/default-container, but the operator's container is manager (the chart sets this annotation itself)" (toString $defaultContainer)) -}}
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
custom: the values as given (placement.* or their top-level aliases).
*/}}
{{- define "causeway.placement" -}}
{{- $target := .Values.placement.target -}}
{{- $given := include "causeway.placementValues" . | fromYaml -}}
{{- if eq $target "custom" -}}
{{- with $given.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $given.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $given.affinity }}
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

{{/*
The values of the DPF-HCP provisioner's own chart, accepted as aliases of
ours (README.md, "Values of the DPF-HCP provisioner chart"). Each helper
below returns the value in force, as YAML: the alias when it is given, ours
otherwise. When both are given and disagree the render fails; a value of
ours still at its chart default counts as not given.
*/}}

{{/*
dpf.config with provisionerConfig.* folded in.
*/}}
{{- define "causeway.dpfConfig" -}}
{{- $ours := .Values.dpf.config -}}
{{- $alias := .Values.provisionerConfig | default dict -}}
{{- /* the chart defaults of dpf.config (values.yaml) for these four keys */ -}}
{{- $defaults := dict "blueFieldOCPLayerRepo" "registry.redhat.io/dpu-kit-for-nvidia/bluefield-ocp-layer-rhel10" "disableMetalLB" false "manageDPUServiceTemplates" false "dpuServicesImagePullSecret" "" -}}
{{- $out := dict -}}
{{- range $key, $default := $defaults -}}
{{- $mine := get $ours $key -}}
{{- if hasKey $alias $key -}}
{{- $given := get $alias $key -}}
{{- if and (ne (toString $mine) (toString $default)) (ne (toString $mine) (toString $given)) -}}
{{- fail (printf "provisionerConfig.%s is %q but dpf.config.%s is %q: they are the same setting. Give one of them, or both equal." $key (toString $given) $key (toString $mine)) -}}
{{- end -}}
{{- $_ := set $out $key $given -}}
{{- else -}}
{{- $_ := set $out $key $mine -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/*
dpf.blueFieldImages with the top-level blueFieldImages merged in; the same
OpenShift version mapped to two different images fails.
*/}}
{{- define "causeway.blueFieldImages" -}}
{{- $out := deepCopy (.Values.dpf.blueFieldImages | default dict) -}}
{{- range $version, $image := .Values.blueFieldImages | default dict -}}
{{- if and (hasKey $out $version) (ne (toString (get $out $version)) (toString $image)) -}}
{{- fail (printf "blueFieldImages.%s is %q but dpf.blueFieldImages.%s is %q: give the version once, or the same image in both" $version (toString $image) $version (toString (get $out $version))) -}}
{{- end -}}
{{- $_ := set $out $version $image -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/*
placement.nodeSelector, placement.tolerations and placement.affinity, each
with its top-level alias (nodeSelector, tolerations, affinity) folded in:
{nodeSelector: ..., tolerations: ..., affinity: ...}. Both given and
different fails; so does either given when placement.target is not custom,
since only custom uses them.
*/}}
{{- define "causeway.placementValues" -}}
{{- $out := dict -}}
{{- $target := .Values.placement.target -}}
{{- range $key := list "nodeSelector" "tolerations" "affinity" -}}
{{- $mine := get $.Values.placement $key -}}
{{- $alias := get $.Values $key -}}
{{- if and $mine $alias (ne (toYaml $mine) (toYaml $alias)) -}}
{{- fail (printf "%s and placement.%s are both given and differ: they are the same setting. Give one of them." $key $key) -}}
{{- end -}}
{{- $value := $mine | default $alias -}}
{{- if and $value (ne $target "custom") -}}
{{- $which := ternary (printf "placement.%s" $key) $key (not (empty $mine)) -}}
{{- fail (printf "%s is given but placement.target is %q: it is used only with placement.target=custom, which places the pods by exactly the nodeSelector, tolerations and affinity given. Set placement.target=custom, or drop %s." $which (toString $target) $which) -}}
{{- end -}}
{{- if $value -}}
{{- $_ := set $out $key $value -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}
