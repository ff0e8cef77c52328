// Schema validation of the Prometheus Operator's kinds in a rendering of the
// chart, which kubernetes-validate has no schema for: every ServiceMonitor,
// PodMonitor and PrometheusRule (monitoring.coreos.com/v1) of the
// multi-document YAML files named, against the schemas of
// @kubernetes-models/prometheus-operator (generated from the Prometheus
// Operator's CRDs). Other kinds are left to kubernetes-validate.
//
//   node validate_monitoring.mjs FILE...
//
// Prints one line per object checked and one per error; exits 1 on any
// error, 2 on bad usage. charts/test.sh installs the two npm packages it
// imports (pinned) into its tool cache and runs a copy of this file there,
// beside their node_modules.

import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";
import {
  PodMonitor,
  PrometheusRule,
  ServiceMonitor,
} from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";

const MODELS = { ServiceMonitor, PodMonitor, PrometheusRule };
const API_VERSION = "monitoring.coreos.com/v1";

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error("usage: node validate_monitoring.mjs FILE...");
  process.exit(2);
}

let errors = 0;
for (const file of files) {
  for (const doc of parseAllDocuments(readFileSync(file, "utf8"))) {
    if (doc.errors.length > 0) {
      errors += 1;
      console.log(`${file}: not YAML: ${doc.errors[0].message}`);
      continue;
    }
    const obj = doc.toJS();
    if (obj === null || typeof obj !== "object" || !(obj.kind in MODELS)) {
      continue;
    }
    const meta = obj.metadata ?? {};
    const where = `${file}: ${obj.kind} ${meta.namespace ?? ""}/${meta.name ?? "(no name)"}`;
    if (obj.apiVersion !== API_VERSION) {
      errors += 1;
      console.log(`${where}: apiVersion is ${obj.apiVersion}, not ${API_VERSION}`);
      continue;
    }
    try {
      new MODELS[obj.kind](obj).validate();
      console.log(`${where}: valid`);
    } catch (e) {
      errors += 1;
      console.log(`${where}: ${e.message}`);
    }
  }
}
process.exit(errors === 0 ? 0 : 1);
