#!/usr/bin/env bash
# Wheels of Hugging Face transformers and its dependencies for a machine without network (the GPU
# machine of bench/device_run.sh py-adapters): downloaded here into .deps/hf-wheels (~28 MB, git
# ignored) for CPython ${PY_VERSION:-3.12} on x86-64 Linux; carry that folder to the device
# (the device tool's carry: [".deps/hf-wheels"]), where py-adapters installs them with
# `pip install --no-index --no-deps --target`. numpy is left out (torch's machines have it).
#
#   scripts/hf_wheels.sh            # then: device run with carry [".deps/hf-wheels"]
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${REPO_ROOT}/.deps/hf-wheels"
python="${PYTHON:-python3}"
rm -rf "${dest}"
mkdir -p "${dest}"
"${python}" -m pip download -q --disable-pip-version-check --only-binary=:all: \
  --python-version "${PY_VERSION:-3.12}" --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "${dest}" \
  "transformers>=4.53"
rm -f "${dest}"/numpy-*.whl
echo "[flashjit] $(find "${dest}" -name '*.whl' | wc -l) wheels, $(du -sh "${dest}" | cut -f1) in ${dest}"
