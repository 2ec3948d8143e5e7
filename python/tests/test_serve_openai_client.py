"""`anchorkv serve` driven by the official OpenAI client for Node.js (openai_client.cjs, the package
scripts/deps.sh pins into build/npm): the fields clients send are honoured, or refused naming the field."""
import os
import pathlib
import shutil
import subprocess

import pytest

from test_serve import CACHE, CLI, TINY, Server

HERE = pathlib.Path(__file__).resolve().parent
MODULES = os.environ.get("ANCHORKV_NODE_MODULES", "")
HAVE = bool(CLI) and TINY.exists() and shutil.which("node") and (pathlib.Path(MODULES) / "openai").is_dir()
pytestmark = pytest.mark.skipif(not HAVE and not os.environ.get("CI"),
                                reason="needs the anchorkv CLI, the tiny model, node and the openai package")


def test_the_official_openai_client():
    assert HAVE, "CI must have node and the pinned openai package (scripts/deps.sh installs them)"
    s = Server(*CACHE, "--chat-template", "chatml")
    try:
        r = subprocess.run(["node", str(HERE / "openai_client.cjs"), s.url + "/v1"], capture_output=True, text=True,
                           timeout=120, env=dict(os.environ, NODE_PATH=MODULES))
        print(r.stdout, r.stderr)
        assert r.returncode == 0 and "FAILED" not in r.stdout, r.stdout + r.stderr
        assert r.stdout.count("ok ") == 12
    finally:
        assert s.stop() == 0
