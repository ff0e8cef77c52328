#!/usr/bin/env python3
"""Checks of the causeway chart that helm and kubernetes-validate cannot make.

Used by charts/test.sh; needs only PyYAML.

  chart_checks.py values-table VALUES README
      README's `| Key | Type | Default | Description |` table lists exactly the
      leaf keys of VALUES, each with its type and default.
  chart_checks.py values-comments VALUES
      every key of VALUES has a comment line right above it.
  chart_checks.py rendered CASE FILE
      the objects helm rendered for CASE (see CASES) are what the templates
      promise.
  chart_checks.py values-schema VALUES SCHEMA
      every key of VALUES is declared in SCHEMA, and every object of SCHEMA
      with properties of its own refuses other keys.
  chart_checks.py drop-kinds KIND[,KIND...] < IN > OUT
      copies a multi-document YAML stream, without the documents of those
      kinds (for schemas kubernetes-validate does not ship).
  chart_checks.py rule-spec < IN > OUT
      the spec of the one PrometheusRule of a rendering: a Prometheus rules
      file, for promtool.
  chart_checks.py dashboards DIR
      every dashboard of DIR is JSON that OpenShift's console can show:
      panels of the kinds it draws, each with its queries.
  chart_checks.py metric-names CRATES FILE...
      every causeway_ metric the FILEs name is defined in the sources under
      CRATES (a histogram's with _bucket, _sum or _count).
"""

import json
import os
import re
import sys

import yaml

TABLE_HEADER = re.compile(r"^\|\s*Key\s*\|\s*Type\s*\|\s*Default\s*\|\s*Description\s*\|\s*$")


def leaves(node, prefix=""):
    """Dotted key -> value for every leaf: a scalar, a list or an empty map."""
    out = {}
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(leaves(value, path + "."))
        else:
            out[path] = value
    return out


def type_name(value):
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return "null"


def readme_rows(path):
    """(key, type, default text, line number) for each row of the values table."""
    rows = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    starts = [i for i, line in enumerate(lines) if TABLE_HEADER.match(line)]
    if len(starts) != 1:
        raise SystemExit(f"{path}: expected one '| Key | Type | Default | Description |' table, found {len(starts)}")
    i = starts[0] + 2  # past the header and its |---| line
    while i < len(lines) and lines[i].startswith("|"):
        cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
        if len(cells) < 4:
            raise SystemExit(f"{path}:{i + 1}: a row needs 4 cells: {lines[i]}")
        rows.append((cells[0].strip("`"), cells[1], cells[2], i + 1))
        i += 1
    return rows


def values_table(values_path, readme_path):
    with open(values_path, encoding="utf-8") as f:
        values = leaves(yaml.safe_load(f) or {})
    errors = []
    seen = set()
    for key, typ, default, line in readme_rows(readme_path):
        where = f"{readme_path}:{line}"
        if key in seen:
            errors.append(f"{where}: {key} is listed twice")
        seen.add(key)
        if key not in values:
            errors.append(f"{where}: {key} is not a leaf key of {values_path}")
            continue
        want = values[key]
        if typ != type_name(want):
            errors.append(f"{where}: {key} has type {type_name(want)} in values.yaml, not {typ}")
        m = re.fullmatch(r"`(.*)`", default)
        if not m:
            errors.append(f"{where}: the default of {key} must be in backquotes: {default}")
        elif yaml.safe_load(m.group(1)) != want:
            errors.append(f"{where}: {key} defaults to {want!r} in values.yaml, not {m.group(1)}")
    for key in sorted(set(values) - seen):
        errors.append(f"{readme_path}: values table lacks {key} (default {values[key]!r})")
    for e in errors:
        print(e)
    if not errors:
        print(f"values table: {len(values)} keys, types and defaults match")
    return 1 if errors else 0


