#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p svc
cat > svc/worker.py <<'EOF'
import os
import signal
import sys
import time

run_dir = os.environ.get("SVC_RUN_DIR", "/app/svc/run")
stopping = False


def on_term(signum, frame):
    global stopping
    stopping = True


signal.signal(signal.SIGTERM, signal.SIG_IGN if os.environ.get("WORKER_IGNORE_TERM") else on_term)
while not stopping:
    with open(os.path.join(run_dir, "heartbeat.tmp"), "w") as f:
        f.write("%f\n" % time.time())
    os.replace(os.path.join(run_dir, "heartbeat.tmp"), os.path.join(run_dir, "heartbeat"))
    time.sleep(0.1)
with open(os.path.join(run_dir, "worker.log"), "a") as f:
    f.write("stopped cleanly\n")
EOF
