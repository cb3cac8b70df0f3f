"""Per GGUF tensor type: exact or not, conversion time, bytes in and out, MB/s; the whole file's
rate and peak memory; what float16 scales would change; float16 against 8-bit for the types
without an exact form; the estimate for an 8B Q4_K_M file.

Dev tool (the figures of issue 52's closing note):

    PYTHONPATH=$PWD python scripts/figures/gguf_kquant_figures.py            # Gemma 3 270M Q4_K_M
    PYTHONPATH=$PWD python scripts/figures/gguf_kquant_figures.py --gguf FILE.gguf --repeat 3

Without --gguf it concatenates the four installed parts of Gemma 3 270M Q4_K_M into a
temporary file. Only the conversion from the mapped blocks to evaluated MLX arrays is timed.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import threading
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType, quants

from macspec.models.gguf import kquants

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from kquantkit import Tensor, gemma_q4_k_m, mapped_tensors  # noqa: E402

LLAMA3_8B_Q4_K_M_GB = {"Q4_K": 3.6, "Q6_K": 1.3}
"""Llama 3 8B Q4_K_M (4.9 GB) by type: llama.cpp puts Q6_K on output.weight and half of the
ffn_down and attn_v tensors, Q4_K elsewhere (the F32 norms are negligible)."""


class AnonymousPeak:
    """The peak of this process's anonymous resident memory (the mapped file's pages are not
    counted), sampled every 5 ms."""

    def __init__(self) -> None:
        self.peak = self.start = self.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def now() -> int:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
        return 0

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.now())

    def __enter__(self) -> AnonymousPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


def convert_all(tensors: list[Tensor]) -> tuple[dict, dict, float]:
    """Every tensor converted once: per type [count, bytes in, bytes out, seconds, CPU seconds
    (all threads: on a busy machine, the work itself)]; the
    converted arrays (kept, so the peak includes the whole converted model)."""
    per_type: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0, 0, 0.0, 0.0])
    converted = {}
    for tensor in tensors:
        began, cpu_began = time.perf_counter(), time.process_time()
        arrays = kquants.convert(tensor.qtype, tensor.data, tensor.shape, name=tensor.name)
        mx.eval(arrays)
        seconds, cpu = time.perf_counter() - began, time.process_time() - cpu_began
        row = per_type[tensor.qtype.name]
        row[0] += 1
        row[1] += tensor.data.nbytes
        row[2] += sum(array.nbytes for array in arrays.values())
        row[3] += seconds
        row[4] += cpu
        converted[tensor.name] = arrays
    return per_type, converted, sum(row[3] for row in per_type.values())


def float16_scales_effect(tensors: list[Tensor]) -> None:
    """What storing the exact K-quants' scales and biases in float16 would change."""
    for qtype in (GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K):
        tensors = [t for t in tensors if t.qtype == qtype]
        if not tensors:
            continue
        changed = total = 0
        worst = 0.0
        for tensor in tensors:
            exact = kquants.convert(qtype, tensor.data, tensor.shape)
            for part in ("scales", "biases"):
                values = np.array(exact[part])
                changed += int(np.sum(values.astype(np.float16).astype(np.float32) != values))
                total += values.size
            reference = quants.dequantize(tensor.data, qtype)
            bits = kquants.affine_bits(qtype)
            halves = {k: v.astype(mx.float16).astype(mx.float32) for k, v in exact.items()}
            rounded = mx.dequantize(
                exact["weight"], halves["scales"], halves["biases"], group_size=32, bits=bits
            )
            error = np.abs(np.array(rounded) - reference).max() / np.abs(reference).max()
            worst = max(worst, float(error))
        print(
            f"{qtype.name} with float16 scales and biases: {changed}/{total} values rounded "
            f"({100 * changed / total:.1f}%), worst weight error {worst:.2e} of the tensor's "
            f"largest |w| (float32: 0, exact)"
        )