def values_comments(values_path):
    """Each value (a key holding a scalar, a list or {}) has a comment above it."""
    errors = []
    key_line = re.compile(r"^\s*[A-Za-z0-9_.-]+:(\s*)(.*)$")
    with open(values_path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        m = key_line.match(line)
        if not m:
            continue
        rest = m.group(2).split("#")[0].strip()
        following = next((n.strip() for n in lines[i + 1:] if n.strip() and not n.strip().startswith("#")), "")
        if not rest and not following.startswith("-"):
            continue  # a map of further keys, each commented itself
        above = lines[i - 1].strip() if i > 0 else ""
        if not above.startswith("#"):
            errors.append(f"{values_path}:{i + 1}: no comment above `{line.strip()}`")
    for e in errors:
        print(e)
    return 1 if errors else 0


def values_schema(values_path, schema_path):
    import json
    with open(values_path, encoding="utf-8") as f:
        values = yaml.safe_load(f) or {}
    with open(schema_path, encoding="utf-8") as f:
        schema = json.load(f)
    errors = []

    def declared(node, sch, prefix):
        for key, value in node.items():
            path = f"{prefix}{key}"
            sub = sch.get("properties", {}).get(key)
            if sub is None:
                errors.append(f"{schema_path}: {path} (in {values_path}) is not declared")
                continue
            if isinstance(value, dict) and value and "properties" in sub:
                declared(value, sub, path + ".")

    def closed(sch, path):
        if "properties" in sch:
            if sch.get("additionalProperties") is not False:
                errors.append(f"{schema_path}: {path or 'the top level'} does not set additionalProperties: false")
            for key, sub in sch["properties"].items():
                closed(sub, f"{path}.{key}" if path else key)
        if isinstance(sch.get("items"), dict):
            closed(sch["items"], path + "[]")

    if schema.get("$schema") != "http://json-schema.org/draft-07/schema#":
        errors.append(f"{schema_path}: $schema is not draft-07")
    declared(values, schema, "")
    closed(schema, "")
    for e in errors:
        print(e)
    if not errors:
        print("values.schema.json declares every value and refuses unknown keys")
    return 1 if errors else 0


def load(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def one(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    if len(found) != 1:
        raise AssertionError(f"expected one {kind}{' ' + name if name else ''}, found {len(found)}")
    return found[0]


def kinds(docs):
    """The kinds rendered, less the CRD (present once it is generated)."""
    return sorted(d["kind"] for d in docs if d["kind"] != "CustomResourceDefinition")


def check_crd(docs):
    """The generated Infra and InfraClusterAttachment CRDs, if there, are the ones the chart's RBAC names."""
    crds = {d["metadata"]["name"]: d for d in docs if d["kind"] == "CustomResourceDefinition" and "densityops" in d["metadata"]["name"]}
    if not crds:
        return
    expected = {
        "infras.hostedcluster.densityops.com": ("Infra", "infras", "infra"),
        "infraclusterattachments.hostedcluster.densityops.com": ("InfraClusterAttachment", "infraclusterattachments", "infraclusterattachment"),
    }
    assert sorted(crds) == sorted(expected), sorted(crds)
    for name, want in expected.items():
        spec = crds[name]["spec"]
        assert spec["group"] == "hostedcluster.densityops.com", spec["group"]
        assert spec["scope"] == "Namespaced", spec["scope"]
        names = spec["names"]
        assert (names["kind"], names["plural"], names.get("singular")) == want, names
        served = [v for v in spec["versions"] if v["name"] == "v1alpha1"]
        assert served and served[0]["served"] and served[0]["storage"], spec["versions"]
        assert "status" in served[0].get("subresources", {}), f"the operator patches {want[1]}/status: enable the subresource"
        assert "openAPIV3Schema" in served[0].get("schema", {}), "v1alpha1 needs schema.openAPIV3Schema"


def container(docs):
    return one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def env(docs):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(docs)["env"]}


def pod(docs):
    return one(docs, "Deployment")["spec"]["template"]["spec"]


def node_terms(docs):
    aff = pod(docs)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [[(e["key"], e["operator"]) for e in t["matchExpressions"]] for t in aff["nodeSelectorTerms"]]


CP = "node-role.kubernetes.io/control-plane"
MASTER = "node-role.kubernetes.io/master"
# The webhook (on by default) adds its Service, configuration and
# NetworkPolicy.
WEBHOOK_KINDS = ["NetworkPolicy", "Service", "ValidatingWebhookConfiguration"]
INFRA_KINDS = ["ClusterRole", "ClusterRoleBinding", "Deployment", "Role", "RoleBinding", "ServiceAccount"] + WEBHOOK_KINDS
# The DPF bridge (on by default): its ClusterRole and binding, and the
# settings singleton made by a hook.
DPF_KINDS = ["ClusterRole", "ClusterRoleBinding", "DPFHCPProvisionerConfig"]
BASE_KINDS = sorted(INFRA_KINDS + DPF_KINDS)


def crd_named(docs, name):
    found = [d for d in docs if d["kind"] == "CustomResourceDefinition" and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected CRD {name}, found {len(found)}"
    return found[0]


def check_dpf(docs, release="causeway"):
    """The bridge's CRDs, RBAC and settings object, consistent with each other."""
    crd_named(docs, "dpfhcpprovisioners.provisioning.dpu.hcp.io")
    config_crd = crd_named(docs, "dpfhcpprovisionerconfigs.provisioning.dpu.hcp.io")
    schema = config_crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    config = one(docs, "DPFHCPProvisionerConfig")
    assert config["metadata"]["name"] == "default"
    annotations = config["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "post-install,post-upgrade", annotations
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation", annotations
    for key in config["spec"]:
        assert key in schema, f"DPFHCPProvisionerConfig spec.{key} is not in its CRD"
    assert config["spec"]["operatorNamespace"] == "causeway-system"
    cr = one(docs, "ClusterRole", f"{release}-dpf")
    granted = {(g, r): set(rule["verbs"]) for rule in cr["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert granted[("", "secrets")] == {"get", "list", "watch", "create", "patch", "delete"}, granted[("", "secrets")]
    for needed in [("hypershift.openshift.io", "hostedclusters"), ("hypershift.openshift.io", "nodepools"),
                   ("metallb.io", "ipaddresspools"), ("metallb.io", "l2advertisements"),
                   ("provisioning.dpu.hcp.io", "dpfhcpprovisioners/status"), ("provisioning.dpu.nvidia.com", "dpus"),
                   ("provisioning.dpu.nvidia.com", "dpuflavors"), ("svc.dpu.nvidia.com", "dpudeployments"),
                   ("operator.dpu.nvidia.com", "dpfoperatorconfigs")]:
        assert needed in granted, f"DPF ClusterRole lacks {needed}"
    assert "update" in granted[("provisioning.dpu.nvidia.com", "dpuclusters")]
    for rule in cr["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
    crb = one(docs, "ClusterRoleBinding", f"{release}-dpf")
    assert crb["roleRef"]["name"] == f"{release}-dpf"
    assert env(docs)["CAUSEWAY_DPF"] == "true"


def case_dpf_off(docs):
    assert kinds(docs) == sorted(INFRA_KINDS), kinds(docs)
    hooks = one(docs, "ValidatingWebhookConfiguration")["webhooks"]
    assert [h["name"] for h in hooks] == ["infras.causeway.io"], hooks
    crds = [d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"]
    assert not any("dpu.hcp.io" in c for c in crds), crds
    assert env(docs)["CAUSEWAY_DPF"] == "false"


def case_dpf_no_config(docs):
    assert kinds(docs) == sorted(INFRA_KINDS + ["ClusterRole", "ClusterRoleBinding"]), kinds(docs)


def case_dpf_settings(docs):
    config = one(docs, "DPFHCPProvisionerConfig")["spec"]
    assert config["disableMetalLB"] is True and config["metalLBNamespace"] == "metallb-system", config
    assert config["hostedClusterDeletionTimeoutSeconds"] == 600, config
    c = container(docs)
    assert c["args"] == ["operator", "--admin-listen", "0.0.0.0:8081", "--pod-monitors=true"], c["args"]
    assert c["ports"][0]["containerPort"] == 8081
    assert (c["livenessProbe"]["initialDelaySeconds"], c["livenessProbe"]["periodSeconds"]) == (15, 20)
    assert (c["readinessProbe"]["initialDelaySeconds"], c["readinessProbe"]["periodSeconds"]) == (5, 10)
    for d in docs:
        meta = d["metadata"]
        if d["kind"] == "CustomResourceDefinition":
            continue
        assert meta.get("labels", {}).get("team") == "edge", f"{d['kind']} {meta['name']} lacks commonLabels"
        assert meta.get("annotations", {}).get("owner") == "dpu-team", f"{d['kind']} {meta['name']} lacks commonAnnotations"
    # With common annotations the Deployment's own label stays a label.
    deployment = one(docs, "Deployment")["metadata"]
    assert deployment["labels"].get("app.kubernetes.io/component") == "operator", deployment
    assert "app.kubernetes.io/component" not in deployment["annotations"], deployment
    assert one(docs, "ServiceAccount")["metadata"]["annotations"]["extra"] == "kept"
    assert one(docs, "DPFHCPProvisionerConfig")["metadata"]["annotations"]["helm.sh/hook"]
    e = env(docs)
    assert (e["CAUSEWAY_CSR_APPROVER"], e["CAUSEWAY_HOSTED_APISERVER"], e["CAUSEWAY_CSR_PENDING_SLACK"]) == ("false", "kubeconfig", "5"), e
    images = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "ocp-bluefield-images"]
    assert len(images) == 1 and images[0]["data"] == {"4.19.0": "quay.io/example/rhcos-bfb:4.19.0"}, images


def check_webhook(docs, source):
    """The webhook as the API server will call it, and its certificate."""
    vwc = one(docs, "ValidatingWebhookConfiguration")
    hooks = vwc["webhooks"]
    assert [h["name"] for h in hooks] == ["infras.causeway.io", "dpfhcpprovisioners.causeway.io"], hooks
    for h in hooks:
        assert h["failurePolicy"] == "Fail" and h["sideEffects"] == "None", h
        assert h["admissionReviewVersions"] == ["v1"] and h["timeoutSeconds"] == 10, h
        assert h["clientConfig"]["service"] == {"name": "causeway-webhook", "namespace": "causeway-system", "path": "/validate", "port": 443}, h
        assert h["rules"][0]["operations"] == ["CREATE", "UPDATE"], h
    assert hooks[1]["rules"][0]["apiGroups"] == ["provisioning.dpu.hcp.io"]
    assert hooks[1]["rules"][0]["resources"] == ["dpfhcpprovisioners"]
    svc = one(docs, "Service", "causeway-webhook")
    assert svc["spec"]["ports"][0]["targetPort"] == "webhook" and svc["spec"]["ports"][0]["port"] == 443
    dep = one(docs, "Deployment")
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    e = env(docs)
    assert e["CAUSEWAY_WEBHOOK_LISTEN"] == "0.0.0.0:9443" and e["CAUSEWAY_WEBHOOK_CERT_DIR"] == "/etc/causeway/webhook", e
    volume = pod(docs)["volumes"][0]
    check_network_policy(docs)
    annotations = vwc["metadata"].get("annotations", {})
    svc_annotations = svc["metadata"].get("annotations", {})
    if source == "service-ca":
        assert annotations == {"service.beta.openshift.io/inject-cabundle": "true"}, annotations
        assert svc_annotations == {"service.beta.openshift.io/serving-cert-secret-name": "causeway-webhook-tls"}, svc_annotations
        assert volume["secret"]["secretName"] == "causeway-webhook-tls", volume
    elif source == "cert-manager":
        assert annotations == {"cert-manager.io/inject-ca-from": "causeway-system/causeway-webhook"}, annotations
        assert not svc_annotations, svc_annotations
        assert volume["secret"]["secretName"] == "causeway-webhook-tls", volume
        cert = one(docs, "Certificate")["spec"]
        assert cert["secretName"] == "causeway-webhook-tls", cert
        assert cert["dnsNames"] == ["causeway-webhook.causeway-system.svc", "causeway-webhook.causeway-system.svc.cluster.local"], cert
    else:
        assert not annotations and not svc_annotations
        assert "emptyDir" in volume, volume
        assert e["CAUSEWAY_WEBHOOK_SELF_SIGNED_SECRET"] == "causeway-webhook-ca", e
        assert (e["CAUSEWAY_WEBHOOK_SERVICE"], e["CAUSEWAY_WEBHOOK_CONFIGURATION"]) == ("causeway-webhook", "causeway"), e


OPENSHIFT_API_SERVER = [{"namespaceSelector": {"matchLabels": {"policy-group.network.openshift.io/host-network": ""}}}]


def check_network_policy(docs, api_server_from=OPENSHIFT_API_SERVER, admin_from=None):
    """Ingress to the operator pods: the webhook port and the admin port,
    each from its peers (any source when None); the webhook's by default
    from OpenShift's host-network API server only."""
    policy = one(docs, "NetworkPolicy")["spec"]
    dep = one(docs, "Deployment")
    assert policy["podSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"], policy
    assert policy["policyTypes"] == ["Ingress"], policy
    webhook, admin = policy["ingress"]
    assert webhook["ports"] == [{"port": "webhook", "protocol": "TCP"}], webhook
    assert admin["ports"] == [{"port": "admin", "protocol": "TCP"}], admin
    assert webhook.get("from") == api_server_from, webhook
    assert admin.get("from") == admin_from, admin


def case_webhook_cert_manager(docs):
    check_webhook(docs, "cert-manager")
    assert one(docs, "Issuer")["spec"] == {"selfSigned": {}}
    assert one(docs, "Certificate")["spec"]["issuerRef"] == {"kind": "Issuer", "name": "causeway-webhook"}


def case_webhook_cert_manager_issuer(docs):
    check_webhook(docs, "cert-manager")
    assert not [d for d in docs if d["kind"] == "Issuer"]
    assert one(docs, "Certificate")["spec"]["issuerRef"] == {"kind": "ClusterIssuer", "name": "corp-ca"}


def case_webhook_self_signed(docs):
    check_webhook(docs, "self-signed")
    role = one(docs, "Role", "causeway-webhook-cert")["rules"]
    assert role[1]["resourceNames"] == ["causeway-webhook-ca"] and role[1]["verbs"] == ["get", "update"], role
    vwc_rule = one(docs, "ClusterRole", "causeway-webhook-cert")["rules"][0]
    assert vwc_rule["resourceNames"] == ["causeway"] and vwc_rule["verbs"] == ["get", "patch"], vwc_rule


def case_webhook_off(docs):
    assert not [d for d in docs if d["kind"] in ("ValidatingWebhookConfiguration", "NetworkPolicy")]
    assert "CAUSEWAY_WEBHOOK_LISTEN" not in env(docs)
    assert "volumes" not in pod(docs)


def case_default(docs):
    check_crd(docs)
    check_dpf(docs)
    e = env(docs)
    assert (e["CAUSEWAY_CSR_APPROVER"], e["CAUSEWAY_HOSTED_APISERVER"]) == ("true", "service"), e
    assert (e["CAUSEWAY_CSR_MAX_EXPIRATION_SECONDS"], e["CAUSEWAY_CSR_PENDING_SLACK"]) == ("31708800", "20"), e
    assert e["CAUSEWAY_CSR_CREATION_SKEW_SECONDS"] == "10", e
    assert e["CAUSEWAY_CSR_BOOTSTRAP_HOLD_SECONDS"] == "15", e
    assert e["CAUSEWAY_CSR_KUBELET_SERVING_CA"] == "openshift-config-managed/kubelet-serving-ca", e
    assert kinds(docs) == BASE_KINDS, kinds(docs)
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"]["type"] == "RollingUpdate"
    c = container(docs)
    assert c["name"] == "manager", c["name"]
    template = dep["spec"]["template"]["metadata"]
    assert template["labels"]["control-plane"] == "controller-manager", template["labels"]
    assert template["annotations"] == {"kubectl.kubernetes.io/default-container": "manager"}, template
    assert "control-plane" not in dep["spec"]["selector"]["matchLabels"], "a Deployment's selector is immutable"
    assert c["image"] == "causeway:0.1.0", c["image"]
    assert c["command"] == ["/causeway"] and c["args"] == ["operator", "--admin-listen", "0.0.0.0:8080", "--pod-monitors=true"], c
    e = env(docs)
    assert e["CAUSEWAY_IMAGE"] == "causeway:0.1.0", e
    assert e["CAUSEWAY_LEADER_ELECTION"] == "true", e
    assert e["CAUSEWAY_LOG_LEVEL"] == "info", e
    assert e["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}, e
    assert e["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}, e
    assert e["CAUSEWAY_WATCH_NAMESPACES"] == "", e
    assert e["CAUSEWAY_INFRA_FOR_HOSTED_CLUSTERS"] == "false", e
    rules = one(docs, "ClusterRole", "causeway")["rules"]
    assert not any("hostedclusters/finalizers" in r["resources"] for r in rules), "HostedCluster Infras are off by default"
    assert c["ports"] == [{"name": "admin", "containerPort": 8080, "protocol": "TCP"},
                          {"name": "webhook", "containerPort": 9443, "protocol": "TCP"}], c["ports"]
    check_webhook(docs, "service-ca")
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    p = pod(docs)
    assert p["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    assert p["serviceAccountName"] == "causeway"
    # master: control-plane OR master label, and both taints tolerated
    assert node_terms(docs) == [[(CP, "Exists")], [(MASTER, "Exists")]], node_terms(docs)
    assert {(t["key"], t["effect"]) for t in p["tolerations"]} == {(CP, "NoSchedule"), (MASTER, "NoSchedule")}
    assert "nodeSelector" not in p and "podAntiAffinity" not in p["affinity"]
    role = one(docs, "Role")
    assert role["metadata"]["namespace"] == "causeway-system"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["causeway-operator"],
         "verbs": ["get", "update"]},
    ], role["rules"]
    cr = one(docs, "ClusterRole", "causeway")
    granted = {(g, r) for rule in cr["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    for forbidden in [("", "*"), ("*", "*"), ("rbac.authorization.k8s.io", "clusterroles"),
                      ("rbac.authorization.k8s.io", "clusterrolebindings")]:
        assert forbidden not in granted, f"ClusterRole grants {forbidden}"
    for rule in cr["rules"]:
        assert "*" not in rule["verbs"], rule
        # Granting a Role is limited to what the operator holds; never
        # around that limit.
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule
    verbs = {(g, r): set(rule["verbs"]) for rule in cr["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    # Two replicas per component: their Lease, their Role and binding, a
    # disruption budget, and their key, which the operator makes and
    # deletes but never reads.
    assert verbs[("", "secrets")] == {"create", "delete"}, verbs[("", "secrets")]
    assert verbs[("coordination.k8s.io", "leases")] == {"get", "list", "watch", "create", "update", "patch", "delete"}
    for kind in [("rbac.authorization.k8s.io", "roles"), ("rbac.authorization.k8s.io", "rolebindings"),
                 ("policy", "poddisruptionbudgets")]:
        assert verbs[kind] == {"get", "list", "watch", "create", "patch", "delete"}, (kind, verbs[kind])
    # A PodMonitor is read, then applied; garbage collection removes it.
    assert verbs[("monitoring.coreos.com", "podmonitors")] == {"get", "create", "patch"}
    assert ("hostedcluster.densityops.com", "infras/status") in granted
    assert ("hostedcluster.densityops.com", "infraclusterattachments/status") in granted
    crb = one(docs, "ClusterRoleBinding", "causeway")
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": "causeway", "namespace": "causeway-system"}]


def case_production(docs):
    assert kinds(docs) == sorted(BASE_KINDS + ["Service"]), kinds(docs)
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    assert node_terms(docs) == [[(CP, "Exists")], [(MASTER, "Exists")]]
    anti = pod(docs)["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    svc = one(docs, "Service", "causeway-metrics")
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"][0]["targetPort"] == "admin"
    assert container(docs)["resources"]["limits"]["memory"] == "512Mi"


def case_openshift(docs):
    check_network_policy(docs)
    assert kinds(docs) == sorted(BASE_KINDS + ["SecurityContextConstraints"]), kinds(docs)
    scc = one(docs, "SecurityContextConstraints")
    assert scc["apiVersion"] == "security.openshift.io/v1"
    assert scc["metadata"]["name"] == "causeway-dataplane"
    assert sorted(scc["allowedCapabilities"]) == ["NET_ADMIN", "NET_BIND_SERVICE", "NET_RAW"], scc["allowedCapabilities"]
    assert scc["requiredDropCapabilities"] == ["ALL"]
    assert scc["defaultAddCapabilities"] is None
    assert scc["runAsUser"] == {"type": "RunAsAny"}
    assert scc["allowPrivilegedContainer"] is False and scc["allowPrivilegeEscalation"] is False
    for host in ["allowHostDirVolumePlugin", "allowHostIPC", "allowHostNetwork", "allowHostPID", "allowHostPorts"]:
        assert scc[host] is False, host
    assert "hostPath" not in scc["volumes"] and "*" not in scc["volumes"]
    assert scc["users"] == []
    assert scc["groups"] == ["system:serviceaccounts:clusters", "system:serviceaccounts:causeway-infra"], scc
    assert "metadata" in scc and "namespace" not in scc["metadata"]


def case_webhook_policy(docs):
    check_network_policy(
        docs,
        api_server_from=[{"ipBlock": {"cidr": "10.0.0.0/24"}}],
        admin_from=[{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
    )
    e = env(docs)
    assert e["CAUSEWAY_BLUEFIELD_ALLOWED_REGISTRIES"] == "quay.io,registry.example.com:5000", e


def case_webhook_policy_any_source(docs):
    check_network_policy(docs, api_server_from=None)


def case_webhook_no_policy(docs):
    assert not [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert one(docs, "ValidatingWebhookConfiguration")


def case_openshift_all(docs):
    assert one(docs, "SecurityContextConstraints", "cw-scc")["groups"] == ["system:serviceaccounts"]


def case_worker(docs):
    p = pod(docs)
    assert node_terms(docs) == [[(CP, "DoesNotExist"), (MASTER, "DoesNotExist")]], node_terms(docs)
    assert "tolerations" not in p and "nodeSelector" not in p


def case_custom(docs):
    p = pod(docs)
    assert p["nodeSelector"] == {"node-role.kubernetes.io/infra": ""}, p.get("nodeSelector")
    assert p["tolerations"] == [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}], p.get("tolerations")
    assert "affinity" not in p


def case_no_leader(docs):
    assert kinds(docs) == sorted(["ClusterRole", "ClusterRoleBinding", "Deployment", "ServiceAccount"] + DPF_KINDS + WEBHOOK_KINDS), kinds(docs)
    assert one(docs, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    assert env(docs)["CAUSEWAY_LEADER_ELECTION"] == "false"


def case_images(docs):
    c = container(docs)
    assert c["image"] == "registry.example.com/causeway:1.2.3", c["image"]
    assert env(docs)["CAUSEWAY_IMAGE"] == "registry.example.com/dp@sha256:" + "0" * 64, env(docs)
    assert env(docs)["CAUSEWAY_LOG_LEVEL"] == "debug"
    labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] == "net" and labels["app.kubernetes.io/name"] == "causeway", labels


def case_existing_sa(docs):
    assert "ServiceAccount" not in kinds(docs)
    assert pod(docs)["serviceAccountName"] == "existing"
    assert one(docs, "ClusterRoleBinding", "causeway")["subjects"][0]["name"] == "existing"
    assert one(docs, "ClusterRoleBinding", "causeway-dpf")["subjects"][0]["name"] == "existing"
    assert one(docs, "RoleBinding")["subjects"][0]["name"] == "existing"


def case_namespaced(docs):
    """watch.namespaces: RoleBindings there to the ClusterRole; cluster-wide
    only the DPF bridge's binding, whose reach is cluster-wide by nature."""
    cluster_bindings = [d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRoleBinding"]
    assert cluster_bindings == ["causeway-dpf"], cluster_bindings
    assert env(docs)["CAUSEWAY_WATCH_NAMESPACES"] == "clusters,vms", env(docs)
    assert env(docs)["CAUSEWAY_INFRA_FOR_HOSTED_CLUSTERS"] == "true", env(docs)
    full = one(docs, "Deployment")["metadata"]["name"]
    bindings = {(d["metadata"]["namespace"], d["roleRef"]["name"]) for d in docs
                if d["kind"] == "RoleBinding" and d["roleRef"]["kind"] == "ClusterRole"}
    assert bindings == {("clusters", full), ("vms", full), ("default", full + "-referenced"),
                        ("clusters-hc1", full + "-referenced")}, bindings
    referenced = one(docs, "ClusterRole", full + "-referenced")["rules"]
    writes = [r for r in referenced if set(r["verbs"]) - {"get", "list", "watch"}]
    assert [r["resources"] for r in writes] == [["networkpolicies"]], writes
    rules = one(docs, "ClusterRole", full)["rules"]
    assert any("hostedclusters/finalizers" in r["resources"] for r in rules), rules


def case_provisioner_values(docs):
    """The DPF-HCP provisioner chart's values, as aliases of ours."""
    config = one(docs, "DPFHCPProvisionerConfig")["spec"]
    assert config["blueFieldOCPLayerRepo"] == "registry.example.com/bluefield-ocp-layer", config
    assert config["disableMetalLB"] is True and config["manageDPUServiceTemplates"] is True, config
    assert config["dpuServicesImagePullSecret"] == "dpu-pull", config
    assert config["operatorNamespace"] == "causeway-system", config
    images = one(docs, "ConfigMap", "ocp-bluefield-images")["data"]
    assert images == {"4.19.0": "quay.io/example/rhcos-bfb:4.19.0", "4.18.0": "quay.io/example/rhcos-bfb:4.18.0"}, images
    digest = "sha256:" + "a" * 64
    c = container(docs)
    assert c["image"] == "registry.example.com/provisioner@" + digest, c["image"]
    assert env(docs)["CAUSEWAY_IMAGE"] == "registry.example.com/provisioner@" + digest, env(docs)
    p = pod(docs)
    assert p["nodeSelector"] == {"node-role.kubernetes.io/infra": ""}, p.get("nodeSelector")
    assert p["tolerations"] == [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}], p.get("tolerations")
    assert "affinity" not in p
    template = one(docs, "Deployment")["spec"]["template"]["metadata"]
    assert template["annotations"] == {"kubectl.kubernetes.io/default-container": "manager", "team": "dpu"}, template


def case_provisioner_defaults(docs):
    """provisionerConfig given alone: the settings object carries the
    defaults of ours for the rest, and manageDPUServiceTemplates."""
    config = one(docs, "DPFHCPProvisionerConfig")["spec"]
    assert config["manageDPUServiceTemplates"] is True, config
    assert config["blueFieldOCPLayerRepo"] == "registry.redhat.io/dpu-kit-for-nvidia/bluefield-ocp-layer-rhel10" and config["disableMetalLB"] is False, config
    assert "dpuServicesImagePullSecret" not in config, config
    assert config["operatorNamespace"] == "causeway-system", config


def case_provisioner_file(docs):
    """ci/values-provisioner.yaml, a values file of the DPF-HCP provisioner's
    chart, taken as it is."""
    c = container(docs)
    assert c["image"] == "quay.io/example/dpf-hcp-provisioner:v0.2.0", c["image"]
    assert c["imagePullPolicy"] == "Always", c["imagePullPolicy"]
    assert c["resources"]["limits"] == {"cpu": "1000m", "memory": "1Gi"}, c["resources"]
    assert env(docs)["CAUSEWAY_LOG_LEVEL"] == "debug", env(docs)
    images = one(docs, "ConfigMap", "ocp-bluefield-images")["data"]
    assert sorted(images) == ["4.17.0", "4.18.0", "4.19.0-ec.5"], images
    assert node_terms(docs) == [[(CP, "Exists")], [(MASTER, "Exists")]], node_terms(docs)


def case_go_values(docs):
    """tests/dpf/fixtures/go-chart-values.yaml, the Go chart's own values
    file with every default, taken as it is with causeway's image given."""
    c = container(docs)
    assert c["image"] == "registry.example.com/causeway:0.1.0", c["image"]
    assert c["imagePullPolicy"] == "IfNotPresent", c["imagePullPolicy"]
    assert c["resources"] == {"limits": {"cpu": "500m", "memory": "512Mi"}, "requests": {"cpu": "100m", "memory": "128Mi"}}, c["resources"]
    assert one(docs, "Deployment")["spec"]["replicas"] == 1
    assert env(docs)["CAUSEWAY_LOG_LEVEL"] == "info", env(docs)
    assert node_terms(docs) == [[(CP, "Exists")], [(MASTER, "Exists")]], node_terms(docs)
    config = one(docs, "DPFHCPProvisionerConfig")["spec"]
    # provisionerConfig is empty there: the product chart's defaults.
    assert config["blueFieldOCPLayerRepo"] == "registry.redhat.io/dpu-kit-for-nvidia/bluefield-ocp-layer-rhel10", config
    assert config["disableMetalLB"] is False and config["manageDPUServiceTemplates"] is False, config
    assert config["operatorNamespace"] == "dpf-hcp-provisioner-system", config


# --- monitoring ----------------------------------------------------------------

MONITORING_KINDS = ["PrometheusRule", "ServiceMonitor"]
# Each alert, and what its description must name: the Infra of a data-plane
# series, the object of an operator status series, the provisioner of a CSR
# series, or (the operator's own) nothing in particular.
DATAPLANE = "{{ $labels.namespace }}/{{ $labels.infra }}"
OBJECT = "{{ $labels.kind }} {{ $labels.object_namespace }}/{{ $labels.name }}"
PROVISIONER = "{{ $labels.provisioner }}"
ALERTS = {
    "CausewayLeaseStoreNotDurable": [DATAPLANE],
    "CausewayDHCPPoolNearlyFull": [DATAPLANE],
    "CausewayDHCPRequestsDropped": [DATAPLANE],
    "CausewayDNSUpstreamsFailing": [DATAPLANE],
    "CausewayProxyRouteNoUpstream": [DATAPLANE],
    "CausewayProxyConnectionCap": [DATAPLANE],
    "CausewayDNSConnectionCap": [DATAPLANE],
    "CausewayDescriptorBudgetExhausted": [DATAPLANE],
    "CausewayHADegraded": [DATAPLANE],
    "CausewayCSRAutoApprovalInactive": [OBJECT, PROVISIONER],
    "CausewayCSRApprovalHalted": [PROVISIONER],
    "CausewayNotReady": [OBJECT],
    "CausewayDeletionStuck": [OBJECT],
    "CausewayWebhookCertificateExpiring": [],
    "CausewayOperatorNoLeader": [],
    "CausewayReconcileErrors": [],
}
RUNBOOK = "docs/operations.md"
# The panel kinds OpenShift's console draws; it skips any other.
CONSOLE_PANELS = {"graph", "singlestat", "gauge", "table", "grafana-piechart-panel"}


def github_anchors(path):
    """The anchors GitHub makes of a Markdown file's headings."""
    anchors = set()
    with open(path, encoding="utf-8") as f:
        fenced = False
        for line in f:
            if line.startswith("```"):
                fenced = not fenced
            m = re.match(r"^#{1,6}\s+(.*?)\s*$", line)
            if m and not fenced:
                text = re.sub(r"[^\w\- ]", "", m.group(1).replace("`", "").lower())
                anchors.add(text.replace(" ", "-"))
    return anchors


def check_rules(rule, base=RUNBOOK):
    """The PrometheusRule: every alert of ALERTS, each with a severity,
    a summary, a description naming what it is about, and a runbook_url
    whose section docs/operations.md has."""
    groups = rule["spec"]["groups"]
    assert groups and all(g["name"].startswith("causeway-") for g in groups), [g["name"] for g in groups]
    anchors = github_anchors(RUNBOOK)
    seen = set()
    for g in groups:
        for r in g["rules"]:
            name = r.get("alert")
            assert name in ALERTS, f"{name}: not an alert the runbook knows (ALERTS)"
            seen.add(name)
            assert set(r) <= {"alert", "expr", "for", "labels", "annotations"}, (name, sorted(r))
            assert set(r["labels"]) == {"severity"} and r["labels"]["severity"] in ("critical", "warning"), (name, r["labels"])
            a = r["annotations"]
            assert set(a) == {"summary", "description", "runbook_url"}, (name, sorted(a))
            for needed in ALERTS[name]:
                assert needed in a["description"], f"{name}: the description does not name {needed}: {a['description']}"
            assert a["runbook_url"] == f"{base}#{name.lower()}", (name, a["runbook_url"])
            assert name.lower() in anchors, f"{name}: {RUNBOOK} has no section #{name.lower()}"
            assert "{{`" not in a["description"], f"{name}: a Helm raw string left in the description"
    assert seen == set(ALERTS), f"alerts missing: {sorted(set(ALERTS) - seen)}"


def check_dashboard_maps(docs, namespace="openshift-config-managed", directory="charts/causeway/files/dashboards"):
    """One ConfigMap per dashboard file, holding it unchanged, where and as
    the console looks for them."""
    files = sorted(f for f in os.listdir(directory) if f.endswith(".json"))
    maps = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"].get("labels", {}).get("console.openshift.io/dashboard") == "true"]
    assert sorted(k for m in maps for k in m["data"]) == files, [m["data"].keys() for m in maps]
    for m in maps:
        assert m["metadata"]["namespace"] == namespace, m["metadata"]
        assert len(m["data"]) == 1, m["metadata"]["name"]
        (key, body), = m["data"].items()
        assert m["metadata"]["name"] == "causeway-dashboard-" + key.removesuffix(".json").removeprefix("causeway-"), m["metadata"]["name"]
        with open(os.path.join(directory, key), encoding="utf-8") as f:
            assert json.loads(body) == json.load(f), f"{key}: the ConfigMap does not hold the file"


def case_monitoring(docs):
    """ci/monitoring/values.yaml, where the API server serves the Prometheus
    Operator's kinds: the ServiceMonitor and its Service, the rule, the
    dashboards, the PodMonitor flag and RBAC."""
    assert kinds(docs) == sorted(BASE_KINDS + MONITORING_KINDS + ["Service"] + ["ConfigMap"] * 4), kinds(docs)
    svc = one(docs, "Service", "causeway-metrics")
    webhook = one(docs, "Service", "causeway-webhook")
    sm = one(docs, "ServiceMonitor")
    assert sm["metadata"]["namespace"] == "causeway-system"
    assert sm["metadata"]["labels"]["monitoring"] == "causeway", sm["metadata"]["labels"]
    selector = sm["spec"]["selector"]["matchLabels"]
    assert selector.items() <= svc["metadata"]["labels"].items(), (selector, svc["metadata"]["labels"])
    assert not selector.items() <= webhook["metadata"]["labels"].items(), "the ServiceMonitor selects the webhook's Service too"
    assert "namespaceSelector" not in sm["spec"], "the Service is in the ServiceMonitor's own namespace"
    assert sm["spec"]["endpoints"] == [{"port": svc["spec"]["ports"][0]["name"], "path": "/metrics", "scheme": "http", "interval": "30s"}], sm["spec"]
    assert svc["spec"]["ports"][0]["targetPort"] == "admin"
    rule = one(docs, "PrometheusRule")
    assert rule["metadata"]["namespace"] == "causeway-system"
    assert rule["metadata"]["labels"]["role"] == "alert-rules", rule["metadata"]["labels"]
    check_rules(rule)
    check_dashboard_maps(docs)
    assert "--pod-monitors=true" in container(docs)["args"]


def case_monitoring_thresholds(docs):
    """The thresholds and runbook base of values.yaml reach the rules."""
    rule = one(docs, "PrometheusRule")
    check_rules(rule, base="https://docs.example.com/causeway/operations.html")
    rules = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert "> 80\n" in rules["CausewayDHCPPoolNearlyFull"]["expr"], rules["CausewayDHCPPoolNearlyFull"]["expr"]
    assert "> 1800\n" in rules["CausewayDeletionStuck"]["expr"], rules["CausewayDeletionStuck"]["expr"]
    assert "< 30 * 86400\n" in rules["CausewayWebhookCertificateExpiring"]["expr"], rules["CausewayWebhookCertificateExpiring"]["expr"]
    assert rules["CausewayNotReady"]["for"] == "1h" and rules["CausewayCSRAutoApprovalInactive"]["for"] == "1h", rules["CausewayNotReady"]
    assert "80%" in rules["CausewayDHCPPoolNearlyFull"]["annotations"]["description"]
    check_dashboard_maps(docs, namespace="dashboards")


def case_monitoring_no_crds(docs):
    """The same values where the API server serves no Prometheus Operator
    kinds: no ServiceMonitor or PrometheusRule, the rest as asked."""
    assert kinds(docs) == sorted(BASE_KINDS + ["Service"] + ["ConfigMap"] * 4), kinds(docs)
    one(docs, "Service", "causeway-metrics")
    check_dashboard_maps(docs)


def case_pod_monitors_off(docs):
    assert container(docs)["args"][-1] == "--pod-monitors=false", container(docs)["args"]
    rules = one(docs, "ClusterRole", "causeway")["rules"]
    assert not any("monitoring.coreos.com" in r["apiGroups"] for r in rules), rules
    assert kinds(docs) == BASE_KINDS, kinds(docs)


def case_metrics_secured(docs):
    """metrics.tls and metrics.authorization: the service CA's certificate
    on the admin port, the probes over HTTPS, the ServiceMonitor checking
    it and sending the reader's token, and the RBAC of both sides."""
    c = container(docs)
    assert "--admin-tls-dir=/etc/causeway/metrics-tls" in c["args"], c["args"]
    assert "--admin-metrics-auth=true" in c["args"], c["args"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["scheme"] == "HTTPS", c[probe]
    mount = [m for m in c["volumeMounts"] if m["name"] == "metrics-cert"]
    assert mount == [{"name": "metrics-cert", "mountPath": "/etc/causeway/metrics-tls", "readOnly": True}], mount
    volumes = {v["name"]: v for v in pod(docs)["volumes"]}
    assert volumes["metrics-cert"]["secret"]["secretName"] == "causeway-metrics-tls", volumes
    assert "webhook-cert" in volumes, "the webhook keeps its certificate"
    svc = one(docs, "Service", "causeway-metrics")
    assert svc["metadata"]["annotations"]["service.beta.openshift.io/serving-cert-secret-name"] == "causeway-metrics-tls"
    endpoint = one(docs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https", endpoint
    assert endpoint["tlsConfig"] == {"ca": {"configMap": {"name": "openshift-service-ca.crt", "key": "service-ca.crt"}},
                                     "serverName": "causeway-metrics.causeway-system.svc"}, endpoint
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": {"name": "causeway-metrics-reader-token", "key": "token"}}
    auth = one(docs, "ClusterRole", "causeway-metrics-auth")["rules"]
    assert auth == [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
                    {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}], auth
    assert one(docs, "ClusterRoleBinding", "causeway-metrics-auth")["subjects"] == [
        {"kind": "ServiceAccount", "name": "causeway", "namespace": "causeway-system"}]
    reader = one(docs, "ClusterRole", "causeway-metrics-reader")["rules"]
    assert reader == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}], reader
    assert one(docs, "ClusterRoleBinding", "causeway-metrics-reader")["subjects"] == [
        {"kind": "ServiceAccount", "name": "causeway-metrics-reader", "namespace": "causeway-system"}]
    token = one(docs, "Secret", "causeway-metrics-reader-token")
    assert token["type"] == "kubernetes.io/service-account-token"
    assert token["metadata"]["annotations"]["kubernetes.io/service-account.name"] == "causeway-metrics-reader"


def rule_spec():
    rules = [d for d in yaml.safe_load_all(sys.stdin) if d and d.get("kind") == "PrometheusRule"]
    if len(rules) != 1:
        print(f"expected one PrometheusRule, found {len(rules)}", file=sys.stderr)
        return 1
    yaml.safe_dump(rules[0]["spec"], sys.stdout, sort_keys=False)
    return 0


def dashboards(directory):
    """Each dashboard: JSON with a title and a unique uid; every panel (rows'
    too) of a kind the console draws, with at least one query; every $name
    its queries use is one of its variables."""
    errors = []
    uids = set()
    files = sorted(f for f in os.listdir(directory) if f.endswith(".json"))
    if not files:
        errors.append(f"{directory}: no dashboard")
    for name in files:
        path = os.path.join(directory, name)
        try:
            with open(path, encoding="utf-8") as f:
                board = json.load(f)
        except ValueError as e:
            errors.append(f"{path}: not JSON: {e}")
            continue
        if not board.get("title") or not board.get("uid"):
            errors.append(f"{path}: no title or uid")
        if board.get("uid") in uids:
            errors.append(f"{path}: uid {board.get('uid')} is another dashboard's")
        uids.add(board.get("uid"))
        variables = {v["name"]: v for v in board.get("templating", {}).get("list", [])}
        known = set(variables) | {"__interval", "__rate_interval", "__range"}
        for v in variables.values():
            if v["type"] == "query":
                # The console turns label_values(SELECTOR, LABEL) into a query
                # by this pattern, and shows only variables with hide 0.
                if not re.fullmatch(r"label_values\((.*), (.*)\)", v["query"]):
                    errors.append(f"{path}: variable {v['name']}: the console reads only label_values(SELECTOR, LABEL): {v['query']}")
                if v.get("hide") != 0:
                    errors.append(f"{path}: variable {v['name']}: hide must be 0 for the console to show it")
        panels = []
        for p in board.get("panels", []):
            panels.extend(p.get("panels", []) if p.get("type") == "row" else [p])
        if not panels:
            errors.append(f"{path}: no panel")
        for p in panels:
            where = f"{path}: panel {p.get('id')} {p.get('title')!r}"
            if p.get("type") not in CONSOLE_PANELS:
                errors.append(f"{where}: type {p.get('type')} is not one the console draws")
            targets = p.get("targets") or []
            if not targets:
                errors.append(f"{where}: no targets")
            for t in targets:
                expr = t.get("expr")
                if not isinstance(expr, str) or not expr.strip():
                    errors.append(f"{where}: a target without expr")
                    continue
                if not t.get("refId"):
                    errors.append(f"{where}: a target without refId")
                for var in re.findall(r"\$(\w+)", expr):
                    if var not in known:
                        errors.append(f"{where}: ${var} is no variable of the dashboard")
            if p.get("type") == "table" and not p.get("styles"):
                errors.append(f"{where}: a table needs styles (the console shows its columns by them)")
            if p.get("type") == "graph" and not p.get("yaxes"):
                errors.append(f"{where}: a graph needs yaxes (the console takes its unit from the first)")
    for e in errors:
        print(e)
    if not errors:
        print(f"{len(files)} dashboards: JSON, every panel drawn by the console, each with its queries")
    return 1 if errors else 0


def metric_names(crates, paths):
    """Each causeway_ token of the files is a metric the crates define."""
    defined, histograms = set(), set()
    for root, _, names in os.walk(crates):
        for n in names:
            if not n.endswith(".rs"):
                continue
            with open(os.path.join(root, n), encoding="utf-8") as f:
                text = f.read()
            defined.update(re.findall(r'"(causeway_[a-z0-9_]+)"', text))
            histograms.update(re.findall(r'HistogramOpts::new\(\s*"(causeway_[a-z0-9_]+)"', text))
    errors = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for token in sorted(set(re.findall(r"causeway_[a-z0-9_]+", f.read()))):
                base = re.sub(r"_(bucket|sum|count)$", "", token)
                if token not in defined and not (base != token and base in histograms):
                    errors.append(f"{path}: {token} is no metric defined under {crates}")
    for e in errors:
        print(e)
    if not errors:
        print(f"every metric named in {len(paths)} files is defined under {crates}")
    return 1 if errors else 0


CASES = {
    "provisioner-file": case_provisioner_file,
    "provisioner-values": case_provisioner_values,
    "provisioner-defaults": case_provisioner_defaults,
    "go-values": case_go_values,
    "namespaced": case_namespaced,
    "dpf-off": case_dpf_off,
    "dpf-no-config": case_dpf_no_config,
    "dpf-settings": case_dpf_settings,
    "default": case_default,
    "production": case_production,
    "openshift": case_openshift,
    "openshift-all": case_openshift_all,
    "worker": case_worker,
    "custom": case_custom,
    "no-leader": case_no_leader,
    "images": case_images,
    "existing-sa": case_existing_sa,
    "webhook-cert-manager": case_webhook_cert_manager,
    "webhook-cert-manager-issuer": case_webhook_cert_manager_issuer,
    "webhook-self-signed": case_webhook_self_signed,
    "webhook-off": case_webhook_off,
    "webhook-policy": case_webhook_policy,
    "webhook-policy-any-source": case_webhook_policy_any_source,
    "webhook-no-policy": case_webhook_no_policy,
    "monitoring": case_monitoring,
    "monitoring-thresholds": case_monitoring_thresholds,
    "monitoring-no-crds": case_monitoring_no_crds,
    "pod-monitors-off": case_pod_monitors_off,
    "metrics-secured": case_metrics_secured,
}


def rendered(case, path):
    try:
        CASES[case](load(path))
    except AssertionError as e:
        print(f"{case}: {e}")
        return 1
    return 0


def drop_kinds(names):
    drop = set(names.split(","))
    docs = [d for d in yaml.safe_load_all(sys.stdin) if d and d.get("kind") not in drop]
    yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)
    return 0


def main(argv):
    if len(argv) == 4 and argv[1] == "values-table":
        return values_table(argv[2], argv[3])
    if len(argv) == 3 and argv[1] == "values-comments":
        return values_comments(argv[2])
    if len(argv) == 4 and argv[1] == "rendered" and argv[2] in CASES:
        return rendered(argv[2], argv[3])
    if len(argv) == 4 and argv[1] == "values-schema":
        return values_schema(argv[2], argv[3])
    if len(argv) == 3 and argv[1] == "drop-kinds":
        return drop_kinds(argv[2])
    if len(argv) == 2 and argv[1] == "rule-spec":
        return rule_spec()
    if len(argv) == 3 and argv[1] == "dashboards":
        return dashboards(argv[2])
    if len(argv) >= 4 and argv[1] == "metric-names":
        return metric_names(argv[2], argv[3:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
