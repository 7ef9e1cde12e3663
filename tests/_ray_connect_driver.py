"""Run inside a loopback-only network namespace by tests/test_ray_guards.py: a TCP listener that
accepts and never answers (a port that is not a Ray head), then `oelm run --executor ray --address`
that port; once oelm has connected, SIGTERM to it. Prints one JSON line: exit status, seconds from
the signal to the exit, and oelm's output.

usage: python _ray_connect_driver.py CONFIG OUTPUT_DIR
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time

config, out = sys.argv[1:3]
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(16)
port = server.getsockname()[1]
accepted = threading.Event()
held = []


def accept() -> None:
    while True:
        conn, _ = server.accept()
        held.append(conn)  # kept open, never answered
        accepted.set()


threading.Thread(target=accept, daemon=True).start()
proc = subprocess.Popen([sys.executable, "-m", "oelm", "run", config, "--output-dir", out, "--executor", "ray",
                         "--address", f"127.0.0.1:{port}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
# oelm's own reachability probe connects (and closes) first; Ray's connection is the one that stays
deadline = time.time() + 120
while time.time() < deadline and proc.poll() is None and len(held) < 2:
    time.sleep(0.05)
time.sleep(1.0)  # inside ray.init now, waiting for an answer that never comes
connections = len(held)
sent = time.time()
proc.send_signal(signal.SIGTERM)
try:
    log, _ = proc.communicate(timeout=60)
except subprocess.TimeoutExpired:
    proc.kill()
    log, _ = proc.communicate()
print(json.dumps({"returncode": proc.returncode, "seconds": time.time() - sent, "connections": connections, "log": log}))
