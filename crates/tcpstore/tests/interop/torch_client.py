"""torch's TCPStore client against our server (crates/tcpstore/tests/torch_interop.rs).

argv: port. Prints "ok" when every check passed.
"""
import sys
from datetime import timedelta

import torch.distributed as dist

port = int(sys.argv[1])
s = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
binary = bytes(range(256))
s.set("bin", binary)
assert s.get("bin") == binary
s.set("empty", b"")
assert s.get("empty") == b""
assert s.add("n", 5) == 5 and s.add("n", -7) == -2
assert s.check(["bin", "n"]) and not s.check(["nope"])
assert s.compare_set("cas", "", "one") == b"one"
assert s.compare_set("cas", "two", "three") == b"one"
assert s.compare_set("cas", "one", "two") == b"two"
assert s.multi_get(["bin", "empty"]) == [binary, b""]
s.multi_set(["m1", "m2"], ["a", "b"])
assert s.get("m2") == b"b"
s.append("ap", "x")
s.append("ap", "y")
assert s.get("ap") == b"xy"
assert s.delete_key("n") and not s.delete_key("n")
# The Rust test set this key before starting us.
assert s.get("from_rust") == b"\x00rust\xff", s.get("from_rust")
try:
    s.wait(["never"], timedelta(milliseconds=300))
    raise SystemExit("a wait for an unset key returned")
except dist.DistStoreError as e:
    assert "timeout" in str(e).lower(), e
# The connection is still in step after the cancelled wait.
s.set("after", "1")
assert s.get("after") == b"1"
assert sorted(s.list_keys()) == sorted(
    ["bin", "empty", "cas", "m1", "m2", "ap", "from_rust", "after"]), s.list_keys()
assert s.num_keys() == 8, s.num_keys()
s.queue_push("q", "v1")
assert s.queue_len("q") == 1 and s.queue_pop("q") == b"v1"
print("ok", flush=True)
