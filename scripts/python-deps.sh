#!/usr/bin/env bash
# Python packages the tests drive onebit with: the official OpenAI client
# (tests/serve/*.py, run by crates/onebit/tests/serve.rs) and jsonschema, which
# the tool-call and structured-output tests validate replies with. Pinned.
set -euo pipefail
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore openai==3.51.0 jsonschema==4.26.0
# Ollama's official client (tests/serve/test_ollama_client.py) and selenium,
# which drives headless Chromium through the chat page (tests/serve/test_page.py).
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore ollama==0.6.3 selenium==4.45.0
