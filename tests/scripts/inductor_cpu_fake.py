"""The check of PyTorch's CompileTestCPU (test/distributed/test_c10d_functional_native.py), written
anew: on the fake backend (rank 0 of 2, no other process), inductor compiles a function with a
functional all_reduce on CPU, with the Python wrapper and with cpp_wrapper, and the generated
code calls the in-place functional collective and its wait; then AOTInductor compiles and runs
it. Run with ``--commtrace DIR`` to trace it (commtrace.enable before the group exists, as a user
would). Prints ``OK <checks>`` and writes the results to OUT_JSON.

Usage: inductor_cpu_fake.py OUT_JSON [--commtrace DIR]
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist


def main() -> int:
    out_json = sys.argv[1]
    if "--commtrace" in sys.argv:
        import commtrace

        commtrace.enable(output=sys.argv[sys.argv.index("--commtrace") + 1])
    import torch.distributed._functional_collectives as funcol
    from torch._inductor.utils import fresh_cache, run_and_get_code
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group(backend="fake", world_size=2, rank=0, store=FakeStore())

    def func(arg):
        buf = arg + 42
        out = funcol.all_reduce(buf, "avg", "0")
        return funcol.wait_tensor(out)

    torch.manual_seed(0)
    arg = torch.rand(4, 4)
    res = {}
    for cpp_wrapper in (False, True):
        with fresh_cache(), torch._inductor.config.patch({"cpp_wrapper": cpp_wrapper}):
            torch._dynamo.reset()
            compiled = torch.compile(func)
            result, (code,) = run_and_get_code(compiled, arg)
        want = (["aoti_torch_cpu__c10d_functional_all_reduce_",
                 "aoti_torch_cpu__c10d_functional_wait_tensor"] if cpp_wrapper else
                ["torch.ops._c10d_functional.all_reduce_.default",
                 "torch.ops._c10d_functional.wait_tensor.default"])
        missing = [w for w in want if w not in code]
        assert not missing, (cpp_wrapper, missing)
        res[f"cpp_wrapper={cpp_wrapper}"] = result.tolist()

    class M(torch.nn.Module):
        def forward(self, x):
            return func(x)

    ep = torch.export.export(M(), (arg,))
    path = torch._inductor.aoti_compile_and_package(ep)
    res["aoti"] = torch._inductor.aoti_load_package(path)(arg).tolist()
    res["eager"] = func(arg).tolist()
    with open(out_json, "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()
    if "--commtrace" in sys.argv:
        commtrace.disable()
    print("OK", sorted(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
