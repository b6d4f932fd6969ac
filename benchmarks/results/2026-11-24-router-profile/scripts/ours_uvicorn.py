"""Our HTTP ingress as of the snapshot, in one uvicorn process (no Serve): port prefill_url decode_url boot."""
import sys
from pathlib import Path

import uvicorn

from deployments.router import RouterCore, build_http_app
from orchestrator.config import load_config
from orchestrator.protocol import WorkerEndpoint

port, pf, dc, boot = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
root = Path.cwd()
cfg = load_config(root / "configs" / "default.yaml", [f"model.path={root / 'models' / 'deepseek-v2-lite'}"])
core = RouterCore(cfg, "harness")
core.follow(1, [WorkerEndpoint("prefill", "prefill-0", pf, "127.0.0.1", boot),
                WorkerEndpoint("decode", "decode-0", dc)])
app = build_http_app()
app.state.core = core
uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning")
