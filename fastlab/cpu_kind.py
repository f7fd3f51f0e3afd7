"""Running as another kind of CPU: FASTLAB_CPU_KIND=avx2 (or avx512, avx512_bf16, amx) caps the instruction sets
torch's own kernels (ATEN_CPU_CAPABILITY) and oneDNN's (ONEDNN_MAX_CPU_ISA) use, and sets the feature flags fastlab
reads, so one machine runs the suite as each kind of CPU a room brings. A cap only lowers: a kind above this CPU's
own runs its kernels at this CPU's level, with fastlab reading the kind's flags (the branch fastlab takes is the
kind's). No torch import here: the caps are read when torch first dispatches, so `apply()` must run before that."""

from __future__ import annotations

import getpass
import os
import tempfile

ENV = "FASTLAB_CPU_KIND"
_AVX2 = ("sse4_2", "avx", "avx2", "fma")
_AVX512 = (*_AVX2, "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni")
# kind: (the flags fastlab reads, ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA)
CPU_KINDS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "avx2": (_AVX2, "avx2", "AVX2"),  # AMD EPYC with AVX2 only: no native bf16
    "avx512": (_AVX512, "avx512", "AVX512_CORE_VNNI"),  # AVX-512 without bf16
    "avx512_bf16": ((*_AVX512, "avx512_bf16"), "avx512", "AVX512_CORE_BF16"),  # AMD EPYC with AVX-512 BF16
    "amx": ((*_AVX512, "avx512_bf16", "amx_tile", "amx_bf16"), "avx512", "AVX512_CORE_AMX"),  # Intel Xeon with AMX
}


def active_kind() -> str | None:
    """The kind FASTLAB_CPU_KIND asks for, None when unset; an unknown name is refused naming the known ones."""
    kind = os.environ.get(ENV, "").strip().lower()
    if not kind:
        return None
    if kind not in CPU_KINDS:
        raise ValueError(f"{ENV}={kind!r} is not a kind of CPU fastlab knows: choose one of {', '.join(CPU_KINDS)}")
    return kind


def kind_flags() -> set[str] | None:
    """The feature flags of the kind asked for, None when this machine's own are read."""
    kind = active_kind()
    return None if kind is None else set(CPU_KINDS[kind][0])


def apply() -> str | None:
    """Cap torch's and oneDNN's instruction sets at the asked kind's, in this process and every process it starts,
    with an inductor cache of the kind's own: inductor's cache key leaves ATEN_CPU_CAPABILITY out, and a kernel
    compiled under another cap and reused here reads garbage indices (seen with torch 2.14.1: "index -1 is out of
    bounds" in a compiled backward). Returns the kind (None when unset)."""
    kind = active_kind()
    if kind is not None:
        _, aten, onednn = CPU_KINDS[kind]
        os.environ["ATEN_CPU_CAPABILITY"] = aten
        os.environ["ONEDNN_MAX_CPU_ISA"] = onednn
        user = getpass.getuser() if hasattr(os, "getuid") else "user"
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"torchinductor_{user}_{kind}")
    return kind


apply()  # on import: fastlab's __init__ imports this module before torch
