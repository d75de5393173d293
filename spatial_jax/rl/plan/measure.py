"""One compiled program's figures: per-chip memory from the compiler's buffer assignment, FLOPs, compile time,
Pallas (Mosaic) kernel calls, whether the persistent compilation cache served it; a program XLA:TPU refuses for want
of HBM is measured by what it asked for."""

from __future__ import annotations

import dataclasses
import re
import sys
import time
from typing import Any

import jax

from spatial_jax import compile_cache
from spatial_jax.kernels.logprob_entropy import pallas as pallas_kernels
from spatial_jax.rl.plan.targets import GiB


@dataclasses.dataclass
class Program:
    name: str
    what: str  # the shape it runs at, in words
    argument: int
    output: int
    alias: int
    temp: int
    peak: int  # the program's own peak plus `resident`
    compile_s: float
    flops: float | None
    resident: int = 0  # trainer state in memory meanwhile that is no argument (Adam state while sampling, ...)
    mosaic_kernels: int = 0  # Pallas/Mosaic kernel calls in the compiled program (splash attention, the LM head)
    lm_head_kernels: int = 0  # of those, the Pallas LM head's (forward; + dh and dw in an update)
    all_to_alls: int = 0  # all-to-all call sites in the compiled program (the MoE layers' expert parallelism)
    cache: str = "off"  # the persistent compilation cache: "hit" (loaded, not compiled), "miss" or "off"

    def row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def compiler_oom_bytes(message: str) -> int | None:
    """The temporaries XLA:TPU says a program needs when it refuses it for want of HBM ("... required for HLO
    temporaries (318.00G) exceeds available HBM (95.74G)"), in bytes; None for any other error."""
    found = re.search(r"required for HLO temporaries \(([0-9.]+)([KMGT])\) exceeds available HBM", message)
    return None if found is None else int(float(found.group(1)) * _UNITS[found.group(2)])


def mosaic_kernels(hlo: str) -> tuple[int, int]:
    """(Mosaic kernel calls, of which the Pallas LM head's) in a compiled program's HLO text: each call site once
    (a kernel inside a scanned layer is one call)."""
    calls = [line for line in hlo.splitlines() if 'custom_call_target="tpu_custom_call"' in line]
    return len(calls), sum(f"/{pallas_kernels.SCOPE}/" in line for line in calls)


def collective_calls(hlo: str, op: str) -> int:
    """Call sites of collective `op` ("all-to-all", "all-gather", ...) in a compiled program's HLO text, synchronous
    or started asynchronously (its -done half is not counted again)."""
    return len(re.findall(rf"= [^=]*? {re.escape(op)}(?:-start)?\(", hlo))


def all_to_alls(hlo: str) -> int:
    """All-to-all call sites in a compiled program's HLO text (the MoE layers' expert parallelism)."""
    return collective_calls(hlo, "all-to-all")


def _measure(mesh, name: str, what: str, jitted, args, resident: int = 0) -> Program:
    """Lowers and compiles `jitted` at abstract `args` under `mesh` (activations constrained as in training)."""
    t0 = time.perf_counter()
    print(f"plan: compiling {name} ({what})", file=sys.stderr, flush=True)
    hits = compile_cache.counts()[0]
    with jax.set_mesh(mesh):
        lowered = jitted.lower(*args)
        try:
            compiled = lowered.compile()
        except jax.errors.JaxRuntimeError as err:
            needed = compiler_oom_bytes(str(err))
            if needed is None:
                raise
            # XLA:TPU refuses a program whose temporaries exceed the chip: that is the answer, not a failure
            seconds = time.perf_counter() - t0
            print(f"plan: {name} does not compile: {fmt_bytes(needed)} of temporaries", file=sys.stderr, flush=True)
            return Program(name, what + " [compiler: out of HBM]", 0, 0, 0, needed, needed + resident, seconds, None,
                           resident)
    seconds = time.perf_counter() - t0
    cache = ("hit" if compile_cache.counts()[0] > hits else "miss") if jax.config.jax_compilation_cache_dir else "off"
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
    flops = float(cost["flops"]) if isinstance(cost, dict) and "flops" in cost else None
    peak = int(getattr(mem, "peak_memory_in_bytes", 0) or 0)
    derived = mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes + mem.temp_size_in_bytes
    program = Program(name, what, int(mem.argument_size_in_bytes), int(mem.output_size_in_bytes),
                      int(mem.alias_size_in_bytes), int(mem.temp_size_in_bytes), max(peak, int(derived)) + resident,
                      seconds, flops, resident, *mosaic_kernels(hlo := compiled.as_text()), all_to_alls(hlo), cache)
    how = "loaded from the compilation cache" if cache == "hit" else "compiled"
    print(f"plan: {name} {how} in {seconds:.0f} s, peak {fmt_bytes(program.peak)} per chip", file=sys.stderr,
          flush=True)
    return program


def fmt_bytes(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if abs(n) >= GiB else f"{n / (1 << 20):.2f} MiB"
