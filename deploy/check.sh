#!/usr/bin/env bash
# Checks the deployment files as a new user would before copying them into production:
#   1. every Kubernetes manifest against the Kubernetes schemas (kubernetes-validate --strict);
#   2. everything in deploy/ against checkov's policies (Kubernetes, kustomize, Dockerfile,
#      Terraform), failing on any failed check: a deliberate exception is a skip with its
#      reason beside the resource, which checkov counts as skipped;
#   3. the Prometheus alert rules and their unit tests (prometheus/check.sh, promtool);
#   4. the Terraform files formatted (terraform fmt -check, when terraform is installed) and
#      every topic's Pub/Sub schema file present.
# The Python tools are installed, pinned, into a virtualenv cached under
# ${XDG_CACHE_HOME:-$HOME/.cache}/courier/deploy-venv (about 1.5 minutes the first time, nothing
# after); promtool comes from Debian's prometheus package (scripts/stack.sh, ensure_promtool).
# scripts/test runs this on a whole run.
set -euo pipefail

deploy=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$deploy")

# Pinned: a new release of either tool may add checks or schemas; bump deliberately.
CHECKOV_VERSION=3.3.30
KUBERNETES_VALIDATE_VERSION=1.37.0
KUBERNETES_VERSION=1.37.0

venv="${XDG_CACHE_HOME:-$HOME/.cache}/courier/deploy-venv"
stamp="$venv/courier-pins"
pins="checkov==$CHECKOV_VERSION kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"

step() { printf '\n== deploy/check.sh: %s\n' "$*"; }

# --- tools ------------------------------------------------------------------------------------
# Reinstalled only when the pins change or the venv is broken; a half-finished install leaves no
# stamp and is redone.
ensure_venv() {
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$pins" ]] \
        && "$venv/bin/python" -c '' 2>/dev/null \
        && [[ -x "$venv/bin/checkov" && -x "$venv/bin/kubernetes-validate" ]]; then
        return
    fi
    step "installing $pins into $venv"
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    if ! python3 -m venv "$venv"; then
        echo "deploy/check.sh: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2
        exit 1
    fi
    local log
    log=$(mktemp)
    # shellcheck disable=SC2086 # $pins is a list of requirement specifiers.
    if ! "$venv/bin/python" -m pip install --disable-pip-version-check --no-input -q $pins \
        >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        echo "deploy/check.sh: could not install $pins from PyPI" >&2
        exit 1
    fi
    rm -f "$log"
    printf '%s' "$pins" >"$stamp"
}

ensure_venv
failed=()

# --- 1. Kubernetes schemas --------------------------------------------------------------------
# Every manifest under k8s/. Not kustomization.yaml: kustomize's own file format, which has no
# Kubernetes schema (kubectl kustomize reads it). Not cloudrun/: Cloud Run's YAML is the Cloud
# Run Admin API (serving.knative.dev/v1 Service, run.googleapis.com/v1 Job), for which
# kubernetes-validate has no schemas; gcloud checks it on replace.
step "kubernetes-validate --strict (Kubernetes $KUBERNETES_VERSION)"
mapfile -t manifests < <(find "$deploy/k8s" -name '*.yaml' ! -name kustomization.yaml | sort)
kv_log=$(mktemp)
kv_status=0
"$venv/bin/kubernetes-validate" --strict --kubernetes-version "$KUBERNETES_VERSION" \
    "${manifests[@]}" >"$kv_log" 2>&1 || kv_status=$?
sed "s|$deploy/||" "$kv_log"
# A manifest whose kind or apiVersion has no schema is only a warning to the tool; here it is a
# mistake (a typo in apiVersion, a kind that does not exist in this Kubernetes).
if [[ $kv_status -ne 0 ]] || grep -qE "^(ERROR|WARN)" "$kv_log"; then
    failed+=("kubernetes-validate")
fi
rm -f "$kv_log"

# --- 2. checkov -------------------------------------------------------------------------------
# --skip-download: nothing fetched from Prisma Cloud (no account; offline runs work the same).
# kustomize: checkov renders k8s/ and k8s/migrate/ with kubectl kustomize (or kustomize) when
# one is installed, and checks the rendered resources too.
step "checkov $CHECKOV_VERSION -d deploy"
if ! (cd "$root" && BC_SKIP_MAPPING=TRUE "$venv/bin/checkov" -d deploy --skip-download \
    --quiet --compact --output cli); then
    failed+=("checkov")
fi

# --- 3. Prometheus rules ----------------------------------------------------------------------
step "promtool (prometheus/check.sh)"
# shellcheck source=../scripts/stack.sh
source "$root/scripts/stack.sh"
if ! ensure_promtool || ! "$deploy/prometheus/check.sh"; then
    failed+=("promtool")
fi

# --- 4. Terraform -----------------------------------------------------------------------------
step "terraform"
if command -v terraform >/dev/null 2>&1; then
    if terraform fmt -check -recursive -diff "$deploy/terraform" 2>/dev/null; then
        echo "terraform fmt: formatted"
    else
        failed+=("terraform fmt")
    fi
else
    # Terraform is in neither PyPI nor Debian, and nothing else in this repository installs
    # it: the format check runs where it is installed; checkov above still reads the files.
    echo "terraform is not installed: terraform fmt -check skipped"
fi
# Each topic carries its schema from terraform/schemas/<topic>.proto (google_pubsub_schema's
# file(...)); courier-proto's tests/pubsub_schemas.rs checks their content. The topics are the
# values of main.tf's `topics = { <publisher> = "<topic>" … }` local.
mapfile -t topics < <(sed -n '/^  topics = {$/,/^  }$/ s/^ *[a-z_]* *= *"\([^"]*\)".*/\1/p' \
    "$deploy/terraform/main.tf")
if [[ ${#topics[@]} -eq 0 ]]; then
    echo "no topics found in terraform/main.tf" >&2
    failed+=("terraform schemas")
fi
for topic in "${topics[@]}"; do
    if [[ -s "$deploy/terraform/schemas/$topic.proto" ]]; then
        echo "schema attached: terraform/schemas/$topic.proto"
    else
        echo "topic $topic has no schema file terraform/schemas/$topic.proto" >&2
        failed+=("terraform schemas")
    fi
done

if [[ ${#failed[@]} -gt 0 ]]; then
    printf '\ndeploy/check.sh: FAILED: %s\n' "${failed[*]}" >&2
    exit 1
fi
printf '\ndeploy/check.sh: all checks passed\n'
