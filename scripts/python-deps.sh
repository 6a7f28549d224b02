#!/usr/bin/env bash
# Python packages the tests drive onebit with: the official OpenAI client
# (tests/serve/*.py, run by crates/onebit/tests/serve.rs) and jsonschema, which
# the tool-call and structured-output tests validate replies with. Pinned.
set -euo pipefail
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore openai==3.51.0 jsonschema==4.26.0
# Ollama's official client (tests/serve/test_ollama_client.py) and selenium,
# which drives headless Chromium through the chat page (tests/serve/test_page.py).
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore ollama==0.6.3 selenium==4.45.0
# markdown-it-py, a CommonMark reference, the chat page's renderer is checked against.
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore markdown-it-py==4.3.0
# The drop-in client matrix (issue 29): Anthropic's official client, LangChain's
# OpenAI and Ollama integrations, and litellm's openai/ and ollama_chat/ routes.
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore anthropic==2.15.0 langchain-openai==1.7.4 langchain-ollama==1.1.0 langchain-core==1.8.3 litellm==1.110.2
# The harmony references (scripts/gen_harmony_refs.py, scripts/gen-o200k-harmony.py):
# OpenAI's openai-harmony, the reference renderer and parser of gpt-oss's format,
# and tiktoken, whose o200k_harmony the vocabulary's specials are checked against.
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore openai-harmony==0.0.8 tiktoken==0.14.0
# Pillow, the independent reference the image preprocessing is checked
# against (scripts/gen-image-fixtures.py writes testdata/images/pil/).
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore pillow==13.0.0
