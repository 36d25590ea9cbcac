"""One rank of a 2-rank gloo process group whose store is our TCPStore server.

argv: rank, port. Uses init_method tcp:// with TORCHELASTIC_USE_AGENT_STORE=True
(every rank a client, as under torchrun). Prints "ok <sum>".
"""
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

rank, port = int(sys.argv[1]), int(sys.argv[2])
os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=2, timeout=timedelta(seconds=60))
dist.barrier()
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
print(f"ok {int(t.item())}", flush=True)
dist.destroy_process_group()
