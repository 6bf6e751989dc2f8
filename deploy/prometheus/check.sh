#!/usr/bin/env bash
# Checks the alert rules and runs their unit tests (needs promtool: Debian package prometheus).
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v promtool >/dev/null 2>&1; then
    echo "promtool not found: apt-get install --no-install-recommends prometheus" >&2
    exit 127
fi
promtool check rules alerts.yaml
promtool test rules alerts_test.yaml
