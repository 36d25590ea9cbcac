"""Runs a script with Dynamo's own compiler collectives made runnable on a
CPU-only job: the PyTorch oracle harness's one patch (the device context of
OutputGraph.run_compiler_collective, tests/pytorch-oracle/README.md), then
the script. Usage: pytorch_patched.py SCRIPT ARGS..."""

import importlib.util
import pathlib
import runpy
import sys

harness_path = pathlib.Path(__file__).resolve().parents[3] / "tests/pytorch-oracle/harness.py"
spec = importlib.util.spec_from_file_location("ccol_oracle_harness", harness_path)
harness = importlib.util.module_from_spec(spec)
spec.loader.exec_module(harness)
harness._patch_compiler_collective_device_context()
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
