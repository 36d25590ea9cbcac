"""Serves torch's TCPStore for the Rust client (crates/tcpstore/tests/torch_interop.rs).

argv: "libuv" or "legacy". Prints "port N" once listening, then acts as a
torch client of its own server: waits for the key the Rust client sets,
answers with a binary value, and exits once the Rust side sets "done"
(or stays until killed with "hold").
"""
import sys
from datetime import timedelta

import torch.distributed as dist

backend = sys.argv[1]
hold = len(sys.argv) > 2 and sys.argv[2] == "hold"
server = dist.TCPStore(
    "127.0.0.1", 0, is_master=True, wait_for_workers=False,
    use_libuv=(backend == "libuv"), timeout=timedelta(seconds=60),
)
print(f"port {server.port}", flush=True)
if hold:
    import time
    time.sleep(600)
client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=60))
got = client.get("from_rust")
assert got == bytes(range(256)) + b"\x00", got
# The counter first: the Rust side adds to it once it reads from_torch.
assert client.add("counter", 10) == 10
client.set("from_torch", b"\xff\x00torch")
client.wait(["done"])
print("torch side ok", flush=True)
