#!/usr/bin/env bash

cat > /app/daemon <<'EOF'
#!/usr/bin/env python3
import os
import signal
import sys
import time
state = sys.argv[1]
reloads = 0
message = ""
stop = False
def write_status(text):
    tmp = os.path.join(state, ".status.tmp")
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, os.path.join(state, "status"))
def load():
    global message
    with open(os.path.join(state, "config")) as f:
        for line in f:
            if line.startswith("message="):
                message = line.rstrip("\n")[len("message="):]
def on_hup(*_):
    global reloads
    load()
    reloads += 1
    write_status("running reloads=%d message=%s" % (reloads, message))
def on_usr1(*_):
    with open(os.path.join(state, "out.log"), "a") as f:
        f.write(message + "\n")
def on_term(*_):
    global stop
    stop = True
load()
signal.signal(signal.SIGHUP, on_hup)
signal.signal(signal.SIGUSR1, on_usr1)
signal.signal(signal.SIGTERM, on_term)
write_status("running reloads=0 message=%s" % message)
while not stop:
    time.sleep(0.05)
write_status("stopped reloads=%d" % reloads)
EOF
chmod +x /app/daemon

mkdir -p /tmp/st && echo 'message=hi' > /tmp/st/config && (/app/daemon /tmp/st & p=$!; sleep 0.5; kill -HUP $p; sleep 0.2; kill -TERM $p; wait $p; echo "exit $?"); cat /tmp/st/status; rm -rf /tmp/st
