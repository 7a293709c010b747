"""The machine in every run folder: the CPU model, cores, the flags that change a CPU run's speed or last
bits, torch's CPU capability; and a page that mixes machines says so (two EPYCs, AVX2 and AVX-512, gave
different scores to the same run ids, and "AMD EPYC, 2 cores" could not tell them apart)."""

from __future__ import annotations

from dfbench.benchmark.core import numerics, runfolder
from dfbench.benchmark.report.tables import hardware_line

ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu sse sse2 avx fma avx2 avx512f avx512dq avx512_bf16 avx512vl sha_ni
processor\t: 1
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu sse sse2 avx fma avx2 avx512f avx512dq avx512_bf16 avx512vl sha_ni
"""
ROME = """processor\t: 0
model name\t: AMD EPYC 7B12
flags\t\t: fpu sse sse2 avx fma avx2 sha_ni
"""
GRAVITON = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp sve bf16
"""


def test_the_flags_tell_an_avx2_epyc_from_an_avx512_one():
    zen4, rome = numerics.cpu_record(ZEN4), numerics.cpu_record(ROME)
    assert zen4["model"] == "AMD EPYC 9R14 96-Core Processor" and rome["model"] == "AMD EPYC 7B12"
    assert zen4["flags"] == ["avx2", "fma", "avx512f", "avx512_bf16"]  # in NUMERIC_CPU_FLAGS' order, others left out
    assert rome["flags"] == ["avx2", "fma"]
    assert zen4["torch_capability"] == rome["torch_capability"]  # torch's, from this machine (not from the text)


def test_arm_features_and_no_cpuinfo():
    arm = numerics.cpu_record(GRAVITON)
    assert arm["flags"] == ["asimd", "sve", "bf16"]
    none = numerics.cpu_record("")
    assert none["flags"] == [] and none["model"]  # platform's name of the machine stands in


def test_the_run_folder_records_the_cpu_and_names_its_flags_in_the_hardware_line(monkeypatch):
    monkeypatch.setattr(runfolder, "cpu_record", lambda: numerics.cpu_record(ROME))
    env = runfolder.environment("cpu")
    assert env["cpu"]["flags"] == ["avx2", "fma"] and env["cpu"]["cores"] >= 1
    assert env["hardware"].startswith("AMD EPYC 7B12, ") and "(avx2 fma), device cpu" in env["hardware"]


def test_a_page_from_several_machines_says_so():
    assert hardware_line(["CPU A, 2 cores (avx2), device cpu"]) == "Hardware: CPU A, 2 cores (avx2), device cpu."
    mixed = hardware_line(["CPU A (avx2)", "CPU B (avx2 avx512f)"])
    assert mixed.startswith("Hardware: these runs come from 2 machines (CPU A (avx2); CPU B (avx2 avx512f))")
    assert "compare scores from one machine only" in mixed