def inexact_choice(tensors: list[Tensor]) -> None:
    """Float16 against 8-bit requantization for the types without an exact form."""
    for qtype in sorted({t.qtype for t in tensors}, key=int):
        if kquants.is_exact(qtype):
            continue
        tensors = [t for t in tensors if t.qtype == qtype]
        for label, bits in (("float16", None), ("8-bit g32", 8), ("6-bit g32", 6)):
            worst = rms = 0.0
            size = 0
            for tensor in tensors:
                reference = quants.dequantize(tensor.data, qtype)
                arrays = kquants.convert(qtype, tensor.data, tensor.shape, requantize_bits=bits)
                size += sum(array.nbytes for array in arrays.values())
                if bits is None:
                    got = np.array(arrays["weight"].astype(mx.float32))
                else:
                    weight, scales, biases = arrays["weight"], arrays["scales"], arrays["biases"]
                    got = np.array(mx.dequantize(weight, scales, biases, group_size=32, bits=bits))
                error = got - reference
                worst = max(worst, float(np.abs(error).max() / np.abs(reference).max()))
                rms = max(rms, float(np.sqrt(np.mean(error**2) / np.mean(reference**2))))
            print(
                f"{qtype.name} ({len(tensors)} tensors) as {label}: {size / 1e6:.1f} MB, worst "
                f"error {worst:.1e} of max |w|, relative RMS error {rms:.1e}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, help="a GGUF file (default: Gemma 3 270M Q4_K_M)")
    parser.add_argument("--repeat", type=int, default=3, help="conversions; the fastest counts")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = args.gguf or gemma_q4_k_m(Path(folder))
        tensors = mapped_tensors(path)
        runs = []
        for _ in range(args.repeat):
            with AnonymousPeak() as memory:
                per_type, converted, seconds = convert_all(tensors)
                model_bytes = sum(
                    a.nbytes for arrays in converted.values() for a in arrays.values()
                )
            runs.append((seconds, per_type, memory.peak - memory.start, model_bytes))
            del converted
        seconds, per_type, peak, model_bytes = min(runs, key=lambda run: run[0])
        largest = max(t.data.nbytes for t in tensors)

        print(
            "| type | exact | tensors | GGUF MB | MLX MB | seconds | MB/s | CPU s | MB per CPU s |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for name, (count, size_in, size_out, spent, cpu) in sorted(per_type.items()):
            exact = kquants.is_exact(GGMLQuantizationType[name])
            print(
                f"| {name} | {'yes' if exact else 'no'} | {count} | {size_in / 1e6:.1f} | "
                f"{size_out / 1e6:.1f} | {spent:.2f} | {size_in / 1e6 / max(spent, 1e-9):.0f} | "
                f"{cpu:.2f} | {size_in / 1e6 / max(cpu, 1e-9):.0f} |"
            )
        file_mb = sum(row[1] for row in per_type.values()) / 1e6
        cpu_seconds = sum(row[4] for row in per_type.values())
        print(
            f"whole file: {file_mb:.0f} MB in {seconds:.2f} s = {file_mb / seconds:.0f} MB/s "
            f"(fastest of {args.repeat}; {cpu_seconds:.2f} CPU s = {file_mb / cpu_seconds:.0f} MB "
            f"per CPU s); converted model {model_bytes / 1e6:.0f} MB, "
            f"peak anonymous memory {peak / 1e6:.0f} MB (model + largest tensor "
            f"{(model_bytes + largest) / 1e6:.0f} MB)"
        )
        rates = {name: row[1] / row[4] for name, row in per_type.items() if row[4] > 0}
        if all(name in rates for name in LLAMA3_8B_Q4_K_M_GB):
            estimate = sum(gb * 1e9 / rates[name] for name, gb in LLAMA3_8B_Q4_K_M_GB.items())
            print(
                f"estimate for an 8B Q4_K_M (4.9 GB: {LLAMA3_8B_Q4_K_M_GB} GB by type) at "
                f"these per-type rates (per CPU second): {estimate:.0f} CPU s"
            )
        float16_scales_effect(tensors)
        inexact_choice(tensors)


if __name__ == "__main__":
    main()
